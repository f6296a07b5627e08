#include "engine/engine.h"

#include "providers/provider.h"

#include <QCryptographicHash>
#include <QDateTime>
#include "util/clock.h"

#include <QLoggingCategory>

#include <cmath>

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
constexpr int kLogBacklog = 50000; // deliveries kept in memory while the store is away

} // namespace

struct IdempotencyEngine::Delivery
{
    HttpRequest request;
    Responder responder;
    const EndpointConfig *endpoint = nullptr;
    QString key;
    qint64 startUs = 0;
};

IdempotencyEngine::IdempotencyEngine(Config config, std::shared_ptr<StorePool> pool,
                                     QString instance, QObject *parent)
    : QObject(parent), m_config(std::move(config)), m_pool(std::move(pool)),
      m_instance(std::move(instance))
{
    qRegisterMetaType<idem::DeliveryEvent>();
    for (const auto &e : m_config.endpoints) {
        Processor *processor = makeProcessor(e).release();
        processor->setParent(this); // moves with the engine to the receiver thread
        m_processors.emplace(e.name, processor);
    }
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
    if (path == "/healthz") {
        const StoreHealth health = m_pool->health();
        HttpResponse r = HttpResponse::json(health.healthy ? 200 : 503,
                                            {{u"status"_qs, health.healthy ? u"ok"_qs : u"store unavailable"_qs},
                                             {u"in_flight"_qs, m_inFlight.load() - 1}});
        d->responder.send(r);
        --m_inFlight;
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
    const Provider *provider = providerFor(e.provider);
    if (auto verified = provider->verify(d->request, e, nowMs() / 1000); !verified)
        return reject(d, 401, u"Signature check failed"_qs, verified.error().message);

    const KeyExtraction extracted = provider->extractKey(d->request, e);
    if (extracted.kind == KeyExtraction::Kind::Missing && e.settings.passthroughMissingKey) {
        // No key, and the endpoint lets such deliveries through without deduplication.
        ++m_processorRuns;
        m_processors.at(e.name)->run(QString(), {d->request.method, d->request.target,
                                                 d->request.headers, d->request.body},
                                     [this, d](ProcessResult result) {
                                         respond(d, fromStored(result.response), Outcome::Processed,
                                                 0, u"passthrough (no key)"_qs);
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
    claim.fingerprint = QCryptographicHash::hash(d->request.body, QCryptographicHash::Sha256).toHex();
    claim.request = {d->request.method, d->request.target, d->request.headers, d->request.body};
    claim.policy = e.settings.claimPolicy();
    claim.nowMs = nowMs();
    m_pool->submit<ClaimResult>(
        this, [claim](IdempotencyStore &store) { return store.claim(claim); },
        [this, d](Result<ClaimResult> result) { onClaimed(d, std::move(result)); });
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
    if (!result) {
        HttpResponse r = HttpResponse::problem(
            503, u"Store unavailable"_qs,
            u"the idempotency store could not be reached, so nothing was processed; retry later (%1)"_qs
                .arg(result.error().message));
        r.setHeader("Retry-After", "5");
        return respond(d, r, Outcome::Unavailable, 0, result.error().message);
    }
    const ClaimResult &claim = *result;
    const EndpointSettings &settings = d->endpoint->settings;
    switch (claim.decision.action) {
    case ClaimAction::Create:
    case ClaimAction::Reclaim:
        return runProcessor(d, claim.record.token, claim.decision.outcome);
    case ClaimAction::Replay: {
        HttpResponse r = fromStored(claim.record.result);
        r.setHeader("Idempotent-Replayed", "true");
        return respond(d, r, Outcome::Replayed, claim.record.token);
    }
    case ClaimAction::InProgress: {
        const qint64 leftMs = std::max<qint64>(0, claim.record.leaseUntilMs - nowMs());
        // The lease bounds the wait; the answer is usually ready much sooner.
        const qint64 retryAfter = std::clamp<qint64>((leftMs + 999) / 1000, 1, 10);
        HttpResponse r = HttpResponse::problem(
            settings.inProgressStatus, u"Delivery in progress"_qs,
            u"this event is being processed by an earlier delivery; retry in %1 s to get its result"_qs
                .arg(retryAfter));
        r.setHeader("Retry-After", QByteArray::number(retryAfter));
        return respond(d, r, Outcome::InProgress, claim.record.token);
    }
    case ClaimAction::Mismatch: {
        HttpResponse r = HttpResponse::problem(
            422, u"Idempotency key reused with a different payload"_qs,
            u"the key %1 was first seen with a body of SHA-256 %2; this body differs, so it was not processed"_qs
                .arg(d->key, QString::fromLatin1(claim.record.fingerprint)));
        return respond(d, r, Outcome::Mismatch, claim.record.token);
    }
    }
}

void IdempotencyEngine::runProcessor(const DeliveryPtr &d, qint64 token, Outcome outcome)
{
    ++m_processorRuns;
    m_processors.at(d->endpoint->name)
        ->run(d->key, {d->request.method, d->request.target, d->request.headers, d->request.body},
              [this, d, token, outcome](ProcessResult result) {
                  onProcessed(d, token, outcome, std::move(result));
              });
}

void IdempotencyEngine::onProcessed(const DeliveryPtr &d, qint64 token, Outcome outcome,
                                    ProcessResult processed)
{
    FinishRequest finish;
    finish.key = d->key;
    finish.token = token;
    finish.state = processed.success ? KeyState::Completed : KeyState::Failed;
    finish.result = processed.response;
    finish.error = processed.error;
    finish.nowMs = nowMs();
    m_pool->submit<FinishVerdict>(
        this, [finish](IdempotencyStore &store) { return store.finish(finish); },
        [this, d, token, outcome, processed](Result<FinishVerdict> verdict) {
            if (!verdict) {
                // The processing happened but its result is not recorded: the sender must retry,
                // and the key is reclaimed (recovered) once its lease ends.
                HttpResponse r = HttpResponse::problem(
                    503, u"Result not recorded"_qs,
                    u"the event was processed but the store did not record the result (%1); it will be recovered after the lease"_qs
                        .arg(verdict.error().message));
                r.setHeader("Retry-After", "5");
                return respond(d, r, Outcome::Unavailable, token, verdict.error().message);
            }
            if (*verdict != FinishVerdict::Accept) {
                HttpResponse r = HttpResponse::problem(
                    409, u"Claim superseded"_qs,
                    u"this delivery's lease was taken over by a newer claim, whose result wins (%1)"_qs
                        .arg(toString(*verdict)));
                r.setHeader("Retry-After", "1");
                return respond(d, r, Outcome::InProgress, token, u"late completion refused"_qs);
            }
            respond(d, fromStored(processed.response), outcome, token,
                    processed.success ? QString() : processed.error);
        });
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
    d->responder.send(response);

    DeliveryEvent event;
    event.atMs = nowMs();
    event.endpoint = d->endpoint ? d->endpoint->name : QString();
    event.key = d->key;
    event.outcome = outcome;
    event.status = response.status;
    event.latencyUs = monotonicUs() - d->startUs;
    event.token = token;
    event.instance = m_instance;
    event.detail = detail;
    ++m_outcomes[size_t(outcome)];
    --m_inFlight;
    if (!event.endpoint.isEmpty()) {
        m_logBuffer.append(event);
        if (m_logBuffer.size() >= kLogBatch)
            flushLog();
    }
    Q_EMIT delivered(event);
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
            const qint64 now = nowMs();
            auto existing = store.key(key, now);
            if (!existing)
                return existing.error();
            if (!existing->has_value())
                return makeError(ErrorCode::NotFound, u"no key %1"_qs.arg(key));
            const KeyRecord &record = **existing;
            if (!policies.contains(record.endpoint))
                return makeError(ErrorCode::NotFound,
                                 u"%1: endpoint \"%2\" is not in the config, so its processor is unknown"_qs
                                     .arg(key, record.endpoint));
            if (record.state != KeyState::Reset) {
                auto verdict = store.applyOperator(key, OperatorAction::Reset, force, u"operator retry"_qs, now);
                if (!verdict)
                    return verdict.error();
                if (*verdict == OperatorVerdict::WrongState)
                    return makeError(ErrorCode::Conflict,
                                     u"%1 is %2: not retried (--force retries it anyway)"_qs.arg(key, toString(record.state)));
                if (*verdict == OperatorVerdict::Missing)
                    return makeError(ErrorCode::NotFound, u"no key %1"_qs.arg(key));
            }
            ClaimRequest claim;
            claim.key = key;
            claim.endpoint = record.endpoint;
            claim.provider = record.provider;
            claim.fingerprint = record.fingerprint;
            claim.request = record.request;
            claim.policy = policies.value(record.endpoint);
            claim.nowMs = now;
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
            d->key = record.key;
            d->endpoint = m_config.endpoint(record.endpoint);
            ++m_processorRuns;
            m_processors.at(record.endpoint)->run(record.key, record.request, [this, d, record, done](ProcessResult processed) {
                FinishRequest finish;
                finish.key = record.key;
                finish.token = record.token;
                finish.state = processed.success ? KeyState::Completed : KeyState::Failed;
                finish.result = processed.response;
                finish.error = processed.error;
                finish.nowMs = nowMs();
                m_pool->submit<FinishVerdict>(
                    this, [finish](IdempotencyStore &store) { return store.finish(finish); },
                    [this, d, record, processed, done](Result<FinishVerdict> verdict) {
                        respond(d, fromStored(processed.response), Outcome::Reprocessed, record.token,
                                u"operator retry"_qs);
                        if (!verdict)
                            return done(verdict.error());
                        if (*verdict != FinishVerdict::Accept)
                            return done(makeError(ErrorCode::Conflict,
                                                  u"%1: the result was not stored (%2)"_qs.arg(record.key, toString(*verdict))));
                        done(RetryOutcome{record.key, Outcome::Reprocessed, processed.success,
                                          processed.response, processed.error});
                    });
            });
        });
}

void IdempotencyEngine::flushLog()
{
    if (m_logBuffer.isEmpty() || m_logInFlight)
        return;
    QList<DeliveryEvent> batch;
    batch.swap(m_logBuffer);
    m_logInFlight = true;
    m_pool->submit<Ok>(
        this,
        [batch](IdempotencyStore &store) -> Result<Ok> {
            if (auto r = store.appendDeliveries(batch); !r)
                return r.error();
            return Ok{};
        },
        [this, batch](Result<Ok> r) {
            m_logInFlight = false;
            if (r) {
                if (m_logFailing)
                    qCInfo(lcEngine, "delivery log written again");
                m_logFailing = false;
                return;
            }
            // Kept for the next flush while the store is away, up to a bound.
            if (!m_logFailing)
                qCWarning(lcEngine, "delivery log not written, keeping it for later: %s",
                          qPrintable(r.error().message));
            m_logFailing = true;
            if (m_logBuffer.size() + batch.size() <= kLogBacklog)
                m_logBuffer = batch + m_logBuffer;
        });
}

void IdempotencyEngine::purge()
{
    m_pool->submit<qint64>(
        this, [](IdempotencyStore &store) { return store.purgeExpired(nowMs()); },
        [](Result<qint64> r) {
            if (!r)
                qCWarning(lcEngine, "purge of expired keys failed: %s", qPrintable(r.error().message));
        });
}

} // namespace idem
