#pragma once

#include "config/config.h"
#include "store/idempotencystore.h"

#include <QJsonObject>
#include <QMap>

namespace idem {

struct EndpointStats
{
    QString name;
    StateCounts keys;
    std::array<qint64, 8> outcomes{}; // by Outcome
    qint64 deliveries() const;
    qint64 processorRuns() const; // processed + reprocessed + recovered
    qint64 duplicates() const;    // replayed + in-progress
    double duplicateRatio() const; // duplicates / deliveries that reached the claim
};

struct StatsReport
{
    QString store;
    double pingMs = 0;
    StateCounts keys;
    qint64 stuck = 0; // of keys.processing: past their lease (countStuckKeys)
    std::array<qint64, 8> outcomes{};
    QList<EndpointStats> endpoints;
    QStringList warnings;
    bool logTruncated = false;
};

// What `stats` and the status bar show: counts by state, outcomes and duplicate ratios of the
// delivery log since `sinceMs`, and warnings about the config and the store's durability.
Result<StatsReport> collectStats(IdempotencyStore &store, const Config &config, qint64 sinceMs);
// Keys in `processing` whose lease has ended, on the store's clock: nothing runs them (the
// worker died, or the app's outcome is unknown) until the next delivery of each, or an operator's
// `keys retry --force`. Counted among the first `limit` processing keys of `endpoint` (empty:
// all), read a thousand at a time.
Result<qint64> countStuckKeys(IdempotencyStore &store, const QString &endpoint = {},
                              int limit = 20'000);
// Config warnings: signatures not verified, TTL shorter than the provider's retry window.
QStringList configWarnings(const Config &config);
// Whether a delivery to this endpoint must carry a valid signature: a secret, or (SendGrid)
// a public key, is configured.
bool verifiesSignatures(const EndpointConfig &endpoint);
QJsonObject statsToJson(const StatsReport &report);
QString formatStats(const StatsReport &report, qint64 sinceSeconds);

} // namespace idem
