#pragma once

#include "config/config.h"
#include "http/httptypes.h"
#include "metrics/metrics.h"
#include "processing/processor.h"
#include "store/storepool.h"
#include "util/tokenbucket.h"

#include <QDeadlineTimer>
#include <QObject>
#include <QTimer>

#include <array>
#include <atomic>
#include <map>
#include <memory>

namespace idem {

class Provider;

struct RetryOutcome
{
    QString key;
    Outcome outcome = Outcome::Reprocessed;
    bool completed = false; // the processor succeeded and the result is stored
    StoredResult response;
    QString error;
};

struct EngineCounters
{
    std::array<qint64, 8> byOutcome{}; // indexed by Outcome
    qint64 processorRuns = 0;
    qint64 inFlight = 0;
    qint64 finishRetries = 0; // finishes sent again after a store error
};

// The path of one delivery (docs/http.md): route, verify, key, claim, process, finish, answer, log.
// Lives on the receiver thread; handle() never blocks: store calls go to the StorePool and
// processors are asynchronous. Counters are readable from any thread.
class IdempotencyEngine final : public QObject
{
    Q_OBJECT
public:
    IdempotencyEngine(Config config, std::shared_ptr<StorePool> pool, QString instance,
                      QObject *parent = nullptr);
    ~IdempotencyEngine() override;

    void handle(HttpRequest request, Responder responder);
    // A request the HTTP layer refused itself (413, 431, 400, ...): counted and logged as rejected.
    void recordRejection(const HttpRequest &partial, int status, const QString &detail);
    EngineCounters counters() const;
    qint64 inFlight() const { return m_inFlight.load(); }
    const Config &config() const { return m_config; }
    // Operator "retry now": runs the stored request of `key` through its endpoint's processor
    // again (a reset and a claim under a new token), records and returns the result. Failed and
    // reset keys only, unless `force` (completed, or processing under someone else's lease).
    void retryKey(const QString &key, bool force, std::function<void(Result<RetryOutcome>)> done);
    // Sends the next part of the buffered delivery log to the store (its timer's, and when a
    // part is full).
    void flushLog();
    // When stopping: every delivery not yet written, written now a part at a time, waiting for
    // each (the part in flight too); what the store then refuses is said lost, not waited for.
    void drainLog();

Q_SIGNALS:
    // Every delivery, one by one as it is answered (count 1), the rejections past the log's
    // budget too: their summaries go to the log only.
    void delivered(const idem::DeliveryEvent &event);

private:
    struct Delivery;
    using DeliveryPtr = std::shared_ptr<Delivery>;
    void onClaimed(const DeliveryPtr &d, Result<ClaimResult> result);
    void runProcessor(const DeliveryPtr &d, qint64 token, Outcome outcome);
    void onProcessed(const DeliveryPtr &d, qint64 token, Outcome outcome, ProcessResult result);
    void respond(const DeliveryPtr &d, HttpResponse response, Outcome outcome, qint64 token = 0,
                 const QString &detail = {});
    QList<DeliveryEvent> takeLogPart();
    void writeLog(QList<DeliveryEvent> part);
    void trimLog();
    void appendToLog(const DeliveryEvent &event);
    bool keepPayload();
    // Rejected deliveries to one endpoint are logged one by one within a budget; past it they
    // are counted per status, and summariseRejections() writes one entry with their count per
    // status and interval: a flood of one kind (cheap 405s) hides no other (a real sender's 401s).
    struct Unlogged
    {
        qint64 count = 0;    // rejected deliveries not logged one by one, since sinceMs
        qint64 sinceMs = 0;  // monotonic: when the first of them came
        qint64 firstAtMs = 0; // the first one's time (the summary says the span)
        DeliveryEvent last;   // the last of them (its reason is the summary's)
    };
    struct RejectionBudget
    {
        TokenBucket logged;
        std::map<int, Unlogged> byStatus; // the few a rejection can have (400, 401, 405, 413 …)
    };
    bool logRejection(const EndpointConfig &endpoint, const DeliveryEvent &event);
    // Writes a summary for each endpoint and status whose interval is over (all: each pending).
    void summariseRejections(bool all);
    // `payload`: what the log keeps of the delivery (a mismatch's body); empty: the delivery's.
    void record(const DeliveryPtr &d, const QString &key, Outcome outcome, int status, qint64 token,
                const QString &detail, const QByteArray &payload = {});
    // A batch delivery's events (SendGrid, SPEC §4) as they are claimed: one claim per key; the
    // events that repeat an earlier one of the batch byte for byte (canonical JSON) are the same
    // event, run once; those that give an earlier one's key to another body are mismatches,
    // never run, and the batch is then never answered 2xx.
    struct Batch
    {
        QList<ClaimRequest> claims;
        QByteArrayList bodies;    // each claim's event, as sent
        qsizetype events = 0;     // in the delivery, repeats and mismatches included
        qsizetype repeats = 0;
        QList<QPair<QString, QByteArray>> conflicts; // key, and the event's bytes
    };
    using BatchPtr = std::shared_ptr<const Batch>;
    void handleBatch(const DeliveryPtr &d, const Provider *provider);
    void finishBatch(const DeliveryPtr &d, const BatchPtr &batch, const QList<ClaimResult> &results,
                     const ProcessResult &processed, const QList<FinishVerdict> &verdicts);
    void reject(const DeliveryPtr &d, int status, const QString &title, const QString &detail);
    // /healthz and /readyz: the answer, and why not in the log.
    void sendProbe(const DeliveryPtr &d, const HttpResponse &response);
    void logNotReady(const QString &probe, const QString &why);
    // The processor's job for a claimed delivery, with its deadline counted from the claim.
    ProcessJob job(const DeliveryPtr &d, const QString &key, const QByteArray &tokens,
                   const HeaderList &headers, const QByteArray &body) const;
    qint64 leaseEndUs(const DeliveryPtr &d) const;
    // Runs the job on the delivery's endpoint's processor, unless its deadline already passed.
    void run(const DeliveryPtr &d, const ProcessJob &job, Processor::Done done); // monotonic; the lease began after claimSentUs
    // Starts the endpoint's processor: counted, and timed when metrics are on.
    void startProcessor(const EndpointConfig &endpoint, const ProcessJob &job,
                        Processor::Done done);
    // The answer goes out: sent, no longer in flight, its latency observed.
    void send(const DeliveryPtr &d, const HttpResponse &response);
    Metrics::Endpoint *metricsFor(const EndpointConfig *endpoint) const;
    template<typename T>
    void untilStored(std::function<void(std::function<void(Result<T>)>)> call, qint64 leaseEndUs,
                     std::function<void(Result<T>)> done, int attempt = 0);
    void purge();
    StoreLane &lane();

