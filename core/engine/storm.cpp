#include "engine/storm.h"

#include "http/blockingclient.h"
#include "providers/provider.h"
#include "util/clock.h"

#include <QRandomGenerator>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

namespace idem {

int StormReport::keysProcessedOnce() const
{
    return int(std::count_if(processorRuns.begin(), processorRuns.end(), [](int n) { return n == 1; }));
}

int StormReport::keysProcessedTwice() const
{
    return int(
        std::count_if(processorRuns.begin(), processorRuns.end(), [](int n) { return n > 1; }));
}

QString StormReport::tally(int status, qint64 count)
{
    return status ? u"%1 ×%2"_qs.arg(status).arg(count) : u"no answer ×%1"_qs.arg(count);
}

QString StormReport::shortOfOnce() const
{
    QStringList why;
    for (auto it = statuses.begin(); it != statuses.end(); ++it)
        if (it.key() == 0 || it.key() >= 500)
            why << tally(it.key(), it.value());
    return u"none processed twice; %1 of %2 never processed%3"_qs.arg(keys - keysProcessedOnce())
        .arg(keys)
        .arg(why.isEmpty() ? QString() : u" (%1)"_qs.arg(why.join(u", "_qs)));
}

StormReport runStorm(const StormPlan &plan, const EndpointConfig &endpoint,
                     const std::function<void(qint64, qint64)> &progress)
{
    const Provider *provider = providerFor(endpoint.provider);
    const QString run = QString::number(QRandomGenerator::global()->generate64() % 0xffffffffffULL, 36);
    const QByteArray path = "/hooks/" + endpoint.name.toUtf8();
    QList<QByteArray> requests; // one per key: every copy is the same bytes
    for (int k = 0; k < plan.keys; ++k) {
        const OutgoingDelivery d = provider->makeDelivery(endpoint, u"storm-%1-%2"_qs.arg(run).arg(k), wallMs() / 1000);
        requests.append(buildPost(path, d.body, d.headers, false));
    }

    StormReport report;
    report.keys = plan.keys;
    const qint64 total = qint64(plan.keys) * plan.copies;
    std::atomic<qint64> next{0};
    std::atomic<qint64> done{0};
    std::mutex mutex;
    std::vector<qint64> latenciesUs;
    latenciesUs.reserve(size_t(total));
    const qint64 startUs = monotonicUs();
    std::vector<std::thread> threads;
    for (int t = 0; t < std::max(1, plan.concurrency); ++t) {
        threads.emplace_back([&] {
            std::unique_ptr<RawConnection> connection;
            StormReport mine;
            std::vector<qint64> myLatencies;
            for (qint64 i; (i = next++) < total;) {
                const QByteArray &request = requests.at(qsizetype(i / plan.copies)); // key-major: copies leave together
                if (!connection || !connection->isOpen())
                    connection = std::make_unique<RawConnection>(plan.port, 30000, plan.host);
                const qint64 t0 = monotonicUs();
                ClientResponse r;
                if (connection->isOpen() && connection->send(request))
                    r = connection->readResponse();
                myLatencies.push_back(monotonicUs() - t0);
                mine.statuses[r.status] += 1;
                if (r.status == 0 || r.header("Connection") == "close")
                    connection.reset();
                if (const auto outcome = outcomeFromString(QString::fromLatin1(r.header("Idempotency-Outcome")))) {
                    mine.outcomes[size_t(*outcome)] += 1;
                    const QString key = QString::fromLatin1(r.header("Idempotency-Key"));
                    const bool ran = *outcome == Outcome::Processed || *outcome == Outcome::Reprocessed
                                     || *outcome == Outcome::Recovered;
                    mine.processorRuns[key] += ran ? 1 : 0;
                }
                const qint64 n = ++done;
                if (progress && (n % 64 == 0 || n == total))
                    progress(n, total);
            }
            std::lock_guard lock(mutex);
            for (auto it = mine.statuses.begin(); it != mine.statuses.end(); ++it)
                report.statuses[it.key()] += it.value();
            for (size_t o = 0; o < mine.outcomes.size(); ++o)
                report.outcomes[o] += mine.outcomes[o];
            for (auto it = mine.processorRuns.begin(); it != mine.processorRuns.end(); ++it)
                report.processorRuns[it.key()] += it.value();
            latenciesUs.insert(latenciesUs.end(), myLatencies.begin(), myLatencies.end());
        });
    }
    for (auto &t : threads)
        t.join();
    report.elapsedMs = (monotonicUs() - startUs) / 1000;
    report.sent = total;
    std::sort(latenciesUs.begin(), latenciesUs.end());
    auto percentile = [&](double p) {
        if (latenciesUs.empty())
            return 0.0;
        return double(latenciesUs[std::min(latenciesUs.size() - 1, size_t(p * double(latenciesUs.size())))]) / 1000.0;
    };
    report.p50Ms = percentile(0.50);
    report.p99Ms = percentile(0.99);
    return report;
}

} // namespace idem
