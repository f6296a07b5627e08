#pragma once

#include <QByteArray>
#include <QList>
#include <QString>

#include <array>
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace idem::test {

// One answer a sender got (or did not get: status 0, `error` says why).
struct SenderAnswer
{
    qint64 atMs = 0;     // monotonicUs() / 1000 when the answer came
    QByteArray delivery; // this attempt's Delivery-Attempt header, e.g. "k17.c2.a3"
    int slot = 0;        // the desk it went to (0: a, 1: b)
    int status = 0;
    QByteArray outcome; // Idempotency-Outcome
    QByteArray body;
    QString error;
};

// One copy of one event, as its sender sent it until it got a final answer or gave up.
struct SenderLog
{
    enum class Result { Pending, Acknowledged, Refused, GaveUp };
    int key = 0;
    int copy = 0;
    Result result = Result::Pending;
    qint64 firstMs = 0; // its first attempt
    QList<SenderAnswer> answers;
    const SenderAnswer &last() const { return answers.last(); }
};

// The senders of the fault suite. Each of `keys` events is delivered `copies` times at once
// (released one key after the other over `spreadMs`), every copy by its own sender that retries
// as webhook senders do: on 409, 5xx and no answer (refused, reset, `attemptTimeoutMs` without
// one) it sends again after Retry-After (or a moment), alternating between the two desks, until
// it gets a 2xx, another 4xx, or `giveUpMs` have passed since its first attempt. Attempts run on
// a pool of `workers` threads with blocking connections; a sender waiting to retry holds none.
class Driver
{
public:
    struct Options
    {
        QByteArray path; // /hooks/<endpoint>
        int keys = 150;
        int copies = 3;
        int workers = 48;
        int spreadMs = 20'000;
        int attemptTimeoutMs = 6'000;
        int giveUpMs = 40'000;
    };
    // The desks' ports, by slot; the test changes one when it restarts that desk elsewhere.
    using Ports = std::array<std::atomic<quint16>, 2>;

    Driver(Options options, const Ports &ports);
    ~Driver();
    Driver(const Driver &) = delete;
    Driver &operator=(const Driver &) = delete;

    void start();
    bool finished() const;
    QList<SenderLog> logs() const;
    int attempts() const { return m_attempts.load(); }

    static QByteArray key(int index) { return "k" + QByteArray::number(index); }
    static QByteArray body(int index)
    {
        return "{\"order\":" + QByteArray::number(index) + ",\"suite\":\"faults\"}";
    }

private:
    void work();
    // One attempt of a sender; the time of its next attempt, or -1 when it is done.
    qint64 attempt(SenderLog &sender);

    const Options m_options;
    const Ports &m_ports;
    std::vector<SenderLog> m_senders;
    std::multimap<qint64, size_t> m_due; // next attempt time → sender
    int m_done = 0;
    bool m_stopping = false;
    std::atomic<int> m_attempts{0};
    mutable std::mutex m_mutex;
    std::condition_variable m_wake;
    std::vector<std::thread> m_workers;
};

} // namespace idem::test
