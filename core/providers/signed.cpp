// The signed providers of docs/providers.md: where each sender puts its event id, and how it signs.
#include "providers/provider.h"

#include "util/crypto.h"
#include "util/rawjson.h"

#include <QDateTime>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QUrlQuery>

namespace idem {

namespace {

using Kind = KeyExtraction::Kind;

Error unauthenticated(const QString &detail)
{
    return makeError(ErrorCode::Invalid, detail);
}

KeyExtraction found(const QString &key)
{
    return {Kind::Found, key, {}};
}

KeyExtraction missing(const QString &detail)
{
    return {Kind::Missing, {}, detail};
}

// A key from the signed body, as the endpoint's "key" says (json_pointer, composite): for
// senders whose id header no signature covers, so that a captured body sent again under a fresh
// id is a duplicate, not a new event.
KeyExtraction signedBodyKey(const HttpRequest &request, const EndpointConfig &e)
{
    QStringList tried;
    if (auto key = bodyKey(request.body, e.key, tried))
        return *key;
    return missing(
        u"no idempotency key in the body: looked for %1"_qs.arg(tried.join(u", then "_qs)));
}

// The body's top-level string field, for providers that key by an id in the JSON.
KeyExtraction bodyField(const HttpRequest &request, const QString &field)
{
    QJsonParseError error;
    const QJsonDocument doc = QJsonDocument::fromJson(request.body, &error);
    if (error.error != QJsonParseError::NoError || !doc.isObject())
        return {Kind::Invalid, {}, u"the body is not a JSON object, so its \"%1\" cannot be read"_qs.arg(field)};
    const QString value = scalarText(doc.object().value(field));
    if (value.isEmpty())
        return missing(u"the body has no \"%1\""_qs.arg(field));
    return found(value);
}

// Test events are sent as senders send them: pretty-printed JSON, as Stripe and GitHub do.
QByteArray indented(const QJsonObject &object)
{
    return QJsonDocument(object).toJson(QJsonDocument::Indented);
}

// "t=1,v1=abc,v1=def" → pairs, in order.
QList<QPair<QByteArray, QByteArray>> keyValues(const QByteArray &header)
{
    QList<QPair<QByteArray, QByteArray>> pairs;
    for (const QByteArray &part : header.split(',')) {
        const qsizetype eq = part.indexOf('=');
        if (eq > 0)
            pairs.append({part.left(eq).trimmed(), part.mid(eq + 1).trimmed()});
    }
    return pairs;
}

bool anySecretMatches(const QStringList &secrets, const QByteArray &signedContent,
                      const QList<QByteArray> &candidates, bool base64)
{
    bool matched = false;
    for (const QString &secret : secrets) {
        const QByteArray expected = hmacSha256(secret.toUtf8(), signedContent);
        for (const QByteArray &candidate : candidates) {
            const QByteArray given = base64 ? QByteArray::fromBase64(candidate) : QByteArray::fromHex(candidate);
            matched |= constantTimeEquals(expected, given); // no early exit: constant work per candidate
        }
    }
    return matched;
}

// ---- Stripe ---------------------------------------------------------------------------------

class StripeProvider final : public Provider
{
public:
    QString name() const override { return u"stripe"_qs; }
    qint64 retryWindowSeconds() const override { return 3 * 86400; }

