#include "engine/stats.h"

#include "providers/provider.h"
#include "util/format.h"

#include <QElapsedTimer>
#include <QJsonArray>

#include <algorithm>

namespace idem {

namespace {
constexpr int kLogScanLimit = 200000;

qint64 at(const std::array<qint64, 8> &outcomes, Outcome o)
{
    return outcomes[size_t(o)];
}

QJsonObject outcomesJson(const std::array<qint64, 8> &outcomes)
{
    QJsonObject o;
    for (size_t i = 0; i < outcomes.size(); ++i)
        o.insert(toString(Outcome(i)), outcomes[i]);
    return o;
}

QJsonObject countsJson(const StateCounts &c)
{
    return {{u"processing"_qs, c.processing}, {u"completed"_qs, c.completed}, {u"failed"_qs, c.failed},
            {u"reset"_qs, c.reset}, {u"total"_qs, c.total()}};
}
} // namespace

qint64 EndpointStats::deliveries() const
{
    qint64 n = 0;
    for (qint64 v : outcomes)
        n += v;
    return n;
}

qint64 EndpointStats::processorRuns() const
{
    return at(outcomes, Outcome::Processed) + at(outcomes, Outcome::Reprocessed) + at(outcomes, Outcome::Recovered);
}

qint64 EndpointStats::duplicates() const
{
    return at(outcomes, Outcome::Replayed) + at(outcomes, Outcome::InProgress);
}

double EndpointStats::duplicateRatio() const
{
    const qint64 claimed = processorRuns() + duplicates() + at(outcomes, Outcome::Mismatch);
    return claimed ? double(duplicates()) / double(claimed) : 0.0;
}

bool verifiesSignatures(const EndpointConfig &endpoint)
{
    return !endpoint.secrets.isEmpty() || !endpoint.publicKeys.isEmpty();
}

QStringList configWarnings(const Config &config)
{
    QStringList warnings = config.loadWarnings;
    for (const EndpointConfig &e : config.endpoints) {
        if (!verifiesSignatures(e))
            warnings << u"%1: no secret, so signatures are not verified"_qs.arg(e.name);
        const Provider *provider = providerFor(e.provider);
        const qint64 window = provider ? provider->retryWindowSeconds() : 0;
        if (window > e.settings.ttlSeconds)
            warnings << u"%1: ttl_seconds %2 is shorter than %3's retry window (%4): a late retry would be processed again"_qs
                            .arg(e.name)
                            .arg(e.settings.ttlSeconds)
                            .arg(e.provider, formatDuration(window * 1000));
        if (e.settings.inProgressStatus / 100 == 2)
            warnings
                << u"%1: in_progress_status %2 is a 2xx: a sender takes \"in progress\" for "
                   u"delivered and stops retrying, so a key whose run left no outcome waits for an "
                   u"operator"_qs
                       .arg(e.name)
                       .arg(e.settings.inProgressStatus);
    }
    return warnings;
}

Result<qint64> countStuckKeys(IdempotencyStore &store, const QString &endpoint, int limit)
{
    auto now = store.clockMs();
    if (!now)
        return now.error();
    // Page by page: the processing keys come newest update first, and the stuck ones are the
    // oldest (the first thousand alone missed them behind the keys in flight).
    KeyQuery processing;
    processing.state = KeyState::Processing;
    processing.endpoint = endpoint;
    processing.limit = 1000;
    qint64 stuck = 0;
    for (; processing.offset < limit; processing.offset += processing.limit) {
        auto keys = store.listKeys(processing);
        if (!keys)
            return keys.error();
        stuck += std::count_if(keys->cbegin(), keys->cend(),
                               [&](const KeyRecord &k) { return k.leaseUntilMs <= *now; });
        if (keys->size() < processing.limit)
            break;
    }
    return stuck;
}

Result<StatsReport> collectStats(IdempotencyStore &store, const Config &config, qint64 sinceMs)
{
    StatsReport report;
    QElapsedTimer timer;
    timer.start();
    if (auto ping = store.ping(); !ping)
        return ping.error();
    report.pingMs = double(timer.nsecsElapsed()) / 1e6;
    auto counts = store.countKeys({});
    if (!counts)
        return counts.error();
    report.keys = *counts;
    auto stuck = countStuckKeys(store);
    if (!stuck)
        return stuck.error();
    report.stuck = *stuck;

    DeliveryQuery query;
    query.sinceMs = sinceMs;
    query.limit = kLogScanLimit;
    auto log = store.deliveries(query);
    if (!log)
        return log.error();
    report.logTruncated = log->size() >= kLogScanLimit;
    QMap<QString, EndpointStats> byEndpoint;
    for (const EndpointConfig &e : config.endpoints)
        byEndpoint[e.name].name = e.name;
    for (const DeliveryEvent &event : *log) { // a summary of rejections counts all of them
        report.outcomes[size_t(event.outcome)] += event.count;
        if (event.endpoint.isEmpty())
            continue;
        EndpointStats &s = byEndpoint[event.endpoint];
        s.name = event.endpoint;
        s.outcomes[size_t(event.outcome)] += event.count;
    }
    for (auto it = byEndpoint.begin(); it != byEndpoint.end(); ++it) {
        auto endpointCounts = store.countKeys(it.key());
        if (!endpointCounts)
            return endpointCounts.error();
        it->keys = *endpointCounts;
        report.endpoints.append(*it);
    }
    report.warnings = configWarnings(config);
    if (report.stuck)
        report.warnings
            << u"%1 in processing past the lease: no run is going (a worker stopped, or the "
               u"app's answer never came); the next delivery of each runs it again, or "
               u"`idemdesk keys retry KEY --force`"_qs.arg(countOf(report.stuck, u"key", u"keys"));
    auto durability = store.durabilityWarnings();
    if (!durability)
        return durability.error();
    report.warnings += *durability;
    return report;
}

QJsonObject statsToJson(const StatsReport &r)
{
    QJsonArray endpoints;
    for (const EndpointStats &e : r.endpoints)
        endpoints.append(QJsonObject{{u"name"_qs, e.name},
                                     {u"keys"_qs, countsJson(e.keys)},
                                     {u"deliveries"_qs, e.deliveries()},
                                     {u"processor_runs"_qs, e.processorRuns()},
                                     {u"duplicates"_qs, e.duplicates()},
                                     {u"duplicate_ratio"_qs, e.duplicateRatio()},
                                     {u"outcomes"_qs, outcomesJson(e.outcomes)}});
    QJsonObject keys = countsJson(r.keys);
    keys.insert(u"stuck"_qs, r.stuck); // of processing: past the lease
    return {{u"store"_qs,
             QJsonObject{{u"url"_qs, r.store}, {u"healthy"_qs, true}, {u"ping_ms"_qs, r.pingMs}}},
            {u"keys"_qs, keys},
            {u"outcomes"_qs, outcomesJson(r.outcomes)},
            {u"endpoints"_qs, endpoints},
            {u"warnings"_qs, QJsonArray::fromStringList(r.warnings)},
            {u"log_truncated"_qs, r.logTruncated}};
}

QString formatStats(const StatsReport &r, qint64 sinceSeconds)
{
    QString out;
    out += u"store        %1  healthy (ping %2 ms)\n"_qs.arg(r.store).arg(r.pingMs, 0, 'f', 2);
    out += u"keys         processing %1 · completed %2 · failed %3 · reset %4 · total %5\n"_qs
               .arg(r.stuck ? u"%1 (%2 past the lease)"_qs.arg(r.keys.processing).arg(r.stuck)
                            : QString::number(r.keys.processing))
               .arg(r.keys.completed)
               .arg(r.keys.failed)
               .arg(r.keys.reset)
               .arg(r.keys.total());
    QStringList outcomes;
    qint64 total = 0;
    for (size_t i = 0; i < r.outcomes.size(); ++i) {
        outcomes << u"%1 %2"_qs.arg(toString(Outcome(i))).arg(r.outcomes[i]);
        total += r.outcomes[i];
    }
    out += u"deliveries   %1 in the last %2%3\n             %4\n"_qs.arg(total)
               .arg(formatDuration(sinceSeconds * 1000))
               .arg(r.logTruncated ? u" (log scan capped)"_qs : QString())
               .arg(outcomes.join(u" · "_qs));
    out += u"\n%1%2%3%4%5%6\n"_qs.arg(u"ENDPOINT"_qs.leftJustified(16), u"DELIVERIES"_qs.leftJustified(12),
                                      u"PROCESSED"_qs.leftJustified(11), u"DUPLICATES"_qs.leftJustified(12),
                                      u"DUP RATIO"_qs.leftJustified(11), u"FAILED KEYS"_qs);
    for (const EndpointStats &e : r.endpoints)
        out += u"%1%2%3%4%5%6\n"_qs.arg(e.name.leftJustified(16), QString::number(e.deliveries()).leftJustified(12),
                                        QString::number(e.processorRuns()).leftJustified(11),
                                        QString::number(e.duplicates()).leftJustified(12),
                                        u"%1%"_qs.arg(e.duplicateRatio() * 100, 0, 'f', 1).leftJustified(11),
                                        QString::number(e.keys.failed));
    if (!r.warnings.isEmpty()) {
        out += u"\nwarnings\n"_qs;
        for (const QString &w : r.warnings)
            out += u"  "_qs + w + u'\n';
    }
    return out;
}

} // namespace idem
