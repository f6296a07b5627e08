#include "metrics/metrics.h"

#include "http/httpserver.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <QElapsedTimer>

#include <algorithm>
#include <atomic>

namespace idem {

namespace {

std::atomic<Metrics *> g_metrics{nullptr};

// Seconds: a replay answers in a millisecond, a forward may take the whole forward timeout.
const prometheus::Histogram::BucketBoundaries kLatencyBuckets = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};

} // namespace

struct Metrics::Families
{
    prometheus::Family<prometheus::Counter> &deliveries;
    prometheus::Family<prometheus::Counter> &processorRuns;
    prometheus::Family<prometheus::Counter> &processorFailures;
    prometheus::Family<prometheus::Histogram> &latency;
    prometheus::Family<prometheus::Histogram> &processorLatency;
    prometheus::Family<prometheus::Gauge> &keys;
};

Metrics *Metrics::instance()
{
    return g_metrics.load(std::memory_order_acquire);
}

Metrics &Metrics::enable()
{
    static std::mutex mutex;
    std::lock_guard lock(mutex);
    if (Metrics *m = instance())
        return *m;
    auto *m = new Metrics; // lives as long as the process: handles to it are kept everywhere
    g_metrics.store(m, std::memory_order_release);
    return *m;
}

Metrics::Metrics() : m_registry(std::make_shared<prometheus::Registry>())
{
    using namespace prometheus;
    Registry &r = *m_registry;
    m_families.reset(new Families{
        BuildCounter()
            .Name("idemdesk_deliveries_total")
            .Help("Deliveries answered, by endpoint and outcome (a batch counts once per event)")
            .Register(r),
        BuildCounter()
            .Name("idemdesk_processor_runs_total")
            .Help("Processor runs started, by endpoint")
            .Register(r),
        BuildCounter()
            .Name("idemdesk_processor_failures_total")
            .Help("Processor runs that failed (the key is recorded failed), by endpoint")
            .Register(r),
        BuildHistogram()
            .Name("idemdesk_delivery_duration_seconds")
            .Help("From a delivery's first byte to its answer, by endpoint")
            .Register(r),
        BuildHistogram()
            .Name("idemdesk_processor_duration_seconds")
            .Help("A processor run (forward or built-in), by endpoint")
            .Register(r),
        BuildGauge()
            .Name("idemdesk_keys")
            .Help("Keys in the store by endpoint and state, from the periodic count")
            .Register(r),
    });
    m_storeCalls = &BuildCounter()
                        .Name("idemdesk_store_round_trips_total")
                        .Help("Calls to the store (claims, finishes, reads, log writes)")
                        .Register(r)
                        .Add({});
    m_storeErrors =
        &BuildCounter()
             .Name("idemdesk_store_errors_total")
             .Help("Store calls that failed to reach the store or whose outcome is unknown")
             .Register(r)
             .Add({});
    m_leaseRecoveries = &BuildCounter()
                             .Name("idemdesk_lease_recoveries_total")
                             .Help("Keys taken over after their lease ended without a result")
                             .Register(r)
                             .Add({});
    m_finishRetries = &BuildCounter()
                           .Name("idemdesk_finish_retries_total")
                           .Help("Results sent to the store again after a store error")
                           .Register(r)
                           .Add({});
    m_inFlight = &BuildGauge()
                      .Name("idemdesk_in_flight")
                      .Help("Deliveries being handled now")
                      .Register(r)
                      .Add({});
    m_keyCounts = &BuildCounter()
                       .Name("idemdesk_key_counts_total")
                       .Help("Counts of the keys by endpoint and state made (on a schedule)")
                       .Register(r)
                       .Add({});
    m_keyCountSeconds = &BuildGauge()
                             .Name("idemdesk_key_count_duration_seconds")
                             .Help("How long the last count of the keys took")
                             .Register(r)
                             .Add({});
}

