#include "engine/send.h"

#include "http/blockingclient.h"
#include "util/clock.h"

#include <QRandomGenerator>

namespace idem {

Result<OutgoingDelivery> composeTestEvent(const EndpointConfig &endpoint,
                                          const QString &templateName,
                                          const std::optional<QByteArray> &body)
{
    const Provider *provider = providerFor(endpoint.provider);
    if (!provider)
        return makeError(ErrorCode::Invalid, u"endpoint %1: unknown provider '%2'"_qs.arg(
                                                 endpoint.name, endpoint.provider));
    const QStringList templates = provider->templates();
    const QString name = templateName.isEmpty() ? templates.first() : templateName;
    if (!templates.contains(name))
        return makeError(ErrorCode::Invalid, u"no template '%1' for %2 (it has: %3)"_qs.arg(
                                                 name, provider->name(), templates.join(u", "_qs)));
    // An id like the sender's own, new for every event composed.
    const QString id =
        u"evt_test_"_qs + QString::number(QRandomGenerator::global()->generate64(), 36);
    OutgoingDelivery d = provider->sample(endpoint, name, id, wallMs() / 1000);
    if (body)
        d.body = *body;
    return d;
}

Result<QList<SentAnswer>>
sendTestEvent(const SendTarget &target, const EndpointConfig &endpoint, OutgoingDelivery delivery,
              int copies, const std::function<void(int, const SentAnswer &)> &onAnswer)
{
    const Provider *provider = providerFor(endpoint.provider);
    if (!provider)
        return makeError(ErrorCode::Invalid, u"endpoint %1: unknown provider '%2'"_qs.arg(
                                                 endpoint.name, endpoint.provider));
    if (auto signedOk = provider->sign(delivery, endpoint, wallMs() / 1000); !signedOk)
        return makeError(ErrorCode::Invalid,
                         u"endpoint %1: %2"_qs.arg(endpoint.name, signedOk.error().message));
    const QByteArray request =
        buildPost("/hooks/" + endpoint.name.toUtf8(), delivery.body, delivery.headers, true);
    QList<SentAnswer> answers;
    for (int copy = 0; copy < copies; ++copy) {
        SentAnswer answer;
        RawConnection connection(target.port, target.timeoutMs, target.host);
        if (!connection.isOpen()) {
            answer.error = u"cannot connect to %1:%2"_qs.arg(QString::fromLatin1(target.host))
                               .arg(target.port);
        } else if (!connection.send(request)) {
            answer.error = u"the connection closed while sending"_qs;
        } else {
            const ClientResponse response = connection.readResponse();
            answer.status = response.status;
            answer.outcome = response.header("Idempotency-Outcome");
            answer.key = response.header("Idempotency-Key");
            answer.body = response.body;
            answer.error = response.status
                               ? QString()
                               : (response.error.isEmpty() ? u"no answer"_qs : response.error);
        }
        if (onAnswer)
            onAnswer(copy, answer);
        answers.append(answer);
    }
    return answers;
}

} // namespace idem
