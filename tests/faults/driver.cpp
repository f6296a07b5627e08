#include "faults/driver.h"

#include "http/blockingclient.h"
#include "util/clock.h"

namespace idem::test {

namespace {

qint64 nowMs()
{
    return monotonicUs() / 1000;
}

constexpr qint64 kNoAnswerPauseMs = 300; // before the next attempt after a refused or cut one
constexpr qint64 kDefaultRetryMs = 1000; // a 409 or 5xx without Retry-After

} // namespace

Driver::Driver(Options options, const Ports &ports) : m_options(std::move(options)), m_ports(ports)
{
    for (int k = 0; k < m_options.keys; ++k)
        for (int c = 0; c < m_options.copies; ++c) {
            SenderLog sender;
            sender.key = k;
            sender.copy = c;
            m_senders.push_back(sender);
        }
}

Driver::~Driver()
{
    {
        std::lock_guard lock(m_mutex);
        m_stopping = true;
    }
    m_wake.notify_all();
    for (auto &worker : m_workers)
        worker.join();
}

void Driver::start()
{
    const qint64 start = nowMs();
    {
        std::lock_guard lock(m_mutex);
        for (size_t i = 0; i < m_senders.size(); ++i) // the copies of a key leave together
            m_due.emplace(start + qint64(m_senders[i].key) * m_options.spreadMs / m_options.keys,
                          i);
    }
    for (int w = 0; w < m_options.workers; ++w)
        m_workers.emplace_back([this] { work(); });
}

bool Driver::finished() const
{
    std::lock_guard lock(m_mutex);
    return m_done == int(m_senders.size());
}

QList<SenderLog> Driver::logs() const
{
    std::lock_guard lock(m_mutex);
    return QList<SenderLog>(m_senders.begin(), m_senders.end());
}

void Driver::work()
{
    std::unique_lock lock(m_mutex);
    while (!m_stopping && m_done < int(m_senders.size())) {
        if (m_due.empty()) {
            m_wake.wait_for(lock, std::chrono::milliseconds(100));
            continue;
        }
        const auto next = m_due.begin();
        if (const qint64 wait = next->first - nowMs(); wait > 0) {
            m_wake.wait_for(lock, std::chrono::milliseconds(std::min<qint64>(wait, 100)));
            continue;
        }
        const size_t index = next->second;
        m_due.erase(next);
        lock.unlock();
        const qint64 again = attempt(m_senders[index]);
        lock.lock();
        if (again < 0)
            ++m_done;
        else
            m_due.emplace(again, index);
        m_wake.notify_one();
    }
}

qint64 Driver::attempt(SenderLog &sender)
{
    int number;
    {
        std::lock_guard lock(m_mutex);
        number = int(sender.answers.size());
        if (!number)
            sender.firstMs = nowMs();
    }
    SenderAnswer answer;
    answer.slot = (sender.copy + number) % 2;
    answer.delivery = key(sender.key) + ".c" + QByteArray::number(sender.copy) + ".a" +
                      QByteArray::number(number);
    ++m_attempts;
    ClientResponse response;
    {
        RawConnection connection(m_ports[size_t(answer.slot)].load(), m_options.attemptTimeoutMs);
        if (connection.isOpen()) {
            connection.send(buildPost(
                m_options.path, body(sender.key),
                {{"Idempotency-Key", key(sender.key)}, {"Delivery-Attempt", answer.delivery}}));
            response = connection.readResponse();
        } else {
            response.error = QStringLiteral("cannot connect");
        }
    }
    answer.atMs = nowMs();
    answer.status = response.status;
    answer.outcome = response.header("Idempotency-Outcome");
    answer.body = response.body;
    answer.error = response.error;

    qint64 retryAt = -1;
    SenderLog::Result result = SenderLog::Result::Pending;
    if (response.status >= 200 && response.status < 300) {
        result = SenderLog::Result::Acknowledged;
    } else if (response.status == 409 || response.status >= 500) {
        const qint64 retryAfter = response.header("Retry-After").toLongLong() * 1000;
        retryAt = answer.atMs + (retryAfter > 0 ? retryAfter : kDefaultRetryMs);
    } else if (response.status == 0) {
        retryAt = answer.atMs + kNoAnswerPauseMs;
    } else {
        result = SenderLog::Result::Refused; // a 4xx a sender does not retry
    }
    if (retryAt >= 0 && retryAt - sender.firstMs > m_options.giveUpMs) {
        result = SenderLog::Result::GaveUp;
        retryAt = -1;
    }
    std::lock_guard lock(m_mutex);
    sender.answers.append(answer);
    sender.result = result;
    return retryAt;
}

} // namespace idem::test