    Result<void> verify(const HttpRequest &request, const EndpointConfig &e, qint64 now) const override
    {
        if (e.secrets.isEmpty())
            return {};
        const QByteArray header = request.header("Stripe-Signature");
        if (header.isEmpty())
            return unauthenticated(u"missing Stripe-Signature header"_qs);
        QByteArray timestamp;
        QList<QByteArray> v1;
        for (const auto &[k, v] : keyValues(header)) {
            if (k == "t")
                timestamp = v;
            else if (k == "v1")
                v1.append(v); // other schemes (v0, ...) are ignored
        }
        if (timestamp.isEmpty())
            return unauthenticated(u"Stripe-Signature has no t= timestamp"_qs);
        if (v1.isEmpty())
            return unauthenticated(u"Stripe-Signature has no v1= signature"_qs);
        if (auto t = checkTimestamp(timestamp, now, e.settings.signatureToleranceSeconds); !t)
            return unauthenticated(u"Stripe-Signature: "_qs + t.error().message);
        if (!anySecretMatches(e.secrets, timestamp + '.' + request.body, v1, false))
            return unauthenticated(u"no v1 signature in Stripe-Signature matches the body and timestamp with the endpoint's secret(s)"_qs);
        return {};
    }
    KeyExtraction extractKey(const HttpRequest &request, const EndpointConfig &) const override
    {
        return bodyField(request, u"id"_qs);
    }
    QString eventType(const HttpRequest &request, const EndpointConfig &) const override
    {
        return eventTypeAt(request.body, u"/type");
    }
    QStringList templates() const override { return {u"payment_intent.succeeded"_qs}; }
    OutgoingDelivery sample(const EndpointConfig &, const QString &, const QString &id,
                            qint64 now) const override
    {
        OutgoingDelivery d;
        // In Stripe's own order (id first), which QJsonObject would sort away.
        d.body = QStringLiteral("{\n"
                                "  \"id\": \"%1\",\n"
                                "  \"object\": \"event\",\n"
                                "  \"api_version\": \"2024-06-20\",\n"
                                "  \"created\": %2,\n"
                                "  \"data\": {\n"
                                "    \"object\": {\n"
                                "      \"id\": \"pi_3Q%3\",\n"
                                "      \"object\": \"payment_intent\",\n"
                                "      \"amount\": 4200,\n"
                                "      \"currency\": \"usd\",\n"
                                "      \"status\": \"succeeded\"\n"
                                "    }\n"
                                "  },\n"
                                "  \"livemode\": false,\n"
                                "  \"pending_webhooks\": 1,\n"
                                "  \"request\": {\"id\": null, \"idempotency_key\": null},\n"
                                "  \"type\": \"payment_intent.succeeded\"\n"
                                "}\n")
                     .arg(id)
                     .arg(now)
                     .arg(id.right(12))
                     .toUtf8();
        d.headers = {{"Content-Type", "application/json; charset=utf-8"},
                     {"User-Agent", "Stripe/1.0 (+https://stripe.com/docs/webhooks)"}};
        return d;
    }
    Result<void> sign(OutgoingDelivery &d, const EndpointConfig &e, qint64 now) const override
    {
        if (e.secrets.isEmpty())
            return {};
        const QByteArray t = QByteArray::number(now);
        setHeader(d.headers, "Stripe-Signature",
                  "t=" + t +
                      ",v1=" + hmacSha256(e.secrets.first().toUtf8(), t + '.' + d.body).toHex());
        return {};
    }
};

// ---- GitHub ---------------------------------------------------------------------------------

class GithubProvider final : public Provider
{
public:
    QString name() const override { return u"github"_qs; }
    qint64 retryWindowSeconds() const override { return 3 * 86400; } // manual redelivery

