#pragma once

#include "config/config.h"
#include "model/keyrecord.h"
#include "util/result.h"

#include <QMap>

#include <array>
#include <functional>

namespace idem {

struct StormPlan
{
    int copies = 64;      // identical deliveries per key
    int concurrency = 64; // connections sending at once
    int keys = 1;
    QByteArray host = "127.0.0.1"; // IPv4
    quint16 port = 8787;
};

struct StormReport
{
    int keys = 0;
    qint64 sent = 0;
    std::array<qint64, 8> outcomes{};
    QMap<int, qint64> statuses;     // 0: no answer
    double p50Ms = 0, p99Ms = 0;
    qint64 elapsedMs = 0;
    QMap<QString, int> processorRuns; // stored key → processed + reprocessed + recovered answers
    int keysProcessedOnce() const;
    int keysProcessedTwice() const; // more than once: the guarantee broken
    // "502 ×3", or "no answer ×3" for status 0: one line of `statuses`.
    static QString tally(int status, qint64 count);
    bool exactlyOnce() const { return keysProcessedOnce() == keys && !statuses.value(0); }
    // Not exactly once, but none twice: some keys were never processed (the store refused them,
    // 503, or no answer came), which is the guarantee kept under a fault, not broken.
    QString shortOfOnce() const;
};

// Fires `copies` identical deliveries of each of `keys` new events at a running receiver, as
// `endpoint`'s provider signs them, and counts what came back. Blocks: run it on a worker
// thread (the CLI's main thread, or a thread of the dashboard's, never the GUI thread).
StormReport runStorm(const StormPlan &plan, const EndpointConfig &endpoint,
                     const std::function<void(qint64 done, qint64 total)> &progress = {});

} // namespace idem
