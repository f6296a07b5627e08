#include "processing/processor.h"

#include "http/httptypes.h"
#include "util/format.h"

#include <QDateTime>
#include <QNetworkAccessManager>
#include <QNetworkReply>
#include <QPointer>
#include <QRandomGenerator>
#include <QTimer>

#include <memory>

namespace idem {

namespace {

StoredResult problemResult(int status, const QString &title, const QString &detail)
{
    const HttpResponse p = HttpResponse::problem(status, title, detail);
    return {p.status, p.headers, p.body};
}

ProcessResult timedOut(const QString &what, qint64 deadlineMs)
{
    ProcessResult result;
    result.error = u"%1 did not answer within %2 ms (forward_timeout_seconds)"_qs.arg(what).arg(deadlineMs);
    result.response = problemResult(504, u"Downstream timeout"_qs, result.error);
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

ForwardProcessor::ForwardProcessor(QUrl target, qint64 maxResponseBytes, QObject *parent)
    : Processor(parent), m_target(std::move(target)), m_maxResponseBytes(maxResponseBytes),
      m_network(new QNetworkAccessManager(this))
{
    m_network->setAutoDeleteReplies(true);
}

ForwardProcessor::~ForwardProcessor() = default;

void ForwardProcessor::run(const ProcessJob &job, Done done)
{
    QNetworkRequest forward(m_target);
    QByteArray forwardedFor;
    for (const auto &[name, value] : job.request.headers)
        if (name.compare("X-Forwarded-For", Qt::CaseInsensitive) == 0)
            forwardedFor = forwardedFor.isEmpty() ? value : forwardedFor + ", " + value;
    for (const auto &[name, value] : forwardedHeaders(job.request.headers)) {
        // A header sent twice reaches the app twice, as sent (joined, as HTTP allows).
        const QByteArray before = forward.rawHeader(name);
        forward.setRawHeader(name, before.isEmpty() ? value : before + ", " + value);
    }
    if (!job.key.isEmpty())
        forward.setRawHeader("Idempotency-Key", job.key.toLatin1());
    if (!job.fencingToken.isEmpty())
        forward.setRawHeader("Idempotency-Fencing-Token", job.fencingToken);
    if (!job.peer.isNull()) {
        const QByteArray peer = job.peer.toString().toLatin1();
        forward.setRawHeader("X-Forwarded-For", forwardedFor.isEmpty() ? peer : forwardedFor + ", " + peer);
    }
    if (!forward.hasRawHeader("Content-Type"))
        forward.setRawHeader("Content-Type", "application/octet-stream");
    if (!forward.hasRawHeader("User-Agent"))
        forward.setRawHeader("User-Agent", QByteArrayLiteral("idemdesk/" IDEM_VERSION));
    // Qt asks for gzip unless told: an encoded answer would be stored decoded under its
    // Content-Encoding header, so ask for the body as it is unless the sender asked otherwise.
    if (!forward.hasRawHeader("Accept-Encoding"))
        forward.setRawHeader("Accept-Encoding", "identity");
    forward.setAttribute(QNetworkRequest::Http2AllowedAttribute, false);
    forward.setAttribute(QNetworkRequest::RedirectPolicyAttribute, QNetworkRequest::ManualRedirectPolicy);
    // Every delivery stands alone: nothing of one reaches another through cookies or a cache.
    forward.setAttribute(QNetworkRequest::CookieLoadControlAttribute, QNetworkRequest::Manual);
    forward.setAttribute(QNetworkRequest::CookieSaveControlAttribute, QNetworkRequest::Manual);
    forward.setAttribute(QNetworkRequest::CacheLoadControlAttribute, QNetworkRequest::AlwaysNetwork);
    forward.setAttribute(QNetworkRequest::CacheSaveControlAttribute, false);

    QNetworkReply *reply = m_network->post(forward, job.request.body);
    const QString target = displayUrl(m_target); // never the user info, in answers, logs or the store
    const qint64 maxBytes = m_maxResponseBytes;
    // Shared by the reply's handlers: what was read, and why the reply was cut short.
    struct State
    {
        QByteArray body;
        QString abortReason; // "timeout" or "too large"
        bool done = false;
    };
    auto state = std::make_shared<State>();
    auto *deadline = new QTimer(reply);
    deadline->setSingleShot(true);
    connect(deadline, &QTimer::timeout, reply, [reply, state] {
        state->abortReason = u"timeout"_qs;
        reply->abort();
    });
    deadline->start(int(std::clamp<qint64>(job.deadlineMs, 0, std::numeric_limits<int>::max())));
    connect(reply, &QNetworkReply::readyRead, reply, [reply, state, maxBytes] {
        if (!state->abortReason.isEmpty())
            return;
        if (state->body.size() + reply->bytesAvailable() > maxBytes) {
            state->abortReason = u"too large"_qs;
            reply->abort();
            return;
        }
        state->body += reply->readAll();
    });
    connect(reply, &QNetworkReply::finished, this, [reply, done, target, state, maxBytes, deadlineMs = job.deadlineMs] {
        if (state->done)
            return;
        state->done = true;
        ProcessResult result;
        const QVariant statusAttr = reply->attribute(QNetworkRequest::HttpStatusCodeAttribute);
        if (state->abortReason == u"timeout"_qs) {
            result = timedOut(u"the downstream %1"_qs.arg(target), deadlineMs);
        } else if (state->abortReason == u"too large"_qs) {
            result.error = u"the downstream %1 answered more than %2 bytes (max_response_bytes)"_qs.arg(target).arg(maxBytes);
            result.response = problemResult(502, u"Downstream answer too large"_qs, result.error);
        } else if (statusAttr.isValid() && reply->error() != QNetworkReply::OperationCanceledError) {
            state->body += reply->readAll();
            if (state->body.size() > maxBytes) {
                result.error = u"the downstream %1 answered more than %2 bytes (max_response_bytes)"_qs.arg(target).arg(maxBytes);
                result.response = problemResult(502, u"Downstream answer too large"_qs, result.error);
            } else {
                result.response.status = statusAttr.toInt();
                for (const auto &[name, value] : reply->rawHeaderPairs())
                    if (!isHopByHopHeader(name) && name.compare("Date", Qt::CaseInsensitive) != 0
                        && name.compare("Set-Cookie", Qt::CaseInsensitive) != 0)
                        result.response.headers.append({name, value});
                result.response.body = std::move(state->body);
                result.success = result.response.status >= 200 && result.response.status < 300;
                if (!result.success)
                    result.error = u"the downstream answered %1"_qs.arg(result.response.status);
            }
        } else {
            result.error = u"the downstream %1 is unreachable: %2"_qs.arg(target, reply->errorString().replace(reply->url().toString(), target));
            result.response = problemResult(502, u"Downstream unreachable"_qs, result.error);
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
                200, {{u"processed"_qs, true}, {u"key"_qs, key},
                      {u"processed_at"_qs, QDateTime::currentDateTimeUtc().toString(Qt::ISODateWithMs)}});
            result.success = true;
            result.response = {r.status, r.headers, r.body};
        }
        done(std::move(result));
    };
    if (m_spec.delayMs > job.deadlineMs) {
        QTimer::singleShot(job.deadlineMs, this, [done, deadlineMs = job.deadlineMs] {
            done(timedOut(u"the simulated processor"_qs, deadlineMs));
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