    Result<void> verify(const HttpRequest &request, const EndpointConfig &e, qint64) const override
    {
        if (e.secrets.isEmpty())
            return {};
        const QByteArray header = request.header("X-Hub-Signature-256");
        if (header.isEmpty())
            return unauthenticated(u"missing X-Hub-Signature-256 header"_qs);
        if (!header.startsWith("sha256="))
            return unauthenticated(u"X-Hub-Signature-256 must start with sha256="_qs);
        if (!anySecretMatches(e.secrets, request.body, {header.mid(7)}, false))
            return unauthenticated(u"X-Hub-Signature-256 does not match the body with the endpoint's secret(s)"_qs);
        return {};
    }
    KeyExtraction extractKey(const HttpRequest &request, const EndpointConfig &e) const override
    {
        if (e.key.readsBody())
            return signedBodyKey(request, e);
        const QByteArray hook = request.header("X-GitHub-Hook-ID");
        const QByteArray delivery = request.header("X-GitHub-Delivery");
        if (delivery.isEmpty())
            return missing(u"no X-GitHub-Delivery header"_qs);
        if (hook.isEmpty())
            return missing(u"no X-GitHub-Hook-ID header (the key is scoped by hook)"_qs);
        return found(QString::fromLatin1("hook-" + hook + '/' + delivery));
    }
    // The X-GitHub-Event header, and the body's action when it has one: issues.opened, push.
    QString eventType(const HttpRequest &request, const EndpointConfig &) const override
    {
        const QByteArray event = request.header("X-GitHub-Event");
        if (event.isEmpty())
            return {};
        const auto action = jsonValueAt(request.body, u"/action");
        const QString name = action ? jsonScalarText(*action) : QString();
        return eventTypeText(QString::fromLatin1(event) +
                             (name.isEmpty() ? QString() : u'.' + name));
    }
    QString note(const HttpRequest &request) const override
    {
        const QByteArray event = request.header("X-GitHub-Event");
        return event.isEmpty() ? QString() : u"event "_qs + QString::fromLatin1(event);
    }
    QStringList templates() const override { return {u"push"_qs, u"ping"_qs}; }
    OutgoingDelivery sample(const EndpointConfig &e, const QString &name, const QString &id,
                            qint64) const override
    {
        OutgoingDelivery d;
        const bool ping = name == u"ping"_qs;
        const QJsonObject repository{{u"id"_qs, 1296269},
                                     {u"full_name"_qs, u"octocat/Hello-World"_qs}};
        QJsonObject body =
            ping ? QJsonObject{{u"zen"_qs, u"Keep it logically awesome."_qs},
                               {u"hook_id"_qs, 4242},
                               {u"repository"_qs, repository}}
                 : QJsonObject({{u"ref"_qs, u"refs/heads/main"_qs},
                                {u"before"_qs, u"6113728f27ae82c7b1a177c8d03f9e96e0adf246"_qs},
                                {u"after"_qs, u"0d1a26e67d8f5eaf1f6ba5c57fc3c7d91ac0fd1c"_qs},
                                {u"repository"_qs, repository},
                                {u"pusher"_qs, QJsonObject{{u"name"_qs, u"octocat"_qs}}},
                                {u"commits"_qs,
                                 QJsonArray{QJsonObject{
                                     {u"id"_qs, u"0d1a26e67d8f5eaf1f6ba5c57fc3c7d91ac0fd1c"_qs},
                                     {u"message"_qs, u"Update README"_qs}}}}});
        placeBodyKey(body, e.key, id);
        d.body = indented(body);
        d.headers = {{"Content-Type", "application/json"},
                     {"User-Agent", "GitHub-Hookshot/044aadd"},
                     {"X-GitHub-Event", ping ? "ping" : "push"},
                     {"X-GitHub-Hook-ID", "4242"},
                     {"X-GitHub-Delivery", id.toUtf8()}};
        return d;
    }
    Result<void> sign(OutgoingDelivery &d, const EndpointConfig &e, qint64) const override
    {
        if (!e.secrets.isEmpty())
            setHeader(d.headers, "X-Hub-Signature-256",
                      "sha256=" + hmacSha256(e.secrets.first().toUtf8(), d.body).toHex());
        return {};
    }
};

// ---- Shopify --------------------------------------------------------------------------------

class ShopifyProvider final : public Provider
{
public:
    QString name() const override { return u"shopify"_qs; }
    qint64 retryWindowSeconds() const override { return 4 * 3600; } // 8 retries over 4 hours