    Config m_config;
    std::shared_ptr<StorePool> m_pool;
    std::unique_ptr<StoreLane> m_lane; // claim and finish of single deliveries
    QString m_instance;
    // Each endpoint's Via entry: a delivery to an endpoint carrying its own came back to it (a
    // loop). Per endpoint, not per receiver: a → b → the app through one desk is no loop.
    QHash<QString, QByteArray> m_via;
    std::map<QString, Processor *> m_processors; // children of this object
    std::array<std::atomic<qint64>, 8> m_outcomes{};
    std::atomic<qint64> m_processorRuns{0};
    std::atomic<qint64> m_inFlight{0};
    std::atomic<qint64> m_finishRetries{0};
    // Metrics::instance() when the engine was made (null: metrics off); one entry per endpoint
    // in the config's order, and the last for deliveries that matched none.
    Metrics *m_metrics = nullptr;
    std::vector<Metrics::Endpoint *> m_endpointMetrics;
    QList<DeliveryEvent> m_logBuffer;
    qint64 m_logBytes = 0;    // what m_logBuffer holds, about (logFootprint)
    QString m_notReadyLogged; // the last "not ready" reason written to the log
    bool m_logInFlight = false;
    QList<DeliveryEvent> m_logWriting; // the part in flight, and its outcome (0 pending, 1
    std::shared_ptr<std::atomic<int>> m_logWritten; // written, 2 refused), seen by drainLog
    bool m_logFailing = false;
    bool m_logDropping = false; // dropping the oldest since the last write that went through
    QDeadlineTimer m_logRetry;  // after a failed write: when to try again
    std::vector<RejectionBudget> m_rejections; // one per endpoint, in the config's order
    TokenBucket m_payloads{0, 0, 0};           // mismatch bodies the log may keep (keepPayload)
    QTimer m_logTimer;
    QTimer m_purgeTimer;
};

} // namespace idem

Q_DECLARE_METATYPE(idem::DeliveryEvent)