Metrics::Endpoint &Metrics::endpoint(const QString &name)
{
    std::lock_guard lock(m_mutex);
    auto it = m_endpoints.find(name);
    if (it != m_endpoints.end())
        return it->second;
    const std::string label = name.toStdString();
    Endpoint e;
    for (size_t o = 0; o < e.deliveries.size(); ++o)
        e.deliveries[o] = &m_families->deliveries.Add(
            {{"endpoint", label}, {"outcome", toString(Outcome(o)).toStdString()}});
    e.latency = &m_families->latency.Add({{"endpoint", label}}, kLatencyBuckets);
    if (!name.isEmpty()) { // no processor runs for a delivery that matched no endpoint
        e.processorRuns = &m_families->processorRuns.Add({{"endpoint", label}});
        e.processorFailures = &m_families->processorFailures.Add({{"endpoint", label}});
        e.processorLatency =
            &m_families->processorLatency.Add({{"endpoint", label}}, kLatencyBuckets);
    }
    return m_endpoints.emplace(name, e).first->second;
}

void Metrics::storeCall(bool ok)
{
    m_storeCalls->Increment();
    if (!ok)
        m_storeErrors->Increment();
}

void Metrics::leaseRecovered()
{
    m_leaseRecoveries->Increment();
}

void Metrics::finishRetried()
{
    m_finishRetries->Increment();
}

void Metrics::setKeyCounts(const QString &endpoint, const StateCounts &counts)
{
    const std::string label = endpoint.toStdString();
    const std::pair<const char *, qint64> states[] = {{"processing", counts.processing},
                                                      {"completed", counts.completed},
                                                      {"failed", counts.failed},
                                                      {"reset", counts.reset}};
    for (const auto &[state, n] : states)
        m_families->keys.Add({{"endpoint", label}, {"state", state}}).Set(double(n));
}

void Metrics::keysCounted(double seconds)
{
    m_keyCounts->Increment();
    m_keyCountSeconds->Set(seconds);
}

void Metrics::setStoreUp(bool up)
{
    prometheus::Gauge *gauge = m_storeUp.load(std::memory_order_acquire);
    if (!gauge) {
        std::lock_guard lock(m_mutex);
        if (!(gauge = m_storeUp.load(std::memory_order_relaxed))) {
            gauge = &prometheus::BuildGauge()
                         .Name("idemdesk_store_up")
                         .Help("1 when the store answered the last ping, 0 when it did not "
                               "(absent until the first answer)")
                         .Register(*m_registry)
                         .Add({});
            m_storeUp.store(gauge, std::memory_order_release);
        }
    }
    gauge->Set(up ? 1 : 0);
}

void Metrics::setInFlight(qint64 n)
{
    m_inFlight->Set(double(n));
}

QByteArray Metrics::exposition() const
{
    const std::string text = prometheus::TextSerializer().Serialize(m_registry->Collect());
    return QByteArray(text.data(), qsizetype(text.size()));
}

HttpLimits MetricsServer::listenerLimits()
{
    HttpLimits limits;
    limits.maxConnections = 64;
    // A scraper uses one connection, and comes back every 10 s or more: a connection idle for
    // 5 s is not a scraper's next scrape, and a client (an address, an IPv6 /64) holding 4 is
    // not a scraper. So idle connections cannot keep scrapes out.
    limits.maxConnectionsPerClient = 4;
    limits.idleTimeoutMs = 5'000;
    limits.requestTimeoutMs = 5'000;
    limits.defaultMaxBody = 0;
    limits.maxBufferedBytes = limits.maxBufferedBytesPerClient = 64 * 1024;
    return limits;
}

