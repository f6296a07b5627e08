#include "engine/engine.h"

#include "providers/provider.h"
#include "util/format.h"

#include <QCryptographicHash>
#include <QJsonArray>
#include <QJsonDocument>
#include <QSet>
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

// The store could not claim: nothing was processed, the sender should come back.
HttpResponse storeUnavailable(const QString &why)
{
    HttpResponse r = HttpResponse::problem(
        503, u"Store unavailable"_qs,
        u"the idempotency store could not be reached, so nothing was processed; retry later (%1)"_qs.arg(why));
    r.setHeader("Retry-After", "5");
    return r;
}

// Processed, but the result could not be recorded: the key is recovered after its lease.
HttpResponse resultNotRecorded(const QString &why)
{
    HttpResponse r = HttpResponse::problem(
        503, u"Result not recorded"_qs,
        u"the event was processed but the store did not record the result (%1); it will be recovered after the lease"_qs.arg(why));
    r.setHeader("Retry-After", "5");
    return r;
}
constexpr int kLogBacklog = 50000; // deliveries kept in memory while the store is away

} // namespace

struct IdempotencyEngine::Delivery
{
    HttpRequest request;
    Responder responder;
    const EndpointConfig *endpoint = nullptr;
    QString key;
    QString note; // the provider's: Slack's retry number, Shopify's event id, ...
    QByteArray payload; // kept in the delivery log for a mismatch
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
    if (auto direct = provider->directAnswer(d->request)) {
        d->responder.send(*direct);
        --m_inFlight;
        return;
    }
    d->note = provider->note(d->request);
    if (provider->isBatch())
        return handleBatch(d, provider);

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
    // The stored request keeps no secrets (Authorization, signatures): the live delivery is
    // forwarded with them, an operator's retry of the stored one without.
    claim.request = {d->request.method, d->request.target, maskSecrets(d->request.headers), d->request.body};
    claim.policy = e.settings.claimPolicy();
    claim.nowMs = nowMs();
    lane().claim(claim, [this, d](Result<ClaimResult> result) { onClaimed(d, std::move(result)); });
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
        d->payload = d->request.body.left(64 * 1024);
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
    lane().finish(
        finish, [this, d, token, outcome, processed](Result<FinishVerdict> verdict) {
            if (!verdict) // the sender must retry; the key is recovered once its lease ends
                return respond(d, resultNotRecorded(verdict.error().message), Outcome::Unavailable, token,
                               verdict.error().message);
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
    --m_inFlight;
    record(d, d->key, outcome, response.status, token, detail);
}

void IdempotencyEngine::record(const DeliveryPtr &d, const QString &key, Outcome outcome, int status,
                               qint64 token, const QString &detail)
{
    DeliveryEvent event;
    event.latencyUs = monotonicUs() - d->startUs;
    event.atMs = nowMs() - event.latencyUs / 1000; // when it arrived: the timeline's order
    event.endpoint = d->endpoint ? d->endpoint->name : QString();
    event.key = key;
    event.outcome = outcome;
    event.status = status;
    event.token = token;
    event.instance = m_instance;
    event.detail = d->note.isEmpty() ? detail : detail.isEmpty() ? d->note : d->note + u"; "_qs + detail;
    event.payload = d->payload;
    ++m_outcomes[size_t(outcome)];
    if (!event.endpoint.isEmpty()) {
        m_logBuffer.append(event);
        if (m_logBuffer.size() >= kLogBatch)
            flushLog();
    }
    Q_EMIT delivered(event);
}

// SendGrid-style batches (SPEC §4): each element is its own key; only the elements not yet
// completed are forwarded, as one array; the answer is 2xx only when every element is completed.
void IdempotencyEngine::handleBatch(const DeliveryPtr &d, const Provider *provider)
{
    auto elements = provider->splitBatch(d->request);
    if (!elements)
        return reject(d, 400, u"Malformed batch"_qs, elements.error().message);
    const EndpointConfig &e = *d->endpoint;
    QList<ClaimRequest> claims;
    QList<QJsonValue> bodies;
    QSet<QString> seen;
    for (const BatchElement &element : *elements) {
        auto key = namespacedKey(e.name, element.key);
        if (!key)
            return reject(d, 400, u"Invalid idempotency key"_qs, key.error().message);
        if (seen.contains(*key))
            continue; // the same event twice in one batch: once is enough
        seen.insert(*key);
        ClaimRequest claim;
        claim.key = *key;
        claim.endpoint = e.name;
        claim.provider = e.provider;
        claim.fingerprint = element.fingerprint;
        claim.request = {d->request.method, d->request.target, maskSecrets(d->request.headers),
                         QJsonDocument(QJsonArray{element.element}).toJson(QJsonDocument::Compact)};
        claim.policy = e.settings.claimPolicy();
        claim.nowMs = nowMs();
        claims.append(claim);
        bodies.append(element.element);
    }
    d->key = claims.size() == 1 ? claims.first().key : QString();
    m_pool->submit<QList<ClaimResult>>(
        this,
        [claims](IdempotencyStore &store) -> Result<QList<ClaimResult>> {
            QList<ClaimResult> results;
            for (const ClaimRequest &claim : claims) {
                auto r = store.claim(claim);
                if (!r)
                    return r.error(); // claims made so far stay processing until their lease ends
                results.append(*r);
            }
            return results;
        },
        [this, d, claims, bodies](Result<QList<ClaimResult>> results) {
            if (!results)
                return respond(d, storeUnavailable(results.error().message), Outcome::Unavailable, 0,
                               results.error().message);
            QJsonArray forward;
            QStringList forwardKeys;
            QList<qsizetype> claimedIndexes;
            for (qsizetype i = 0; i < results->size(); ++i)
                if (results->at(i).claimed()) {
                    forward.append(bodies.at(i));
                    forwardKeys.append(claims.at(i).key);
                    claimedIndexes.append(i);
                }
            if (forward.isEmpty())
                return finishBatch(d, claims, *results, {}, {});
            StoredRequest request{d->request.method, d->request.target, d->request.headers,
                                  QJsonDocument(forward).toJson(QJsonDocument::Compact)};
            ++m_processorRuns;
            m_processors.at(d->endpoint->name)
                ->run(forwardKeys.join(u","_qs), request, [this, d, claims, results = *results, claimedIndexes](ProcessResult processed) {
                    QList<FinishRequest> finishes;
                    for (qsizetype i : claimedIndexes) {
                        FinishRequest f;
                        f.key = claims.at(i).key;
                        f.token = results.at(i).record.token;
                        f.state = processed.success ? KeyState::Completed : KeyState::Failed;
                        f.result = processed.response;
                        f.error = processed.error;
                        f.nowMs = nowMs();
                        finishes.append(f);
                    }
                    m_pool->submit<QList<FinishVerdict>>(
                        this,
                        [finishes](IdempotencyStore &store) -> Result<QList<FinishVerdict>> {
                            QList<FinishVerdict> verdicts;
                            for (const FinishRequest &f : finishes) {
                                auto v = store.finish(f);
                                if (!v)
                                    return v.error();
                                verdicts.append(*v);
                            }
                            return verdicts;
                        },
                        [this, d, claims, results, processed](Result<QList<FinishVerdict>> verdicts) {
                            if (!verdicts)
                                return respond(d, resultNotRecorded(verdicts.error().message), Outcome::Unavailable,
                                               0, verdicts.error().message);
                            finishBatch(d, claims, results, processed, *verdicts);
                        });
                });
        });
}

void IdempotencyEngine::finishBatch(const DeliveryPtr &d, const QList<ClaimRequest> &claims,
                                    const QList<ClaimResult> &results, const ProcessResult &processed,
                                    const QList<FinishVerdict> &verdicts)
{
    int completed = 0, processedNow = 0, inProgress = 0, mismatched = 0;
    qint64 leaseLeftMs = 0;
    std::optional<StoredResult> failure; // the first stored or fresh failure
    qsizetype v = 0;
    for (const ClaimResult &r : results) {
        if (r.claimed()) {
            const bool stored = v < verdicts.size() && verdicts.at(v++) == FinishVerdict::Accept;
            ++processedNow;
            if (processed.success && stored)
                ++completed;
            else if (!failure)
                failure = processed.response;
        } else if (r.decision.action == ClaimAction::Replay) {
            if (r.record.state == KeyState::Completed)
                ++completed;
            else if (!failure)
                failure = r.record.result;
        } else if (r.decision.action == ClaimAction::InProgress) {
            ++inProgress;
            leaseLeftMs = std::max(leaseLeftMs, r.record.leaseUntilMs - nowMs());
        } else {
            ++mismatched;
        }
    }
    const int total = int(results.size());
    HttpResponse response;
    Outcome outcome = processedNow ? Outcome::Processed : Outcome::Replayed;
    if (completed == total) {
        response = HttpResponse::json(200, {{u"events"_qs, total}, {u"processed"_qs, processedNow},
                                            {u"replayed"_qs, total - processedNow}});
        if (!processedNow)
            response.setHeader("Idempotent-Replayed", "true");
    } else if (failure) {
        response = fromStored(*failure);
    } else if (mismatched) {
        response = HttpResponse::problem(422, u"Idempotency key reused with a different payload"_qs,
                                         u"%1 of the %2 events reuse an sg_event_id with a different body; they were not processed"_qs
                                             .arg(mismatched).arg(total));
        outcome = Outcome::Mismatch;
    } else {
        const qint64 retryAfter = std::clamp<qint64>((leaseLeftMs + 999) / 1000, 1, 10);
        response = HttpResponse::problem(d->endpoint->settings.inProgressStatus, u"Delivery in progress"_qs,
                                         u"%1 of the %2 events are being processed by an earlier delivery; retry in %3 s"_qs
                                             .arg(inProgress).arg(total).arg(retryAfter));
        response.setHeader("Retry-After", QByteArray::number(retryAfter));
        outcome = Outcome::InProgress;
    }
    QStringList keys;
    for (const ClaimRequest &c : claims)
        keys << c.key;
    response.setHeader("Idempotency-Key", (keys.size() > 10 ? keys.mid(0, 10).join(u","_qs) + u",…"_qs : keys.join(u","_qs)).toLatin1());
    response.setHeader("Idempotency-Outcome", toString(outcome).toLatin1());
    d->responder.send(response);
    --m_inFlight;
    const QString detail = u"batch of %1"_qs.arg(total);
    for (qsizetype i = 0; i < results.size(); ++i)
        record(d, claims.at(i).key, results.at(i).decision.outcome, response.status, results.at(i).record.token, detail);
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