    Result<void> verify(const HttpRequest &request, const EndpointConfig &e, qint64) const override
    {
        if (e.secrets.isEmpty())
            return {};
        const QByteArray header = request.header("X-Shopify-Hmac-Sha256");
        if (header.isEmpty())
            return unauthenticated(u"missing X-Shopify-Hmac-Sha256 header"_qs);
        if (!anySecretMatches(e.secrets, request.body, {header}, true))
            return unauthenticated(u"X-Shopify-Hmac-Sha256 does not match the body with the endpoint's secret(s) (base64 HMAC-SHA256)"_qs);
        return {};
    }
    KeyExtraction extractKey(const HttpRequest &request, const EndpointConfig &e) const override
    {
        if (e.key.readsBody())
            return signedBodyKey(request, e);
        const QByteArray id = request.header("X-Shopify-Webhook-Id");
        if (id.isEmpty())
            return missing(u"no X-Shopify-Webhook-Id header"_qs);
        return found(QString::fromLatin1(id));
    }
    QString eventType(const HttpRequest &request, const EndpointConfig &) const override
    {
        return eventTypeText(QString::fromLatin1(request.header("X-Shopify-Topic")));
    }
    QString note(const HttpRequest &request) const override
    {
        const QByteArray event = request.header("X-Shopify-Event-Id");
        return event.isEmpty() ? QString() : u"event "_qs + QString::fromLatin1(event);
    }
    QStringList templates() const override { return {u"orders/create"_qs}; }
    OutgoingDelivery sample(const EndpointConfig &e, const QString &, const QString &id,
                            qint64) const override
    {
        OutgoingDelivery d;
        QJsonObject body(
            {{u"id"_qs, 820982911946154508LL},
             {u"email"_qs, u"jon@example.com"_qs},
             {u"currency"_qs, u"USD"_qs},
             {u"total_price"_qs, u"42.00"_qs},
             {u"financial_status"_qs, u"paid"_qs},
             {u"line_items"_qs, QJsonArray{QJsonObject{{u"title"_qs, u"IPod Nano - 8GB"_qs},
                                                       {u"quantity"_qs, 1},
                                                       {u"price"_qs, u"42.00"_qs}}}}});
        placeBodyKey(body, e.key, id);
        d.body = indented(body);
        d.headers = {{"Content-Type", "application/json"},
                     {"X-Shopify-Topic", "orders/create"},
                     {"X-Shopify-Shop-Domain", "example.myshopify.com"},
                     {"X-Shopify-API-Version", "2024-07"},
                     {"X-Shopify-Webhook-Id", id.toUtf8()},
                     {"X-Shopify-Event-Id", "ev-" + id.toUtf8()}};
        return d;
    }
    Result<void> sign(OutgoingDelivery &d, const EndpointConfig &e, qint64) const override
    {
        if (!e.secrets.isEmpty())
            setHeader(d.headers, "X-Shopify-Hmac-Sha256",
                      hmacSha256(e.secrets.first().toUtf8(), d.body).toBase64());
        return {};
    }
};

// ---- SendGrid -------------------------------------------------------------------------------

class SendgridProvider final : public Provider
{
public:
    QString name() const override { return u"sendgrid"_qs; }
    qint64 retryWindowSeconds() const override { return 24 * 3600; }
    bool isBatch() const override { return true; }

