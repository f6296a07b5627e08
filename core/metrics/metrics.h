#pragma once

#include "config/config.h"
#include "http/httpserver.h"
#include "model/keyrecord.h"
#include "store/storepool.h"

#include <QObject>
#include <QTimer>

#include <array>
#include <atomic>
#include <functional>
#include <map>
#include <memory>

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
} // namespace prometheus

namespace idem {

// The process's Prometheus metrics (prometheus-cpp core). Off unless enable() was called (serve
// and the window with metrics_listen): then instance() is null and the hot path counts nothing
// more than before. Every update is an atomic (a histogram takes prometheus-cpp's own mutex,
// never contended: one receiver thread observes); handles are made before the first delivery,
// so no label lookup happens per delivery. Thread-safe.
class Metrics final
{
public:
    static Metrics *instance();
    // Makes the process's metrics (once; later calls return the same).
    static Metrics &enable();

    // One endpoint's handles ("" for deliveries that matched no endpoint: the path a sender
    // chose never becomes a label; that one has deliveries and latency only, no processor ran).
    struct Endpoint
    {
        std::array<prometheus::Counter *, 8> deliveries{}; // by Outcome
        prometheus::Counter *processorRuns = nullptr;
        prometheus::Counter *processorFailures = nullptr;
        prometheus::Histogram *latency = nullptr; // receive → answer
        prometheus::Histogram *processorLatency = nullptr;
    };
    Endpoint &endpoint(const QString &name);

    void storeCall(bool ok);
    void leaseRecovered();
    void finishRetried();
    // From the periodic count (MetricsServer): keys by endpoint and state, and how long the
    // count took.
    void setKeyCounts(const QString &endpoint, const StateCounts &counts);
    void keysCounted(double seconds);
    // From the periodic ping (MetricsServer): whether the store answered. No series before the
    // first answer (unknown is not down).
    void setStoreUp(bool up);
    void setInFlight(qint64 n);

    // The text exposition format (version 0.0.4).
    QByteArray exposition() const;

private:
    Metrics();
    struct Families;
    std::shared_ptr<prometheus::Registry> m_registry;
    std::unique_ptr<Families> m_families;
    std::mutex m_mutex; // endpoint() only: never on a delivery's path
    std::map<QString, Endpoint> m_endpoints;
    prometheus::Counter *m_storeCalls = nullptr;
    prometheus::Counter *m_storeErrors = nullptr;
    prometheus::Counter *m_leaseRecoveries = nullptr;
    prometheus::Counter *m_finishRetries = nullptr;
    prometheus::Gauge *m_inFlight = nullptr;
    std::atomic<prometheus::Gauge *> m_storeUp = nullptr; // made by the first setStoreUp()
    prometheus::Counter *m_keyCounts = nullptr;
    prometheus::Gauge *m_keyCountSeconds = nullptr;
};

// GET /metrics on a listener of its own (never the webhook port), on the calling thread. The
// store is read on a schedule only, through connections of its own (never the receiver's
// pool: a count over many keys must not queue in front of deliveries): a ping every 5 s for
// idemdesk_store_up, and the keys counted by endpoint and state every 15 s, or, when a count
// took long, no sooner than kCountSpacing times that after it ended. A scrape reads the last
// values; it never makes the store do anything.
class MetricsServer final : public QObject
{
    Q_OBJECT
public:
    static constexpr int kPingIntervalMs = 5'000;
    static constexpr int kCountIntervalMs = 15'000;
    static constexpr int kCountSpacing = 10; // the store spends at most 1/10 of its time counting

    // `store` makes the metrics' own connections (two: a count may run while a ping answers).
    // `inFlight` is read at each scrape (from the engine's own counter).
    // `limits`: the listener's (listenerLimits(); tests shorten its timeouts).
    MetricsServer(Config config, StoreFactory store, std::function<qint64()> inFlight,
                  QObject *parent = nullptr, HttpLimits limits = listenerLimits());
    // At most 64 connections, 4 per client, closed after 5 s idle; no request body.
    static HttpLimits listenerLimits();
    ~MetricsServer() override;
    Result<ListenAddress> start(const ListenAddress &address);
    int connectionCount() const;

private:
    void countKeys();
    void ping();

    Config m_config;
    std::unique_ptr<StorePool> m_pool;
    std::function<qint64()> m_inFlight;
    std::unique_ptr<HttpServer> m_server;
    QTimer m_countTimer; // single shot: the next count is planned when the last one ended
    QTimer m_pingTimer;
    bool m_pinging = false;
};

} // namespace idem
