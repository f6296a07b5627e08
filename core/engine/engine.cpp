#include "engine/engine.h"

#include "providers/provider.h"
#include "util/crypto.h"
#include "util/format.h"

#include "util/clock.h"
#include <QDateTime>
#include <QJsonArray>
#include <QJsonDocument>

#include <QLoggingCategory>

#include <prometheus/counter.h>
#include <prometheus/histogram.h>

#include <chrono>
#include <cmath>
#include <thread>

namespace idem {

Q_LOGGING_CATEGORY(lcEngine, "idem.engine")

namespace {

qint64 nowMs()
{
    return wallMs();
}

HttpResponse fromStored(const StoredResult &stored)
{
    HttpResponse r;
    r.status = stored.status;
    r.headers = stored.headers;
    r.body = stored.body;
    return r;
}

constexpr int kLogBatch = 512;
constexpr qint64 kMinimumRunMs = 100; // less time left than this: the processor is not started

// The store could not claim: nothing was processed, the sender should come back. Why (the
// store's error: its kind, host and port) goes to the delivery log only, never to the sender.
HttpResponse storeUnavailable(const QString & /*why*/)
{
    HttpResponse r = HttpResponse::problem(
        503, u"Store unavailable"_qs,
        u"the idempotency store could not be reached, so nothing was processed; retry later"_qs);
    r.setHeader("Retry-After", "5");
    return r;
}

// Processed, but the result could not be recorded: the key is recovered after its lease.
// A 504, not a 503: a 503 promises that nothing ran (docs/http.md), and this event did; the sender
// hears it as it hears a run cut at its deadline: the app may have acted, send it again.
HttpResponse resultNotRecorded(const QString & /*why: the delivery log's*/)
{
    HttpResponse r = HttpResponse::problem(
        504, u"Result not recorded"_qs,
        u"the event was processed but the store did not record the result; it will be recovered after the lease"_qs);
    r.setHeader("Retry-After", "5");
    return r;
}
// Deliveries kept in memory while the store refuses the log: the newest, up to both bounds.
constexpr int kLogBacklog = 50000;
constexpr qint64 kLogBacklogBytes = 64LL << 20;
// What a delivery log entry holds: a mismatch's body up to kPayloadBytes, at most
// kPayloadsPerMinute of them (a burst of as many), so that a sender reusing a key with other
// bodies cannot fill the store (a 64 KB body per 422 did: Redis out of memory within seconds);
// a detail up to kDetailChars, a provider's note (from headers) up to kNoteChars.
constexpr qsizetype kPayloadBytes = 64 * 1024;
constexpr double kPayloadsPerMinute = 60;
constexpr qsizetype kDetailChars = 2048;
constexpr qsizetype kNoteChars = 256;
// Rejected deliveries (401, 400, 405, 413, 508, ...: before any key is claimed, so from anyone
// who can reach the port) are logged one by one for at most kRejectionsPerMinute per endpoint,
// a burst of kRejectionBurst; past that each endpoint's are counted per status and written as
// one summary entry per status and kRejectionSummaryMs, with their count and the last one's
// reason. A flood of bad signatures (16k a second here, ~9 GB an hour of SQL log) so writes at
// most about two entries a second per endpoint and status (~35 MB a day), and takes a Redis
// stream of 100,000 entries
// more than half a day to turn over. A sender misconfigured for real (a wrong secret on a busy
// endpoint) is still seen whole: every rejection counted, one a second in full, each summary
// saying why. The burst lets a short episode (a rotated secret, someone trying a few requests)
// be logged delivery by delivery.
constexpr double kRejectionsPerMinute = 60;
constexpr double kRejectionBurst = 100;
constexpr qint64 kRejectionSummaryMs = 1000;

// `text` cut to at most `max` characters, saying so (never between a surrogate pair).
QString capped(const QString &text, qsizetype max)
{
    if (text.size() <= max)
        return text;
    qsizetype keep = max - 1;
    if (keep > 0 && text.at(keep - 1).isHighSurrogate())
        --keep;
    return text.left(keep) + u'…';
}

// A part of the delivery log written, as a pool job's result.
Result<Ok> appendLog(IdempotencyStore &store, const QList<DeliveryEvent> &part)
{
    if (auto r = store.appendDeliveries(part); !r)
        return r.error();
    return Ok{};
}

// About what an entry of the delivery log takes in memory.
qint64 logFootprint(const DeliveryEvent &e)
{
    return 160 +
           2 * (e.endpoint.size() + e.key.size() + e.type.size() + e.instance.size() +
                e.detail.size()) +
           e.payload.size();
}

// Claimed too late to start (the store was slow): nothing ran, and the claim is released (the
// key finished as `reset`), so the sender's next delivery processes it.
HttpResponse notStarted(const ProcessResult &late)
{
    HttpResponse r = HttpResponse::problem(503, u"Processing not started in time"_qs,
                                           late.error + u"; nothing ran: send it again"_qs);
    r.setHeader("Retry-After", "1");
    return r;
}

// The state a run finishes its key in: reset when it never started (ProcessResult::started).
KeyState finishedState(const ProcessResult &processed)
{
    if (!processed.started)
        return KeyState::Reset;
    return processed.success ? KeyState::Completed : KeyState::Failed;
}

// What a run's finish asks the store to record for the key holding `token`.
FinishRequest finishOf(const QString &key, qint64 token, const ProcessResult &processed)
{
    FinishRequest finish;
    finish.key = key;
    finish.token = token;
    finish.state = finishedState(processed);
    finish.result = processed.response;
    finish.error = processed.error;
    return finish;
}

// What a duplicate of a finished key gets: its stored answer; a key failed with none (force-
// failed by an operator) gets a 500 that says so, never a status 0.
StoredResult answerOf(const KeyRecord &record)
{
    if (record.result.status >= 100)
        return record.result;
    const HttpResponse r = HttpResponse::problem(
        500, u"Event failed"_qs,
        u"this event failed with no answer stored to replay; an operator can retry or reset it"_qs);
    return {r.status, r.headers, r.body};
}

// Processed, but a newer claim took the key over (its lease had ended): that one's result wins.
HttpResponse claimSuperseded(FinishVerdict verdict)
{
    HttpResponse r = HttpResponse::problem(
        409, u"Claim superseded"_qs,
        u"this delivery's lease was taken over by a newer claim, whose result wins (%1)"_qs.arg(toString(verdict)));
    r.setHeader("Retry-After", "1");
    return r;
}

// SendGrid's signature covers the whole original body: a forwarded subset carries none.
bool isBatchSignatureHeader(const QByteArray &name)
{
    return name.toLower().startsWith("x-twilio-email-event-webhook-");
}

} // namespace

// How long a duplicate of a key in progress is told to wait (Retry-After, in seconds), on the
// store's clock like the lease. Past the run's deadline (its claim + forward_timeout_seconds) no
// run is going: its outcome is unknown (ProcessResult::outcomeUnknown) or its result is being
// recorded, and the key waits for its lease — told as it is, not "retry in 10 s" again and
// again. Else the lease bounds the wait, at most 10 s: the answer is usually ready much sooner.
struct InProgressWait
{
    qint64 seconds = 1;
    bool runOver = false;
};

InProgressWait inProgressWait(const ClaimResult &claim, const EndpointSettings &settings)
{
    const qint64 leftMs = std::max<qint64>(0, claim.record.leaseUntilMs - claim.storeNowMs);
    const qint64 runEndsMs = claim.record.leaseUntilMs - settings.leaseSeconds * 1000 +
                             settings.forwardTimeoutSeconds * 1000;
    const bool runOver = claim.storeNowMs >= runEndsMs;
    const qint64 untilLeaseEnds = std::max<qint64>((leftMs + 999) / 1000, 1);
    return {runOver ? untilLeaseEnds : std::min<qint64>(untilLeaseEnds, 10), runOver};
}

struct IdempotencyEngine::Delivery
{
    HttpRequest request;
    Responder responder;
    const EndpointConfig *endpoint = nullptr;
    QString key;
    QString note; // the provider's: Slack's retry number, Shopify's event id, ...
    QString type; // the event's type (Provider::eventType); a batch's: its elements' distinct ones
    QByteArray payload; // kept in the delivery log for a mismatch
    qint64 startUs = 0;
    qint64 claimSentUs = 0; // the lease began after this (monotonic): deadlines count from here
};

IdempotencyEngine::IdempotencyEngine(Config config, std::shared_ptr<StorePool> pool,
                                     QString instance, QObject *parent)
    : QObject(parent), m_config(std::move(config)), m_pool(std::move(pool)),
      m_instance(std::move(instance))
{
    qRegisterMetaType<idem::DeliveryEvent>();
    if ((m_metrics = Metrics::instance())) {
        for (const auto &e : m_config.endpoints)
            m_endpointMetrics.push_back(&m_metrics->endpoint(e.name));
        m_endpointMetrics.push_back(&m_metrics->endpoint({}));
    }
    for (const auto &e : m_config.endpoints) {
        m_via.insert(e.name, newViaEntry());
        Processor *processor = makeProcessor(e).release();
        processor->setParent(this); // moves with the engine to the receiver thread
        m_processors.emplace(e.name, processor);
    }
    const qint64 nowMs = monotonicUs() / 1000;
    m_payloads = TokenBucket(kPayloadsPerMinute, kPayloadsPerMinute, nowMs);
    m_rejections.resize(
        size_t(m_config.endpoints.size()),
        RejectionBudget{TokenBucket(kRejectionBurst, kRejectionsPerMinute, nowMs), {}});
    m_logTimer.setInterval(200);
    m_logTimer.setParent(this);
    connect(&m_logTimer, &QTimer::timeout, this, &IdempotencyEngine::flushLog);
    m_purgeTimer.setParent(this);
    m_purgeTimer.setInterval(60'000);
    connect(&m_purgeTimer, &QTimer::timeout, this, &IdempotencyEngine::purge);
    // Timers start from the receiver thread's event loop.
    QMetaObject::invokeMethod(this, [this] {
        m_logTimer.start();
        m_purgeTimer.start();
        purge();
    }, Qt::QueuedConnection);
}

IdempotencyEngine::~IdempotencyEngine() = default;

EngineCounters IdempotencyEngine::counters() const
{
    EngineCounters c;
    for (size_t i = 0; i < c.byOutcome.size(); ++i)
        c.byOutcome[i] = m_outcomes[i].load();
    c.processorRuns = m_processorRuns.load();
    c.finishRetries = m_finishRetries.load();
    c.inFlight = m_inFlight.load();
    return c;
}

void IdempotencyEngine::handle(HttpRequest request, Responder responder)
{
    auto d = std::make_shared<Delivery>();
    d->startUs = request.receivedAtUs ? request.receivedAtUs : monotonicUs();
    d->request = std::move(request);
    d->responder = std::move(responder);
    ++m_inFlight;

    const QByteArray &path = d->request.path;
    if ((path == "/healthz" || path == "/readyz") && d->request.method != "GET" &&
        d->request.method != "HEAD") {
        HttpResponse r = HttpResponse::problem(405, u"Method Not Allowed"_qs,
                                               u"GET %1"_qs.arg(QString::fromLatin1(path)));
        r.setHeader("Allow", "GET, HEAD");
        d->responder.send(r);
        --m_inFlight;
        return;
    }
    if (path == "/healthz") {
        // Asks the store itself (off this thread): is it there, and may it lose records?
        m_pool->submit<QStringList>(
            this,
            [](IdempotencyStore &store) -> Result<QStringList> {
                if (auto ping = store.ping(); !ping)
                    return ping.error();
                return store.durabilityWarnings();
            },
            [this, d](Result<QStringList> warnings) {
                QJsonObject body{{u"status"_qs, warnings ? u"ok"_qs : u"store unavailable"_qs},
                                 {u"in_flight"_qs, m_inFlight.load() - 1},
                                 {u"finish_retries"_qs, m_finishRetries.load()}};
                if (warnings)
                    body.insert(u"warnings"_qs, QJsonArray::fromStringList(*warnings));
                else
                    logNotReady(u"/healthz"_qs, warnings.error().message);
                sendProbe(d, HttpResponse::json(warnings ? 200 : 503, body));
            });
        return;
    }
    if (path == "/readyz") {
        // Ready for deliveries: the store answers and its schema is this build's
        // (docs/operations.md#health).
        m_pool->submit<Ok>(
            this,
            [](IdempotencyStore &store) -> Result<Ok> {
                if (auto ready = store.ready(); !ready)
                    return ready.error();
                return Ok{};
            },
            [this, d](Result<Ok> ready) {
                // A store that answers but refuses writes (a full disk, Redis out of memory)
                // refuses every new delivery: not ready while its last write failed, for a while.
                const StoreHealth health = m_pool->health();
                if (ready && health.writesFailing(QDateTime::currentMSecsSinceEpoch()))
                    ready = makeError(ErrorCode::Unavailable,
                                      u"the store refuses writes: "_qs + health.lastWriteError);
                // Why not (the store's error, its schema version) is the log's, not the network's.
                logNotReady(u"/readyz"_qs, ready ? QString() : ready.error().message);
                sendProbe(
                    d, HttpResponse::json(ready ? 200 : 503,
                                          {{u"status"_qs, ready ? u"ready"_qs : u"not ready"_qs}}));
            });
        return;
    }
    if (!path.startsWith("/hooks/"))
        return reject(d, 404, u"Not Found"_qs, u"webhooks are received at /hooks/{endpoint}"_qs);
    const QString name = QString::fromUtf8(path.mid(7));
    d->endpoint = m_config.endpoint(name);
    if (!d->endpoint)
        return reject(d, 404, u"Unknown endpoint"_qs,
                      u"no endpoint named \"%1\" is configured"_qs.arg(name));
    const EndpointConfig &e = *d->endpoint;
    if (d->request.method != "POST") {
        HttpResponse r = HttpResponse::problem(405, u"Method Not Allowed"_qs,
                                               u"webhooks are delivered with POST"_qs);
        r.setHeader("Allow", "POST");
        return respond(d, r, Outcome::Rejected);
    }
    if (passedThrough(d->request.headers, m_via.value(e.name))) // before anything is claimed for it
        return reject(
            d, 508, u"Loop detected"_qs,
            u"this delivery to \"%1\" was forwarded by that endpoint itself: a forward_to leads "
            u"back to it; nothing was claimed for this delivery"_qs.arg(name));
    const Provider *provider = providerFor(e.provider);
    // Read before the signature is checked: a refused delivery's log line says what it claimed
    // to be (the text is bounded and printable whoever sent it, eventTypeText()).
    d->type = provider->eventType(d->request, e);
    if (auto verified = provider->verify(d->request, e, nowMs() / 1000); !verified)
        return reject(d, 401, u"Signature check failed"_qs, verified.error().message);
    if (auto direct = provider->directAnswer(d->request)) {
        d->responder.send(*direct);
        --m_inFlight;
        return;
    }
    d->note = capped(provider->note(d->request), kNoteChars);
    if (provider->isBatch())
        return handleBatch(d, provider);

    const KeyExtraction extracted = provider->extractKey(d->request, e);
    if (extracted.kind == KeyExtraction::Kind::Missing && e.settings.passthroughMissingKey) {
        // No key, and the endpoint lets such deliveries through without deduplication.
        d->claimSentUs = monotonicUs();
        startProcessor(e, job(d, {}, {}, d->request.headers, d->request.body),
                       [this, d](ProcessResult result) {
                           respond(d, fromStored(result.response), Outcome::Processed, 0,
                                   u"passthrough (no key)"_qs);
                       });
        return;
    }
    if (extracted.kind != KeyExtraction::Kind::Found)
        return reject(d, 400, u"Missing idempotency key"_qs, extracted.detail);
    auto key = namespacedKey(e.name, extracted.key);
    if (!key)
        return reject(d, 400, u"Invalid idempotency key"_qs, key.error().message);
    d->key = *key;

    ClaimRequest claim;
    claim.key = d->key;
    claim.endpoint = e.name;
    claim.provider = e.provider;
    claim.type = d->type;
    claim.fingerprint = sha256Hex(d->request.body);
    // The stored request keeps no secrets (Authorization, signatures): the live delivery is
    // forwarded with them, an operator's retry of the stored one without.
    claim.request = {d->request.method, d->request.target, maskSecrets(d->request.headers), d->request.body};
    claim.policy = e.settings.claimPolicy();
    d->claimSentUs = monotonicUs();
    lane().claim(claim, [this, d](Result<ClaimResult> result) { onClaimed(d, std::move(result)); });
}

ProcessJob IdempotencyEngine::job(const DeliveryPtr &d, const QString &key, const QByteArray &tokens,
                                  const HeaderList &headers, const QByteArray &body) const
{
    ProcessJob job;
    job.key = key;
    job.fencingToken = tokens;
    job.request = {d->request.method, d->request.target, headers, body};
    job.peer = d->request.peer;
    job.via = m_via.value(d->endpoint->name);
    // A hard deadline counted from before the claim: the lease began after that, and ends
    // kLeaseMarginSeconds or more after this deadline (the config refuses less).
    const qint64 spentMs = (monotonicUs() - d->claimSentUs) / 1000;
    job.deadlineMs = std::max<qint64>(0, d->endpoint->settings.forwardTimeoutSeconds * 1000 - spentMs);
    return job;
}

qint64 IdempotencyEngine::leaseEndUs(const DeliveryPtr &d) const
{
    return d->claimSentUs + d->endpoint->settings.leaseSeconds * 1'000'000;
}

template<typename T>
void IdempotencyEngine::untilStored(std::function<void(std::function<void(Result<T>)>)> call, qint64 leaseEndUs,
                                    std::function<void(Result<T>)> done, int attempt)
{
    // A finish that meets a store error is retried while the lease lasts, on a fresh connection
    // (the lane and the pool reconnect after an error), with back-off. Safe even when the first
    // try's outcome is unknown: the store answers Repeated to the same token and result
    // (docs/stores.md#connections-and-timeouts).
    call([this, call, leaseEndUs, done, attempt](Result<T> result) {
        const qint64 backoffMs = std::min<qint64>(50LL << std::min(attempt, 5), 1000);
        if (result || monotonicUs() + backoffMs * 1000 >= leaseEndUs)
            return done(std::move(result));
        ++m_finishRetries;
        if (m_metrics)
            m_metrics->finishRetried();
        if (attempt == 0)
            qCWarning(lcEngine, "recording a result failed, retrying while the lease lasts: %s",
                      qPrintable(result.error().message));
        QTimer::singleShot(backoffMs, this, [this, call, leaseEndUs, done, attempt] {
            untilStored<T>(call, leaseEndUs, done, attempt + 1);
        });
    });
}

StoreLane &IdempotencyEngine::lane()
{
    if (!m_lane) // made on the receiver thread, where it is used
        m_lane = m_pool->lane(this);
    return *m_lane;
}

void IdempotencyEngine::recordRejection(const HttpRequest &partial, int status,
                                        const QString &detail)
{
    auto d = std::make_shared<Delivery>();
    d->startUs = partial.receivedAtUs ? partial.receivedAtUs : monotonicUs();
    if (partial.path.startsWith("/hooks/"))
        d->endpoint = m_config.endpoint(QString::fromUtf8(partial.path.mid(7)));
    ++m_inFlight;
    // The answer is already on its way: respond() only counts and logs.
    respond(d, HttpResponse{status, {}, {}}, Outcome::Rejected, 0, detail);
}

void IdempotencyEngine::onClaimed(const DeliveryPtr &d, Result<ClaimResult> result)
{
    if (!result)
        return respond(d, storeUnavailable(result.error().message), Outcome::Unavailable, 0, result.error().message);
    const ClaimResult &claim = *result;
    const EndpointSettings &settings = d->endpoint->settings;
    // Answered from a read: the store refused to count this delivery (a full disk, ...).
    const QString uncounted =
        claim.uncounted.isEmpty() ? QString() : u"not counted: "_qs + claim.uncounted;
    switch (claim.decision.action) {
    case ClaimAction::Create:
    case ClaimAction::Reclaim:
        return runProcessor(d, claim.record.token, claim.decision.outcome);
    case ClaimAction::Replay: {
        HttpResponse r = fromStored(answerOf(claim.record));
        r.setHeader("Idempotent-Replayed", "true");
        return respond(d, r, Outcome::Replayed, claim.record.token, uncounted);
    }
    case ClaimAction::InProgress: {
        const InProgressWait wait = inProgressWait(claim, settings);
        HttpResponse r = HttpResponse::problem(
            settings.inProgressStatus, u"Delivery in progress"_qs,
            wait.runOver
                ? u"an earlier delivery of this event has no recorded outcome yet (the app may "
                  u"have acted on it); its lease ends in %1 s: retry then"_qs.arg(wait.seconds)
                : u"this event is being processed by an earlier delivery; retry in %1 s to get its result"_qs
                      .arg(wait.seconds));
        r.setHeader("Retry-After", QByteArray::number(wait.seconds));
        return respond(d, r, Outcome::InProgress, claim.record.token, uncounted);
    }
    case ClaimAction::Mismatch: {
        // The stored body's hash stays in the store and the window: in an answer to an
        // unsigned sender it would be an oracle for guessing a low-entropy body.
        HttpResponse r = HttpResponse::problem(
            422, u"Idempotency key reused with a different payload"_qs,
            u"the key %1 was first seen with another body; this one differs, so it was not processed"_qs
                .arg(d->key));
        QStringList detail{uncounted};
        if (keepPayload())
            d->payload = d->request.body.left(kPayloadBytes);
        else
            detail.append(
                u"body not kept: more than %1 mismatches a minute"_qs.arg(kPayloadsPerMinute));
        detail.removeAll(QString());
        return respond(d, r, Outcome::Mismatch, claim.record.token, detail.join(u"; "_qs));
    }
    }
}

void IdempotencyEngine::runProcessor(const DeliveryPtr &d, qint64 token, Outcome outcome)
{
    run(d, job(d, d->key, QByteArray::number(token), d->request.headers, d->request.body),
        [this, d, token, outcome](ProcessResult result) { onProcessed(d, token, outcome, std::move(result)); });
}

void IdempotencyEngine::run(const DeliveryPtr &d, const ProcessJob &job, Processor::Done done)
{
    // The claim waited so long that no time is left: nothing is started that could outlive the
    // lease; the claim is released (ProcessResult::started).
    if (job.deadlineMs < kMinimumRunMs) {
        ProcessResult late;
        late.started = false;
        late.error = u"the claim took %1 ms of the %2 s forward timeout; not started"_qs
                         .arg((monotonicUs() - d->claimSentUs) / 1000)
                         .arg(d->endpoint->settings.forwardTimeoutSeconds);
        return done(std::move(late));
    }
    startProcessor(*d->endpoint, job, std::move(done));
}

void IdempotencyEngine::startProcessor(const EndpointConfig &endpoint, const ProcessJob &job,
                                       Processor::Done done)
{
    ++m_processorRuns;
    Processor *processor = m_processors.at(endpoint.name);
    Metrics::Endpoint *metrics = metricsFor(&endpoint);
    if (!metrics)
        return processor->run(job, std::move(done));
    metrics->processorRuns->Increment();
    const qint64 startedUs = monotonicUs();
    processor->run(job, [metrics, startedUs, done = std::move(done)](ProcessResult result) {
        metrics->processorLatency->Observe(double(monotonicUs() - startedUs) / 1e6);
        if (!result.success)
            metrics->processorFailures->Increment();
        done(std::move(result));
    });
}

Metrics::Endpoint *IdempotencyEngine::metricsFor(const EndpointConfig *endpoint) const
{
    if (!m_metrics)
        return nullptr;
    // The endpoint points into m_config.endpoints: its index there.
    const qsizetype i =
        endpoint ? endpoint - m_config.endpoints.constData() : m_config.endpoints.size();
    return i >= 0 && i < qsizetype(m_endpointMetrics.size()) ? m_endpointMetrics[size_t(i)]
                                                             : m_endpointMetrics.back();
}

void IdempotencyEngine::send(const DeliveryPtr &d, const HttpResponse &response)
{
    d->responder.send(response);
    --m_inFlight;
    if (Metrics::Endpoint *metrics = metricsFor(d->endpoint))
        metrics->latency->Observe(double(monotonicUs() - d->startUs) / 1e6);
}

void IdempotencyEngine::onProcessed(const DeliveryPtr &d, qint64 token, Outcome outcome,
                                    ProcessResult processed)
{
    if (processed.outcomeUnknown) // not finished: left to its lease (ProcessResult)
        return respond(d, fromStored(processed.response), outcome, token, processed.error);
    const FinishRequest finish = finishOf(d->key, token, processed);
    untilStored<FinishVerdict>(
        [this, finish](std::function<void(Result<FinishVerdict>)> done) {
            lane().finish(finish, std::move(done));
        },
        leaseEndUs(d),
        [this, d, token, outcome, processed](Result<FinishVerdict> verdict) {
            if (!processed.started) // released, or (not stored) leased until its lease ends
                return respond(d, notStarted(processed), Outcome::Unavailable, token,
                               processed.error);
            if (!verdict) // the sender must retry; the key is recovered once its lease ends
                return respond(d, resultNotRecorded(verdict.error().message), Outcome::Unavailable, token,
                               verdict.error().message);
            if (!finishStored(*verdict))
                return respond(d, claimSuperseded(*verdict), Outcome::InProgress, token, u"late completion refused"_qs);
            respond(d, fromStored(processed.response), outcome, token,
                    processed.success ? QString() : processed.error);
        });
}

void IdempotencyEngine::sendProbe(const DeliveryPtr &d, const HttpResponse &response)
{
    d->responder.send(response); // HEAD: the server leaves the body out
    --m_inFlight;
}

void IdempotencyEngine::logNotReady(const QString &probe, const QString &why)
{
    // Once per change, not once per probe (a load balancer asks every few seconds).
    if (why != m_notReadyLogged && !why.isEmpty())
        qWarning("idemdesk: %s: store not ready: %s", qPrintable(probe), qPrintable(why));
    m_notReadyLogged = why;
}

void IdempotencyEngine::reject(const DeliveryPtr &d, int status, const QString &title,
                               const QString &detail)
{
    respond(d, HttpResponse::problem(status, title, detail), Outcome::Rejected, 0, detail);
}

void IdempotencyEngine::respond(const DeliveryPtr &d, HttpResponse response, Outcome outcome,
                                qint64 token, const QString &detail)
{
    if (!d->key.isEmpty())
        response.setHeader("Idempotency-Key", d->key.toLatin1());
    response.setHeader("Idempotency-Outcome", toString(outcome).toLatin1());
    send(d, response);
    record(d, d->key, outcome, response.status, token, detail);
}

void IdempotencyEngine::record(const DeliveryPtr &d, const QString &key, Outcome outcome,
                               int status, qint64 token, const QString &detail,
                               const QByteArray &payload)
{
    DeliveryEvent event;
    event.latencyUs = monotonicUs() - d->startUs;
    event.atMs = nowMs() - event.latencyUs / 1000; // when it arrived: the timeline's order
    event.endpoint = d->endpoint ? d->endpoint->name : QString();
    event.key = key;
    event.type = d->type;
    event.outcome = outcome;
    event.status = status;
    event.token = token;
    event.instance = m_instance;
    event.detail = capped(d->note.isEmpty()  ? detail
                          : detail.isEmpty() ? d->note
                                             : d->note + u"; "_qs + detail,
                          kDetailChars);
    event.payload = payload.isEmpty() ? d->payload : payload;
    ++m_outcomes[size_t(outcome)];
    if (Metrics::Endpoint *metrics = metricsFor(d->endpoint)) {
        metrics->deliveries[size_t(outcome)]->Increment();
        if (outcome == Outcome::Recovered)
            m_metrics->leaseRecovered();
    }
    // A rejection past its endpoint's budget is counted in the next summary instead.
    if (d->endpoint && (outcome != Outcome::Rejected || logRejection(*d->endpoint, event)))
        appendToLog(event);
    Q_EMIT delivered(event);
}

void IdempotencyEngine::appendToLog(const DeliveryEvent &event)
{
    m_logBytes += logFootprint(event);
    m_logBuffer.append(event);
    trimLog();
    if (m_logBuffer.size() >= kLogBatch)
        flushLog();
}

// Whether this rejected delivery is logged one by one (within its endpoint's budget, a token
// bucket); if not, it is counted for the endpoint's next summary.
bool IdempotencyEngine::logRejection(const EndpointConfig &endpoint, const DeliveryEvent &event)
{
    const qsizetype i = &endpoint - m_config.endpoints.constData();
    if (i < 0 || i >= qsizetype(m_rejections.size()))
        return true;
    RejectionBudget &b = m_rejections[size_t(i)];
    const qint64 now = monotonicUs() / 1000;
    if (b.logged.take(now))
        return true;
    Unlogged &u = b.byStatus[event.status];
    if (u.count++ == 0) {
        u.sinceMs = now;
        u.firstAtMs = event.atMs;
    }
    u.last = event;
    return false;
}

void IdempotencyEngine::summariseRejections(bool all)
{
    const qint64 now = monotonicUs() / 1000;
    for (RejectionBudget &b : m_rejections) {
        for (auto it = b.byStatus.begin(); it != b.byStatus.end();) {
            const Unlogged &u = it->second;
            if (!all && now - u.sinceMs < kRejectionSummaryMs) {
                ++it;
                continue;
            }
            DeliveryEvent summary = u.last;
            // Dated when written, as a rejection is (it takes no time): later than the entries
            // written before it. Dated at its first rejection, up to a second earlier, it stopped a
            // reader of Redis's stream (newest first, up to the first entry older than asked)
            // short of them.
            summary.atMs = nowMs();
            summary.key.clear();
            summary.latencyUs = 0;
            summary.token = 0;
            summary.payload.clear();
            summary.count = u.count;
            summary.detail = capped(
                u"%1 %2 in %3 s not logged one by one (more than %4 a minute to this endpoint); "
                u"the last: %5"_qs
                    .arg(countOf(u.count, u"rejected delivery", u"rejected deliveries"))
                    .arg(u.last.status)
                    .arg(double(std::max<qint64>(u.last.atMs - u.firstAtMs, 0)) / 1000, 0, 'f', 1)
                    .arg(kRejectionsPerMinute)
                    .arg(u.last.detail),
                kDetailChars);
            it = b.byStatus.erase(it);
            appendToLog(summary);
        }
    }
}

// SendGrid-style batches (docs/http.md#sendgrid-batches): each element is its own key, all claimed
// in one atomic step and finished in another; only the elements not yet completed are forwarded, as
// one array of the elements' bytes as sent (the original body, signature and all, when every
// element is new); the answer is 2xx only when every element is completed.
void IdempotencyEngine::handleBatch(const DeliveryPtr &d, const Provider *provider)
{
    const EndpointConfig &e = *d->endpoint;
    auto elements = provider->splitBatch(d->request, e.settings.maxBatchElements);
    if (!elements && elements.error().code == ErrorCode::TooLarge)
        return reject(d, 413, u"Batch too large"_qs, elements.error().message);
    if (!elements)
        return reject(d, 400, u"Malformed batch"_qs, elements.error().message);
    // The request's headers are the same for every event: stored once for the batch, each
    // event's record refers to them (IdempotencyStore::claimBatch).
    const HeaderList headers = maskSecrets(d->request.headers);
    const QByteArray headersRef = sharedRef(headersJson(headers));
    auto batch = std::make_shared<Batch>();
    batch->events = elements->size();
    QHash<QString, qsizetype> claimOf; // key → its claim
    QStringList types;                 // the elements' distinct types, in the batch's order
    for (const BatchElement &element : *elements) {
        auto key = namespacedKey(e.name, element.key);
        if (!key)
            return reject(d, 400, u"Invalid idempotency key"_qs, key.error().message);
        const QByteArray bytes = '[' + element.raw + ']'; // a batch of one, as sent
        if (const auto first = claimOf.constFind(*key); first != claimOf.cend()) {
            // on_mismatch "ignore": another body under the key is a duplicate, as across batches
            if (batch->claims.at(*first).fingerprint == element.fingerprint ||
                batch->claims.at(*first).policy.onMismatch == OnMismatch::Ignore)
                ++batch->repeats;
            else
                batch->conflicts.append({*key, bytes});
            continue;
        }
        claimOf.insert(*key, batch->claims.size());
        ClaimRequest claim;
        claim.key = *key;
        claim.endpoint = e.name;
        claim.provider = e.provider;
        claim.type = provider->elementType(element.raw);
        if (!claim.type.isEmpty() && !types.contains(claim.type))
            types.append(claim.type);
        claim.fingerprint = element.fingerprint;
        claim.request = {d->request.method, d->request.target, headers, bytes, headersRef};
        claim.policy = e.settings.claimPolicy();
        batch->claims.append(claim);
        batch->bodies.append(element.raw);
    }
    d->key = batch->claims.size() == 1 ? batch->claims.first().key : QString();
    d->type = eventTypeText(types.join(u','));
    d->claimSentUs = monotonicUs();
    m_pool->submit<QList<ClaimResult>>(
        this, [batch](IdempotencyStore &store) { return store.claimBatch(batch->claims); },
        [this, d, batch](Result<QList<ClaimResult>> results) {
            if (!results)
                return respond(d, storeUnavailable(results.error().message), Outcome::Unavailable, 0,
                               results.error().message);
            const QList<ClaimRequest> &claims = batch->claims;
            QByteArrayList forward;
            QStringList forwardKeys;
            QList<QByteArray> tokens;
            QList<qsizetype> claimedIndexes;
            for (qsizetype i = 0; i < results->size(); ++i)
                if (results->at(i).claimed()) {
                    forward.append(batch->bodies.at(i));
                    forwardKeys.append(claims.at(i).key);
                    tokens.append(QByteArray::number(results->at(i).record.token));
                    claimedIndexes.append(i);
                }
            if (forward.isEmpty())
                return finishBatch(d, batch, *results, {}, {});
            HeaderList headers = d->request.headers;
            QByteArray body = d->request.body;
            if (forward.size() != batch->events) {
                // A subset: its own array of the elements as sent, and no signature, which
                // covered the whole batch.
                body = '[' + forward.join(',') + ']';
                headers.removeIf([](const auto &h) { return isBatchSignatureHeader(h.first); });
            }
            run(d, job(d, forwardKeys.join(u","_qs), tokens.join(','), headers, body),
                [this, d, batch, results = *results, claimedIndexes](ProcessResult processed) {
                    if (processed.outcomeUnknown) // not finished: left to their leases
                        return finishBatch(d, batch, results, processed, {});
                    // The app's one answer for the events run is kept once for them all.
                    ProcessResult shared = processed;
                    shared.response.ref = sharedRef(sharedResultContent(processed.response));
                    QList<FinishRequest> finishes;
                    for (qsizetype i : claimedIndexes) {
                        finishes.append(
                            finishOf(batch->claims.at(i).key, results.at(i).record.token, shared));
                        finishes.last().ttlMs = batch->claims.at(i).policy.ttlMs;
                    }
                    untilStored<QList<FinishVerdict>>(
                        [this, finishes](std::function<void(Result<QList<FinishVerdict>>)> done) {
                            m_pool->submit<QList<FinishVerdict>>(
                                this,
                                [finishes](IdempotencyStore &store) {
                                    return store.finishBatch(finishes);
                                },
                                std::move(done), StorePool::Batch::Alone,
                                StorePool::Priority::Finish);
                        },
                        leaseEndUs(d),
                        [this, d, batch, results,
                         processed](Result<QList<FinishVerdict>> verdicts) {
                            if (!processed.started)
                                return respond(d, notStarted(processed), Outcome::Unavailable, 0,
                                               processed.error);
                            if (!verdicts)
                                return respond(d, resultNotRecorded(verdicts.error().message),
                                               Outcome::Unavailable, 0, verdicts.error().message);
                            finishBatch(d, batch, results, processed, *verdicts);
                        });
                });
        });
}

void IdempotencyEngine::finishBatch(const DeliveryPtr &d, const BatchPtr &batch,
                                    const QList<ClaimResult> &results,
                                    const ProcessResult &processed,
                                    const QList<FinishVerdict> &verdicts)
{
    const QList<ClaimRequest> &claims = batch->claims;
    int completed = 0, processedNow = 0, inProgress = 0, superseded = 0;
    // Events reusing a key with another body: against the store's record, or an earlier event
    // of this batch.
    qsizetype mismatched = batch->conflicts.size();
    InProgressWait wait{0, true};        // the batch's answer is whole when its last event's is
    std::optional<StoredResult> failure; // the first stored or fresh failure
    qsizetype v = 0;
    for (const ClaimResult &r : results) {
        if (r.claimed()) {
            ++processedNow;
            // Not finished (ProcessResult::outcomeUnknown): it answers like a failure.
            if (processed.outcomeUnknown) {
                if (!failure)
                    failure = processed.response;
                continue;
            }
            const bool stored = v < verdicts.size() && finishStored(verdicts.at(v++));
            if (!stored)
                ++superseded; // a newer claim took it over: this run's answer is not the record's
            else if (processed.success)
                ++completed;
            else if (!failure)
                failure = processed.response;
        } else if (r.decision.action == ClaimAction::Replay) {
            if (r.record.state == KeyState::Completed)
                ++completed;
            else if (!failure)
                failure = answerOf(r.record);
        } else if (r.decision.action == ClaimAction::InProgress) {
            ++inProgress;
            const InProgressWait event = inProgressWait(r, d->endpoint->settings);
            wait = {std::max(wait.seconds, event.seconds), wait.runOver && event.runOver};
        } else {
            ++mismatched;
        }
    }
    const qsizetype total = batch->events;
    HttpResponse response;
    Outcome outcome = processedNow ? Outcome::Processed : Outcome::Replayed;
    if (completed == results.size() && !mismatched) {
        response = HttpResponse::json(200, {{u"events"_qs, total},
                                            {u"processed"_qs, processedNow},
                                            {u"replayed"_qs, completed - processedNow},
                                            {u"repeated"_qs, batch->repeats}});
        if (!processedNow)
            response.setHeader("Idempotent-Replayed", "true");
    } else if (failure) {
        response = fromStored(*failure);
    } else if (mismatched) {
        response = HttpResponse::problem(
            422, u"Idempotency key reused with a different payload"_qs,
            u"%1 of the %2 events reuse the key of another event (its sg_event_id) with a "
            u"different body, in this batch or an earlier one; they were not processed"_qs
                .arg(mismatched)
                .arg(total));
        outcome = Outcome::Mismatch;
    } else if (superseded) {
        response = claimSuperseded(FinishVerdict::StaleToken);
        outcome = Outcome::InProgress;
    } else {
        // A batch is 2xx only when every event in it is completed (docs/http.md#sendgrid-batches):
        // an in_progress_status of 2xx (for single events) would let the sender drop events that
        // may still fail.
        const int status = d->endpoint->settings.inProgressStatus / 100 == 2
                               ? 409
                               : d->endpoint->settings.inProgressStatus;
        response = HttpResponse::problem(
            status, u"Delivery in progress"_qs,
            (wait.runOver
                 ? u"%1 of the %2 events have no recorded outcome yet from an earlier delivery "
                   u"(the app may have acted on them); their leases end in %3 s: retry then"_qs
                 : u"%1 of the %2 events are being processed by an earlier delivery; retry in %3 s"_qs)
                .arg(inProgress)
                .arg(total)
                .arg(wait.seconds));
        response.setHeader("Retry-After", QByteArray::number(wait.seconds));
        outcome = Outcome::InProgress;
    }
    QStringList keys;
    for (const ClaimRequest &c : claims)
        keys << c.key;
    response.setHeader("Idempotency-Key", (keys.size() > 10 ? keys.mid(0, 10).join(u","_qs) + u",…"_qs : keys.join(u","_qs)).toLatin1());
    response.setHeader("Idempotency-Outcome", toString(outcome).toLatin1());
    send(d, response);
    const QString detail = batch->repeats
                               ? u"batch of %1 (%2 repeated)"_qs.arg(total).arg(batch->repeats)
                               : u"batch of %1"_qs.arg(total);
    // A mismatched event's body is kept in the log as a single delivery's is (keepPayload).
    const auto mismatchPayload = [this](const QByteArray &event) {
        return keepPayload() ? event.left(kPayloadBytes) : QByteArray();
    };
    for (qsizetype i = 0; i < results.size(); ++i) {
        const ClaimResult &r = results.at(i);
        record(d, claims.at(i).key, r.decision.outcome, response.status, r.record.token, detail,
               r.decision.action == ClaimAction::Mismatch
                   ? mismatchPayload(claims.at(i).request.body)
                   : QByteArray());
    }
    for (const auto &[key, event] : batch->conflicts)
        record(d, key, Outcome::Mismatch, response.status, 0,
               detail + u": an earlier event of this batch has this key with another body"_qs,
               mismatchPayload(event));
}

void IdempotencyEngine::retryKey(const QString &key, bool force,
                                 std::function<void(Result<RetryOutcome>)> done)
{
    QHash<QString, ClaimPolicy> policies;
    for (const auto &e : m_config.endpoints)
        policies.insert(e.name, e.settings.claimPolicy());
    ++m_inFlight;
    const qint64 startUs = monotonicUs();
    m_pool->submit<ClaimResult>(
        this,
        [key, force, policies](IdempotencyStore &store) -> Result<ClaimResult> {
            auto existing = store.key(key);
            if (!existing)
                return existing.error();
            if (!existing->has_value())
                return makeError(ErrorCode::NotFound, u"no key %1"_qs.arg(key));
            const KeyRecord &record = **existing;
            // (A lost result does not matter here: the run writes a new one.)
            if (!record.request.headersRef.isEmpty())
                return makeError(ErrorCode::Invalid,
                                 u"%1 cannot be retried: its request headers are shared content "
                                 u"the store no longer has, and the app would get a request "
                                 u"without them"_qs.arg(key));
            if (!policies.contains(record.endpoint))
                return makeError(ErrorCode::NotFound,
                                 u"%1: endpoint \"%2\" is not in the config, so its processor is unknown"_qs
                                     .arg(key, record.endpoint));
            if (record.state != KeyState::Reset) {
                auto verdict = store.applyOperator(key, OperatorAction::Reset, force, u"operator retry"_qs);
                if (!verdict)
                    return verdict.error();
                if (*verdict == OperatorVerdict::WrongState)
                    return makeError(
                        ErrorCode::Conflict,
                        u"%1 is %2: not retried unless forced"_qs.arg(key, toString(record.state)));
                if (*verdict == OperatorVerdict::Missing)
                    return makeError(ErrorCode::NotFound, u"no key %1"_qs.arg(key));
                if (*verdict == OperatorVerdict::Leased)
                    return makeError(ErrorCode::Conflict, leasedMessage(key, u"retried"_qs));
            }
            ClaimRequest claim;
            claim.key = key;
            claim.endpoint = record.endpoint;
            claim.provider = record.provider;
            claim.type = record.type;
            claim.fingerprint = record.fingerprint;
            claim.request = record.request;
            claim.policy = policies.value(record.endpoint);
            auto claimed = store.claim(claim);
            if (claimed && !claimed->claimed())
                return makeError(ErrorCode::Conflict,
                                 u"%1: a delivery claimed it first (%2)"_qs.arg(key, toString(claimed->decision.outcome)));
            return claimed;
        },
        [this, done, startUs](Result<ClaimResult> claimed) {
            if (!claimed) {
                --m_inFlight;
                return done(claimed.error());
            }
            const KeyRecord record = claimed->record;
            auto d = std::make_shared<Delivery>();
            d->startUs = startUs;
            d->claimSentUs = startUs;
            d->key = record.key;
            d->type = record.type;
            d->endpoint = m_config.endpoint(record.endpoint);
            d->request.method = record.request.method;
            d->request.target = record.request.path;
            run(d,
                job(d, record.key, QByteArray::number(record.token), record.request.headers,
                    record.request.body),
                [this, d, record, done](ProcessResult processed) {
                    // The delivery log's line says what went wrong, as a delivery's does.
                    const QString detail = processed.error.isEmpty()
                                               ? u"operator retry"_qs
                                               : u"operator retry: "_qs + processed.error;
                    if (processed.outcomeUnknown) { // not finished: left to its lease
                        respond(d, fromStored(processed.response), Outcome::Reprocessed,
                                record.token, detail);
                        return done(RetryOutcome{record.key, Outcome::Reprocessed, false,
                                                 processed.response, processed.error});
                    }
                    const FinishRequest finish = finishOf(record.key, record.token, processed);
                    untilStored<FinishVerdict>(
                        [this, finish](std::function<void(Result<FinishVerdict>)> stored) {
                            m_pool->submit<FinishVerdict>(
                                this,
                                [finish](IdempotencyStore &store) { return store.finish(finish); },
                                std::move(stored), StorePool::Batch::Alone,
                                StorePool::Priority::Finish);
                        },
                        leaseEndUs(d),
                        [this, d, record, processed, detail, done](Result<FinishVerdict> verdict) {
                            if (!processed.started) {
                                respond(d, notStarted(processed), Outcome::Unavailable,
                                        record.token, processed.error);
                                return done(makeError(
                                    ErrorCode::Unavailable,
                                    verdict && finishStored(*verdict)
                                        ? u"%1: %2; nothing ran, and the key is reset: the next delivery (or another retry) processes it"_qs
                                              .arg(record.key, processed.error)
                                        : u"%1: %2; nothing ran, and the key stays claimed until its lease ends"_qs
                                              .arg(record.key, processed.error)));
                            }
                            respond(d, fromStored(processed.response), Outcome::Reprocessed,
                                    record.token, detail);
                            if (!verdict)
                                return done(verdict.error());
                            if (!finishStored(*verdict))
                                return done(makeError(ErrorCode::Conflict,
                                                      u"%1: the result was not stored (%2)"_qs.arg(
                                                          record.key, toString(*verdict))));
                            done(RetryOutcome{record.key, Outcome::Reprocessed, processed.success,
                                              processed.response, processed.error});
                        });
                });
        });
}

void IdempotencyEngine::flushLog()
{
    summariseRejections(false);
    if (m_logBuffer.isEmpty() || m_logInFlight)
        return;
    // After a failed write, once a second: a store refusing writes is not asked five times.
    if (m_logFailing && !m_logRetry.hasExpired())
        return;
    writeLog(takeLogPart());
}

void IdempotencyEngine::drainLog()
{
    summariseRejections(true); // the rejections counted since the last summary
    // The part in flight first: its answer would come after the engine is gone.
    if (m_logInFlight && m_logWritten) {
        const QDeadlineTimer patience(10'000);
        while (*m_logWritten == 0 && !patience.hasExpired())
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        if (*m_logWritten != 1)
            m_logBuffer = m_logWriting + m_logBuffer;
        m_logInFlight = false;
    }
    while (!m_logBuffer.isEmpty()) {
        const QList<DeliveryEvent> part = takeLogPart();
        auto written =
            m_pool->run<Ok>([part](IdempotencyStore &store) { return appendLog(store, part); });
        if (!written) {
            qint64 lost = 0; // deliveries, a summary's all of them
            for (const DeliveryEvent &e : part + m_logBuffer)
                lost += e.count;
            qCWarning(lcEngine, "delivery log: %lld deliveries not written at shutdown, lost: %s",
                      lost, qPrintable(written.error().message));
            m_logBuffer.clear();
            m_logBytes = 0;
            return;
        }
    }
}

// The oldest part of the buffer, at most kLogBatch deliveries: one transaction each, so that a
// backlog kept while the store refused it is written back a part at a time (written whole, one
// larger than a full disk's free space was retried for ever).
QList<DeliveryEvent> IdempotencyEngine::takeLogPart()
{
    const qsizetype n = std::min<qsizetype>(m_logBuffer.size(), kLogBatch);
    QList<DeliveryEvent> part(m_logBuffer.cbegin(), m_logBuffer.cbegin() + n);
    m_logBuffer.remove(0, n);
    for (const DeliveryEvent &e : part)
        m_logBytes -= logFootprint(e);
    return part;
}

void IdempotencyEngine::writeLog(QList<DeliveryEvent> part)
{
    m_logInFlight = true;
    m_logWriting = part;
    m_logWritten = std::make_shared<std::atomic<int>>(0);
    m_pool->submit<Ok>(
        this,
        [part, outcome = m_logWritten](IdempotencyStore &store) {
            auto r = appendLog(store, part);
            *outcome = r ? 1 : 2;
            return r;
        },
        [this, part](Result<Ok> r) {
            m_logInFlight = false;
            m_logWriting.clear();
            if (r) {
                if (m_logFailing)
                    qCInfo(lcEngine, "delivery log written again");
                m_logFailing = m_logDropping = false;
                if (m_logBuffer.size() >= kLogBatch) // a backlog: the next part now
                    flushLog();
                return;
            }
            // Kept for the next flush while the store refuses it, up to the bounds.
            if (!m_logFailing)
                qCWarning(lcEngine, "delivery log not written, keeping it for later: %s",
                          qPrintable(r.error().message));
            m_logFailing = true;
            m_logRetry.setRemainingTime(1000);
            for (const DeliveryEvent &e : part)
                m_logBytes += logFootprint(e);
            m_logBuffer = part + m_logBuffer;
            trimLog();
        });
}

// Past either bound, the oldest deliveries kept are dropped, and the log says so once.
void IdempotencyEngine::trimLog()
{
    qsizetype drop = 0;
    qint64 bytes = m_logBytes;
    while (drop < m_logBuffer.size() &&
           (m_logBuffer.size() - drop > kLogBacklog || bytes > kLogBacklogBytes))
        bytes -= logFootprint(m_logBuffer.at(drop++));
    if (drop == 0)
        return;
    m_logBuffer.remove(0, drop);
    m_logBytes = bytes;
    if (!std::exchange(m_logDropping, true))
        qCWarning(lcEngine,
                  "delivery log: the store has refused it for so long that the oldest "
                  "deliveries kept for it are dropped (more than %d, or %lld MB)",
                  kLogBacklog, kLogBacklogBytes >> 20);
}

// One mismatch body more for the delivery log, within kPayloadsPerMinute (a token bucket)?
bool IdempotencyEngine::keepPayload()
{
    return m_payloads.take(monotonicUs() / 1000);
}

void IdempotencyEngine::purge()
{
    m_pool->submit<qint64>(
        this, [](IdempotencyStore &store) { return store.purgeExpired(); },
        [](Result<qint64> r) {
            if (!r)
                qCWarning(lcEngine, "purge of expired keys failed: %s", qPrintable(r.error().message));
        });
}

} // namespace idem