    Result<void> verify(const HttpRequest &request, const EndpointConfig &e, qint64 now) const override
    {
        if (e.publicKeys.isEmpty())
            return {};
        const QByteArray signature = request.header("X-Twilio-Email-Event-Webhook-Signature");
        const QByteArray timestamp = request.header("X-Twilio-Email-Event-Webhook-Timestamp");
        if (signature.isEmpty())
            return unauthenticated(u"missing X-Twilio-Email-Event-Webhook-Signature header"_qs);
        if (timestamp.isEmpty())
            return unauthenticated(u"missing X-Twilio-Email-Event-Webhook-Timestamp header"_qs);
        if (auto t = checkTimestamp(timestamp, now, e.settings.signatureToleranceSeconds); !t)
            return unauthenticated(u"X-Twilio-Email-Event-Webhook-Timestamp: "_qs + t.error().message);
        const QByteArray der = QByteArray::fromBase64(signature);
        bool matched = false;
        for (const QByteArray &key : e.publicKeys)
            matched |= ecdsaVerify(key, timestamp + request.body, der);
        if (!matched)
            return unauthenticated(u"the ECDSA signature does not verify over timestamp + body with the endpoint's public key(s)"_qs);
        return {};
    }
    KeyExtraction extractKey(const HttpRequest &, const EndpointConfig &) const override
    {
        return missing(u"SendGrid deliveries are batches: each element is keyed by its sg_event_id"_qs);
    }
    QString elementType(QByteArrayView element) const override
    {
        return eventTypeAt(element, u"/event");
    }
    Result<QList<BatchElement>> splitBatch(const HttpRequest &request,
                                           qsizetype maxElements) const override
    {
        QJsonParseError error;
        const QJsonDocument doc = QJsonDocument::fromJson(request.body, &error);
        if (error.error != QJsonParseError::NoError || !doc.isArray())
            return makeError(ErrorCode::Invalid, u"a SendGrid delivery is a JSON array of events"_qs);
        const QJsonArray events = doc.array();
        if (events.isEmpty())
            return makeError(ErrorCode::Invalid, u"the SendGrid batch is empty"_qs);
        if (events.size() > maxElements)
            return makeError(
                ErrorCode::TooLarge,
                u"the SendGrid batch has %1 events, more than this endpoint takes in one delivery "
                u"(max_batch_elements %2); nothing was stored: send them in smaller batches"_qs
                    .arg(events.size())
                    .arg(maxElements));
        // Each element as sent, read again: QJsonObject would make a number past 2^53 a double
        // (two events one) and keep the last of two members of one name.
        auto objects = rawJsonObjects(request.body, "sg_event_id");
        if (!objects)
            return makeError(ErrorCode::Invalid,
                             u"the SendGrid batch: "_qs + objects.error().message);
        QList<BatchElement> elements;
        for (const RawJsonObject &event : *objects) {
            BatchElement element;
            element.raw = event.raw;
            // Its canonical form (docs/providers.md#sendgrid): the same event sent again with
            // its members in another order or spaced otherwise has the same fingerprint; any
            // other value, a number's last digit included, another one.
            element.fingerprint = sha256Hex(event.canonical);
            element.key = event.id;
            // No sg_event_id (older integrations): the whole element is the event's identity.
            // Any fewer fields (message, event, email, second) make two clicks on two links in
            // one second one key, and one of them would be lost.
            if (element.key.isEmpty())
                element.key = u"e-"_qs + QString::fromLatin1(element.fingerprint);
            elements.append(element);
        }
        return elements;
    }
    QStringList templates() const override { return {u"batch"_qs, u"delivered"_qs}; }
    QString stormTemplate() const override { return u"delivered"_qs; } // one key per storm event
    OutgoingDelivery sample(const EndpointConfig &, const QString &name, const QString &id,
                            qint64 now) const override
    {
        OutgoingDelivery d;
        auto event = [&](const QString &type, const QString &eventId) {
            return QJsonObject{{u"email"_qs, u"example@test.com"_qs},
                               {u"timestamp"_qs, now},
                               {u"event"_qs, type},
                               {u"sg_event_id"_qs, eventId},
                               {u"sg_message_id"_qs, u"14c5d75ce93.dfd.64b469.filter0001"_qs}};
        };
        const QJsonArray events = name == u"delivered"_qs
                                      ? QJsonArray{event(u"delivered"_qs, id)}
                                      : QJsonArray{event(u"processed"_qs, id + u"-1"_qs),
                                                   event(u"delivered"_qs, id + u"-2"_qs),
                                                   event(u"open"_qs, id + u"-3"_qs)};
        d.body = QJsonDocument(events).toJson(name == u"delivered"_qs ? QJsonDocument::Compact
                                                                      : QJsonDocument::Indented);
        d.headers = {{"Content-Type", "application/json"}, {"User-Agent", "SendGrid Event API"}};
        return d;
    }
    Result<void> sign(OutgoingDelivery &d, const EndpointConfig &e, qint64 now) const override
    {
        const QByteArray timestamp = QByteArray::number(now);
        setHeader(d.headers, "X-Twilio-Email-Event-Webhook-Timestamp", timestamp);
        if (e.privateKey.isEmpty()) {
            if (!e.publicKeys.isEmpty())
                return makeError(
                    ErrorCode::Invalid,
                    u"SendGrid signs with its private key, which the desk does not hold: give it (PEM) to sign"_qs);
            return {};
        }
        auto signature = ecdsaSign(e.privateKey, timestamp + d.body);
        if (!signature)
            return signature.error();
        setHeader(d.headers, "X-Twilio-Email-Event-Webhook-Signature", signature->toBase64());
        return {};
    }
};

// ---- Slack ----------------------------------------------------------------------------------

class SlackProvider final : public Provider
{
public:
    QString name() const override { return u"slack"_qs; }
    qint64 retryWindowSeconds() const override { return 3600; } // three retries within the hour

