#pragma once

#include "config/config.h"
#include "model/keyrecord.h"
#include "store/storepool.h"

#include <QObject>
#include <QTimer>

#include <array>
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

class HttpServer;

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
    // chose never becomes a label).
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
    // From the periodic count (MetricsServer): keys by endpoint and state; whether the store
    // answered.
    void setKeyCounts(const QString &endpoint, const StateCounts &counts);
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
    prometheus::Gauge *m_storeUp = nullptr;
};

// GET /metrics on a listener of its own (never the webhook port), on the calling thread; and
// the keys counted by endpoint and state in the store (off the calling thread) every 15 s and
// after each scrape, so that a scrape shows the count of at most one interval before.
class MetricsServer final : public QObject
{
    Q_OBJECT
public:
    // `inFlight` is read at each scrape (from the engine's own counter).
    MetricsServer(Config config, std::shared_ptr<StorePool> pool, std::function<qint64()> inFlight,
                  QObject *parent = nullptr);
    ~MetricsServer() override;
    Result<ListenAddress> start(const ListenAddress &address);
    void countKeys();

private:
    Config m_config;
    std::shared_ptr<StorePool> m_pool;
    std::function<qint64()> m_inFlight;
    std::unique_ptr<HttpServer> m_server;
    QTimer m_countTimer;
    bool m_counting = false;
};

} // namespace idem
