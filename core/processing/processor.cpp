#include "processing/processor.h"

#include "http/httptypes.h"

#include <QDateTime>
#include <QNetworkAccessManager>
#include <QNetworkReply>
#include <QRandomGenerator>
#include <QTimer>

namespace idem {

bool isHopByHopHeader(QByteArrayView name)
{
    static const char *const names[] = {"connection", "keep-alive",   "transfer-encoding",
                                        "te",         "upgrade",      "proxy-connection",
                                        "expect",     "content-length", "host", "trailer"};
    for (const char *n : names)
        if (name.compare(QByteArrayView(n), Qt::CaseInsensitive) == 0)
            return true;
    return false;
}

ForwardProcessor::ForwardProcessor(QUrl target, qint64 timeoutMs, QObject *parent)
    : Processor(parent), m_target(std::move(target)), m_timeoutMs(timeoutMs),
      m_network(new QNetworkAccessManager(this))
{
    m_network->setAutoDeleteReplies(true);
}

ForwardProcessor::~ForwardProcessor() = default;

void ForwardProcessor::run(const QString &key, const StoredRequest &request, Done done)
{
    QNetworkRequest forward(m_target);
    for (const auto &[name, value] : request.headers) {
        if (isHopByHopHeader(name) || name.compare("Idempotency-Key", Qt::CaseInsensitive) == 0)
            continue;
        forward.setRawHeader(name, value);
    }
    forward.setRawHeader("Idempotency-Key", key.toLatin1());
    if (!forward.hasRawHeader("Content-Type"))
        forward.setRawHeader("Content-Type", "application/octet-stream");
    forward.setTransferTimeout(int(m_timeoutMs));
    forward.setAttribute(QNetworkRequest::Http2AllowedAttribute, false);
    forward.setAttribute(QNetworkRequest::RedirectPolicyAttribute, QNetworkRequest::ManualRedirectPolicy);

    QNetworkReply *reply = m_network->post(forward, request.body);
    const QString target = m_target.toString();
    const qint64 timeoutMs = m_timeoutMs;
    connect(reply, &QNetworkReply::finished, this, [reply, done, target, timeoutMs] {
        const QVariant statusAttr = reply->attribute(QNetworkRequest::HttpStatusCodeAttribute);
        ProcessResult result;
        if (statusAttr.isValid() && reply->error() != QNetworkReply::OperationCanceledError) {
            result.response.status = statusAttr.toInt();
            for (const auto &[name, value] : reply->rawHeaderPairs())
                if (!isHopByHopHeader(name) && name.compare("Date", Qt::CaseInsensitive) != 0)
                    result.response.headers.append({name, value});
            result.response.body = reply->readAll();
            result.success = result.response.status >= 200 && result.response.status < 300;
            if (!result.success)
                result.error = u"the downstream answered %1"_qs.arg(result.response.status);
        } else if (reply->error() == QNetworkReply::OperationCanceledError
                   || reply->error() == QNetworkReply::TimeoutError) {
            result.error = u"the downstream %1 did not answer within %2 ms"_qs.arg(target).arg(timeoutMs);
            const HttpResponse p = HttpResponse::problem(504, u"Downstream timeout"_qs, result.error);
            result.response = {p.status, p.headers, p.body};
        } else {
            result.error = u"the downstream %1 is unreachable: %2"_qs.arg(target, reply->errorString());
            const HttpResponse p = HttpResponse::problem(502, u"Downstream unreachable"_qs, result.error);
            result.response = {p.status, p.headers, p.body};
        }
        done(std::move(result));
    });
}

SimulatedProcessor::SimulatedProcessor(SimulateSpec spec, QObject *parent)
    : Processor(parent), m_spec(spec)
{}

void SimulatedProcessor::run(const QString &key, const StoredRequest &, Done done)
{
    auto finish = [key, done, spec = m_spec] {
        ProcessResult result;
        if (spec.failRate > 0 && QRandomGenerator::global()->generateDouble() < spec.failRate) {
            result.error = u"simulated failure (fail_rate %1)"_qs.arg(spec.failRate);
            const HttpResponse p = HttpResponse::problem(500, u"Simulated failure"_qs, result.error);
            result.response = {p.status, p.headers, p.body};
        } else {
            const HttpResponse r = HttpResponse::json(
                200, {{u"processed"_qs, true}, {u"key"_qs, key},
                      {u"processed_at"_qs, QDateTime::currentDateTimeUtc().toString(Qt::ISODateWithMs)}});
            result.success = true;
            result.response = {r.status, r.headers, r.body};
        }
        done(std::move(result));
    };
    if (m_spec.delayMs <= 0)
        finish();
    else
        QTimer::singleShot(m_spec.delayMs, this, finish);
}

std::unique_ptr<Processor> makeProcessor(const EndpointConfig &endpoint)
{
    if (endpoint.forwardTo.isValid() && !endpoint.forwardTo.isEmpty())
        return std::make_unique<ForwardProcessor>(endpoint.forwardTo,
                                                  endpoint.settings.forwardTimeoutSeconds * 1000);
    return std::make_unique<SimulatedProcessor>(endpoint.simulate);
}

} // namespace idem