    Result<void> verify(const HttpRequest &request, const EndpointConfig &e, qint64 now) const override
    {
        if (e.secrets.isEmpty())
            return {};
        const QByteArray signature = request.header("X-Slack-Signature");
        const QByteArray timestamp = request.header("X-Slack-Request-Timestamp");
        if (signature.isEmpty())
            return unauthenticated(u"missing X-Slack-Signature header"_qs);
        if (timestamp.isEmpty())
            return unauthenticated(u"missing X-Slack-Request-Timestamp header"_qs);
        if (!signature.startsWith("v0="))
            return unauthenticated(u"X-Slack-Signature must start with v0="_qs);
        if (auto t = checkTimestamp(timestamp, now, e.settings.signatureToleranceSeconds); !t)
            return unauthenticated(u"X-Slack-Request-Timestamp: "_qs + t.error().message);
        if (!anySecretMatches(e.secrets, "v0:" + timestamp + ':' + request.body, {signature.mid(3)}, false))
            return unauthenticated(u"X-Slack-Signature does not match v0:{timestamp}:{body} with the endpoint's signing secret(s)"_qs);
        return {};
    }
    KeyExtraction extractKey(const HttpRequest &request, const EndpointConfig &) const override
    {
        // A slash command or interaction is a form, not JSON: its trigger_id names it.
        if (request.header("Content-Type").startsWith("application/x-www-form-urlencoded")) {
            const QString trigger = QUrlQuery(QString::fromUtf8(request.body))
                                        .queryItemValue(u"trigger_id"_qs, QUrl::FullyDecoded);
            return trigger.isEmpty() ? missing(u"the form has no trigger_id"_qs) : found(trigger);
        }
        return bodyField(request, u"event_id"_qs);
    }
    std::optional<HttpResponse> directAnswer(const HttpRequest &request) const override
    {
        const QJsonObject body = QJsonDocument::fromJson(request.body).object();
        if (body.value(u"type").toString() != u"url_verification"_qs)
            return std::nullopt;
        return HttpResponse::json(200, {{u"challenge"_qs, body.value(u"challenge")}});
    }
    // An event_callback's event.type (app_mention), a slash command's command (/deploy), an
    // interaction's payload type (block_actions), else the body's type (url_verification).
    QString eventType(const HttpRequest &request, const EndpointConfig &) const override
    {
        if (request.header("Content-Type").startsWith("application/x-www-form-urlencoded")) {
            const QUrlQuery form(QString::fromUtf8(request.body));
            const QString command = form.queryItemValue(u"command"_qs, QUrl::FullyDecoded);
            if (!command.isEmpty())
                return eventTypeText(command);
            return eventTypeAt(form.queryItemValue(u"payload"_qs, QUrl::FullyDecoded).toUtf8(),
                               u"/type");
        }
        const QString type = eventTypeAt(request.body, u"/type");
        if (type == u"event_callback"_qs) {
            const QString inner = eventTypeAt(request.body, u"/event/type");
            return inner.isEmpty() ? type : inner;
        }
        return type;
    }
    QString note(const HttpRequest &request) const override
    {
        const QByteArray retry = request.header("X-Slack-Retry-Num");
        if (retry.isEmpty())
            return {};
        const QByteArray reason = request.header("X-Slack-Retry-Reason");
        return u"slack retry %1%2"_qs.arg(QString::fromLatin1(retry),
                                          reason.isEmpty() ? QString() : u" ("_qs + QString::fromLatin1(reason) + u")"_qs);
    }
    QStringList templates() const override { return {u"slash-command"_qs, u"event_callback"_qs}; }
    OutgoingDelivery sample(const EndpointConfig &, const QString &name, const QString &id,
                            qint64 now) const override
    {
        OutgoingDelivery d;
        if (name == u"event_callback"_qs) {
            d.body = indented({{u"type"_qs, u"event_callback"_qs},
                               {u"team_id"_qs, u"T0001"_qs},
                               {u"event_id"_qs, id},
                               {u"event_time"_qs, now},
                               {u"event"_qs, QJsonObject{{u"type"_qs, u"app_mention"_qs},
                                                         {u"user"_qs, u"U2147483697"_qs},
                                                         {u"text"_qs, u"hello"_qs}}}});
            d.headers = {{"Content-Type", "application/json"}};
        } else {
            QUrlQuery form;
            form.setQueryItems(
                {{u"team_id"_qs, u"T0001"_qs},
                 {u"team_domain"_qs, u"example"_qs},
                 {u"channel_id"_qs, u"C2147483705"_qs},
                 {u"channel_name"_qs, u"test"_qs},
                 {u"user_id"_qs, u"U2147483697"_qs},
                 {u"user_name"_qs, u"steve"_qs},
                 {u"command"_qs, u"/deploy"_qs},
                 {u"text"_qs, u"production"_qs},
                 {u"response_url"_qs, u"https://hooks.slack.com/commands/1234/5678"_qs},
                 {u"trigger_id"_qs, id}});
            d.body = form.query(QUrl::FullyEncoded).toUtf8();
            d.headers = {{"Content-Type", "application/x-www-form-urlencoded"}};
        }
        d.headers.append(
            {QByteArray("User-Agent"), QByteArray("Slackbot 1.0 (+https://api.slack.com/robots)")});
        return d;
    }
    Result<void> sign(OutgoingDelivery &d, const EndpointConfig &e, qint64 now) const override
    {
        const QByteArray timestamp = QByteArray::number(now);
        setHeader(d.headers, "X-Slack-Request-Timestamp", timestamp);
        if (!e.secrets.isEmpty())
            setHeader(d.headers, "X-Slack-Signature",
                      "v0=" +
                          hmacSha256(e.secrets.first().toUtf8(), "v0:" + timestamp + ':' + d.body)
                              .toHex());
        return {};
    }
};

// ---- Standard Webhooks (Svix) ---------------------------------------------------------------

QByteArray standardKey(const QString &secret)
{
    return QByteArray::fromBase64((secret.startsWith(u"whsec_"_qs) ? secret.mid(6) : secret).toLatin1());
}

class StandardProvider final : public Provider
{
public:
    QString name() const override { return u"standard"_qs; }
    qint64 retryWindowSeconds() const override { return 76 * 3600; }

