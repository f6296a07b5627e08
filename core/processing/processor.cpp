#include "processing/processor.h"

#include "http/forwardclient.h"
#include "http/httptypes.h"
#include "util/format.h"

#include <QDateTime>
#include <QRandomGenerator>
#include <QTimer>

#include <algorithm>
#include <memory>

namespace idem {

namespace {

StoredResult problemResult(int status, const QString &title, const QString &detail)
{
    const HttpResponse p = HttpResponse::problem(status, title, detail);
    return {p.status, p.headers, p.body};
}

// What the sender and the log are told when the app got the request but no usable answer
// came back (ProcessResult::outcomeUnknown).
QString leftToItsLease(const QString &error)
{
    return error +
           u"; the app may have acted on it (or still be acting): the key stays in progress "
           u"until its lease ends, then the next delivery runs it again"_qs;
}

// `reached`: the request went out (the connection stood) and no final status came back, so the
// app may be at work on it.
ProcessResult timedOut(const QString &what, qint64 deadlineMs, bool reached)
{
    ProcessResult result;
    result.error = u"%1 did not answer within %2 ms (forward_timeout_seconds)"_qs.arg(what).arg(deadlineMs);
    result.outcomeUnknown = reached;
    if (reached)
        result.error = leftToItsLease(result.error);
    result.response = problemResult(504, u"Downstream timeout"_qs, result.error);
    return result;
}

// A failure of the app's. The operator's error (the log, the stored error, the history, the
// delivery log) names the downstream by its redacted URL and says `why` in full; the sender's
// answer, stored and replayed to every duplicate, says "the app at forward_to" and `what`
// alone: forward_to and what the network says of it (a host name) are the operator's, and its
// query may hold the app's API key.
ProcessResult appFailed(int status, const QString &title, const QString &target,
                        const QString &what, const QString &why = {}, bool outcomeUnknown = false)
{
    ProcessResult result;
    result.error = u"the downstream %1 %2"_qs.arg(target, what);
    if (!why.isEmpty())
        result.error += u": "_qs + why;
    QString told = u"the app at forward_to "_qs + what;
    result.outcomeUnknown = outcomeUnknown;
    if (outcomeUnknown) {
        result.error = leftToItsLease(result.error);
        told = leftToItsLease(told);
    }
    result.response = problemResult(status, title, told);
    return result;
}

} // namespace

bool isHopByHopHeader(QByteArrayView name)
{
    static const char *const names[] = {"connection", "keep-alive", "transfer-encoding", "te",
                                        "upgrade", "proxy-connection", "proxy-authorization",
                                        "proxy-authenticate", "expect", "content-length", "host",
                                        "trailer"};
    for (const char *n : names)
        if (name.compare(QByteArrayView(n), Qt::CaseInsensitive) == 0)
            return true;
    return false;
}

HeaderList forwardedHeaders(const HeaderList &original)
{
    // Headers the Connection header names are hop-by-hop too (RFC 9110 §7.6.1).
    QList<QByteArray> named;
    for (const auto &[name, value] : original)
        if (name.compare("Connection", Qt::CaseInsensitive) == 0)
            for (const QByteArray &token : value.split(','))
                named.append(token.trimmed().toLower());
    HeaderList kept;
    for (const auto &[name, value] : original) {
        if (isHopByHopHeader(name) || named.contains(name.toLower())
            || name.compare("Idempotency-Key", Qt::CaseInsensitive) == 0
            || name.compare("Idempotency-Fencing-Token", Qt::CaseInsensitive) == 0
            || name.compare("X-Forwarded-For", Qt::CaseInsensitive) == 0)
            continue;
        kept.append({name, value});
    }
    return kept;
}

QByteArray newViaEntry()
{
    quint64 pseudonym[2];
    QRandomGenerator::system()->fillRange(pseudonym);
    return "1.1 idemdesk-" +
           QByteArray(reinterpret_cast<const char *>(pseudonym), sizeof pseudonym).toHex();
}

bool passedThrough(const HeaderList &headers, const QByteArray &entry)
{
    for (const auto &[name, value] : headers)
        if (name.compare("Via", Qt::CaseInsensitive) == 0)
            for (const QByteArray &e : value.split(','))
                if (e.trimmed() == entry)
                    return true;
    return false;
}

ForwardProcessor::ForwardProcessor(QUrl target, qint64 maxResponseBytes, QObject *parent)
    : Processor(parent), m_target(std::move(target)), m_maxResponseBytes(maxResponseBytes)
{}

ForwardProcessor::~ForwardProcessor() = default;

HeaderList ForwardProcessor::requestHeaders(const ProcessJob &job) const
{
    HeaderList headers = forwardedHeaders(job.request.headers);
    auto has = [&headers](QByteArrayView name) {
        return std::any_of(headers.cbegin(), headers.cend(), [name](const auto &h) {
            return h.first.compare(name, Qt::CaseInsensitive) == 0;
        });
    };
    auto add = [&headers](const char *name, const QByteArray &value) { headers.append({QByteArray(name), value}); };
    if (!job.key.isEmpty())
        add("Idempotency-Key", job.key.toLatin1());
    if (!job.fencingToken.isEmpty())
        add("Idempotency-Fencing-Token", job.fencingToken);
    if (!job.peer.isNull()) {
        // Appended to what the sender says, as proxies do (the sender's part is not checked).
        QByteArray forwardedFor;
        for (const auto &[name, value] : job.request.headers)
            if (name.compare("X-Forwarded-For", Qt::CaseInsensitive) == 0)
                forwardedFor = forwardedFor.isEmpty() ? value : forwardedFor + ", " + value;
        const QByteArray peer = job.peer.toString().toLatin1();
        add("X-Forwarded-For", forwardedFor.isEmpty() ? peer : forwardedFor + ", " + peer);
    }
    if (!job.via.isEmpty())
        add("Via", job.via); // after the sender's own Via lines, which are kept
    if (!has("Content-Type"))
        add("Content-Type", "application/octet-stream");
    if (!has("User-Agent"))
        add("User-Agent", QByteArrayLiteral("idemdesk/" IDEM_VERSION));
    // User info in forward_to is the app's credential: sent as Basic authentication unless the
    // sender authenticates itself (its Authorization goes through untouched).
    if (!m_target.userName().isEmpty() && !has("Authorization")) {
        const QByteArray userInfo = m_target.userName(QUrl::FullyDecoded).toUtf8() + ':'
                                    + m_target.password(QUrl::FullyDecoded).toUtf8();
        add("Authorization", "Basic " + userInfo.toBase64());
    }
    // No Accept-Encoding or Accept-Language the sender did not send: the app's answer is stored
    // and replayed as it comes, so the desk asks for nothing on the sender's behalf.
    return headers;
}

void ForwardProcessor::run(const ProcessJob &job, Done done)
{
    ForwardRequest request;
    request.url = m_target;
    request.headers = requestHeaders(job);
    request.body = job.request.body;
    request.deadlineMs = job.deadlineMs;
    request.maxResponseBytes = m_maxResponseBytes;
    const QString target = redactedUrl(m_target); // for the operator, never the sender
    const qint64 maxBytes = m_maxResponseBytes;
    const qint64 deadlineMs = job.deadlineMs;
    forwardRequest(std::move(request), this, [done, target, maxBytes, deadlineMs](ForwardOutcome outcome) {
        using Kind = ForwardOutcome::Kind;
        ProcessResult result;
        switch (outcome.kind) {
        case Kind::Answered:
            if (outcome.status < 200 || outcome.status > 599) {
                // No final status a sender can read ("HTTP/1.1 099"): neither passed on nor stored.
                result = appFailed(502, u"Bad downstream answer"_qs, target,
                                   u"answered the invalid status %1"_qs.arg(outcome.status));
                break;
            }
            result.response.status = outcome.status;
            // Not the desk's own answer headers either: an app's Idempotent-Replayed: true would
            // tell the sender of a first answer that it was a replay.
            for (const auto &[name, value] : outcome.headers)
                if (!isHopByHopHeader(name) && name.compare("Date", Qt::CaseInsensitive) != 0 &&
                    name.compare("Set-Cookie", Qt::CaseInsensitive) != 0 &&
                    name.compare("Idempotent-Replayed", Qt::CaseInsensitive) != 0 &&
                    name.compare("Idempotency-Outcome", Qt::CaseInsensitive) != 0)
                    result.response.headers.append({name, value});
            result.response.body = std::move(outcome.body);
            result.success = result.response.status >= 200 && result.response.status < 300;
            if (!result.success)
                result.error = u"the downstream answered %1"_qs.arg(result.response.status);
            break;
        case Kind::TimedOut:
            result = appFailed(
                504, u"Downstream timeout"_qs, target,
                u"did not answer within %1 ms (forward_timeout_seconds)"_qs.arg(deadlineMs), {},
                outcome.connected && !outcome.finalStatusRead);
            break;
        case Kind::TooLarge: // its status line read: the app is done
            result =
                appFailed(502, u"Downstream answer too large"_qs, target,
                          u"answered more than %1 bytes (max_response_bytes)"_qs.arg(maxBytes));
            break;
        case Kind::Unreachable:
            result = appFailed(502, u"Downstream unreachable"_qs, target,
                               u"is unreachable (%1)"_qs.arg(outcome.cause), outcome.error);
            break;
        case Kind::BrokenAnswer:
            // Broken before a final status line: the app may be at work on it still.
            result = appFailed(502, u"Bad downstream answer"_qs, target, u"gave no whole answer"_qs,
                               outcome.error, !outcome.finalStatusRead);
            break;
        }
        done(std::move(result));
    });
}

SimulatedProcessor::SimulatedProcessor(SimulateSpec spec, QObject *parent)
    : Processor(parent), m_spec(spec)
{}

void SimulatedProcessor::run(const ProcessJob &job, Done done)
{
    auto finish = [key = job.key, done, spec = m_spec] {
        ProcessResult result;
        if (spec.failRate > 0 && QRandomGenerator::global()->generateDouble() < spec.failRate) {
            result.error = u"simulated failure (fail_rate %1)"_qs.arg(spec.failRate);
            result.response = problemResult(500, u"Simulated failure"_qs, result.error);
        } else {
            const HttpResponse r = HttpResponse::json(
                200, {{u"processed"_qs, true},
                      {u"key"_qs, key},
                      {u"processed_at"_qs, formatTime(QDateTime::currentMSecsSinceEpoch())}});
            result.success = true;
            result.response = {r.status, r.headers, r.body};
        }
        done(std::move(result));
    };
    if (m_spec.delayMs > job.deadlineMs) {
        QTimer::singleShot(job.deadlineMs, this, [done, deadlineMs = job.deadlineMs] {
            done(timedOut(u"the simulated processor"_qs, deadlineMs, true));
        });
    } else if (m_spec.delayMs <= 0) {
        finish();
    } else {
        QTimer::singleShot(m_spec.delayMs, this, finish);
    }
}

std::unique_ptr<Processor> makeProcessor(const EndpointConfig &endpoint)
{
    if (endpoint.forwardTo.isValid() && !endpoint.forwardTo.isEmpty())
        return std::make_unique<ForwardProcessor>(endpoint.forwardTo, endpoint.settings.maxResponseBytes);
    return std::make_unique<SimulatedProcessor>(endpoint.simulate);
}

} // namespace idem