MetricsServer::MetricsServer(Config config, StoreFactory store, std::function<qint64()> inFlight,
                             QObject *parent, HttpLimits limits)
    : QObject(parent), m_config(std::move(config)),
      m_pool(std::make_unique<StorePool>(std::move(store), 2, 16)), m_inFlight(std::move(inFlight))
{
    Metrics &metrics = Metrics::enable();
    for (const EndpointConfig &e : m_config.endpoints)
        metrics.endpoint(e.name); // every endpoint shows, with zeros, before its first delivery
    m_server =
        std::make_unique<HttpServer>(limits, [this](HttpRequest request, Responder responder) {
            if (request.path != "/metrics") {
                responder.send(
                    HttpResponse::problem(404, u"Not Found"_qs, u"metrics are at /metrics"_qs));
                return;
            }
            if (request.method != "GET" && request.method != "HEAD") {
                HttpResponse r =
                    HttpResponse::problem(405, u"Method Not Allowed"_qs, u"GET /metrics"_qs);
                r.setHeader("Allow", "GET, HEAD");
                responder.send(r);
                return;
            }
            // The last count and ping: a scrape never asks the store anything.
            Metrics &m = *Metrics::instance();
            if (m_inFlight)
                m.setInFlight(m_inFlight());
            HttpResponse r;
            r.setHeader("Content-Type", "text/plain; version=0.0.4; charset=utf-8");
            r.body = m.exposition(); // HEAD too: the server sends its headers only
            responder.send(r);
        });
    m_countTimer.setSingleShot(true);
    connect(&m_countTimer, &QTimer::timeout, this, &MetricsServer::countKeys);
    m_pingTimer.setInterval(kPingIntervalMs);
    connect(&m_pingTimer, &QTimer::timeout, this, &MetricsServer::ping);
}

MetricsServer::~MetricsServer() = default;

int MetricsServer::connectionCount() const
{
    return m_server->connectionCount();
}

Result<ListenAddress> MetricsServer::start(const ListenAddress &address)
{
    if (!m_server->listen(address.host, address.port))
        return makeError(ErrorCode::Unavailable, u"cannot listen for metrics on %1: %2"_qs.arg(
                                                     address.toString(), m_server->errorString()));
    ListenAddress bound = address;
    bound.port = m_server->port();
    m_pingTimer.start();
    ping();
    countKeys();
    return bound;
}

void MetricsServer::ping()
{
    if (m_pinging) { // the last ping has not answered in kPingIntervalMs: the store is not there
        Metrics::instance()->setStoreUp(false);
        return;
    }
    m_pinging = true;
    m_pool->submit<Ok>(
        this,
        [](IdempotencyStore &store) -> Result<Ok> {
            if (auto ping = store.ping(); !ping)
                return ping.error();
            return Ok{};
        },
        [this](Result<Ok> answered) {
            m_pinging = false;
            Metrics::instance()->setStoreUp(answered.ok());
        });
}

void MetricsServer::countKeys()
{
    QStringList endpoints;
    for (const EndpointConfig &e : m_config.endpoints)
        endpoints << e.name;
    auto started = std::make_shared<QElapsedTimer>();
    started->start();
    m_pool->submit<QList<StateCounts>>(
        this,
        [endpoints](IdempotencyStore &store) -> Result<QList<StateCounts>> {
            QList<StateCounts> counts;
            for (const QString &e : endpoints) {
                auto c = store.countKeys(e);
                if (!c)
                    return c.error();
                counts << *c;
            }
            return counts;
        },
        [this, endpoints, started](Result<QList<StateCounts>> counts) {
            const qint64 tookMs = started->elapsed();
            Metrics &m = *Metrics::instance();
            if (counts) {
                for (qsizetype i = 0; i < endpoints.size(); ++i)
                    m.setKeyCounts(endpoints.at(i), counts->at(i));
                m.keysCounted(double(tookMs) / 1000.0);
            }
            // However slow the store, counting takes at most 1/kCountSpacing of its time.
            m_countTimer.start(int(
                std::clamp<qint64>(tookMs * kCountSpacing, kCountIntervalMs, 24 * 3600 * 1000)));
        });
}

} // namespace idem