    Result<void> verify(const HttpRequest &request, const EndpointConfig &e, qint64 now) const override
    {
        if (e.secrets.isEmpty())
            return {};
        const QByteArray id = request.header("webhook-id");
        const QByteArray timestamp = request.header("webhook-timestamp");
        const QByteArray header = request.header("webhook-signature");
        if (header.isEmpty())
            return unauthenticated(u"missing webhook-signature header"_qs);
        if (id.isEmpty() || timestamp.isEmpty())
            return unauthenticated(u"missing webhook-id or webhook-timestamp header"_qs);
        if (auto t = checkTimestamp(timestamp, now, e.settings.signatureToleranceSeconds); !t)
            return unauthenticated(u"webhook-timestamp: "_qs + t.error().message);
        QList<QByteArray> v1;
        for (const QByteArray &part : header.split(' ')) // "v1,<b64> v1,<b64> v1a,..."
            if (part.startsWith("v1,"))
                v1.append(part.mid(3));
        if (v1.isEmpty())
            return unauthenticated(u"webhook-signature has no v1 signature"_qs);
        const QByteArray content = id + '.' + timestamp + '.' + request.body;
        bool matched = false;
        for (const QString &secret : e.secrets) {
            const QByteArray expected = hmacSha256(standardKey(secret), content);
            for (const QByteArray &candidate : v1)
                matched |= constantTimeEquals(expected, QByteArray::fromBase64(candidate));
        }
        if (!matched)
            return unauthenticated(u"no v1 signature in webhook-signature matches {id}.{timestamp}.{body} with the endpoint's secret(s)"_qs);
        return {};
    }
    KeyExtraction extractKey(const HttpRequest &request, const EndpointConfig &) const override
    {
        const QByteArray id = request.header("webhook-id");
        if (id.isEmpty())
            return missing(u"no webhook-id header"_qs);
        return found(QString::fromLatin1(id));
    }
    QString eventType(const HttpRequest &request, const EndpointConfig &) const override
    {
        return eventTypeAt(request.body, u"/type");
    }
    QStringList templates() const override { return {u"invoice.paid"_qs}; }
    OutgoingDelivery sample(const EndpointConfig &, const QString &, const QString &id,
                            qint64 now) const override
    {
        OutgoingDelivery d;
        d.body = indented(
            {{u"type"_qs, u"invoice.paid"_qs},
             {u"timestamp"_qs, QDateTime::fromSecsSinceEpoch(now, Qt::UTC).toString(Qt::ISODate)},
             {u"data"_qs,
              QJsonObject{{u"id"_qs, id}, {u"amount"_qs, 4200}, {u"currency"_qs, u"usd"_qs}}}});
        d.headers = {{"Content-Type", "application/json"}, {"webhook-id", id.toUtf8()}};
        return d;
    }
    Result<void> sign(OutgoingDelivery &d, const EndpointConfig &e, qint64 now) const override
    {
        const QByteArray timestamp = QByteArray::number(now);
        setHeader(d.headers, "webhook-timestamp", timestamp);
        if (!e.secrets.isEmpty())
            setHeader(d.headers, "webhook-signature",
                      "v1," + hmacSha256(standardKey(e.secrets.first()),
                                         headerValue(d.headers, "webhook-id") + '.' + timestamp +
                                             '.' + d.body)
                                  .toBase64());
        return {};
    }
};

} // namespace

const Provider *stripeProvider()
{
    static const StripeProvider p;
    return &p;
}
const Provider *githubProvider()
{
    static const GithubProvider p;
    return &p;
}
const Provider *shopifyProvider()
{
    static const ShopifyProvider p;
    return &p;
}
const Provider *sendgridProvider()
{
    static const SendgridProvider p;
    return &p;
}
const Provider *slackProvider()
{
    static const SlackProvider p;
    return &p;
}
const Provider *standardProvider()
{
    static const StandardProvider p;
    return &p;
}

} // namespace idem
