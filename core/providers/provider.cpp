#include "providers/provider.h"

#include "util/crypto.h"

#include <QCryptographicHash>
#include <QJsonArray>
#include <QJsonDocument>
#include <QMessageAuthenticationCode>

#include <openssl/crypto.h>

#include <algorithm>

namespace idem {

bool constantTimeEquals(QByteArrayView a, QByteArrayView b)
{
    return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), size_t(a.size())) == 0;
}

Result<QString> namespacedKey(const QString &endpoint, const QString &rawKey)
{
    const QString trimmed = rawKey.trimmed();
    if (trimmed.isEmpty())
        return makeError(ErrorCode::Invalid, u"the idempotency key is empty"_qs);
    for (const QChar c : trimmed)
        if (c.unicode() < 0x20 || c.unicode() > 0x7e)
            return makeError(ErrorCode::Invalid,
                             u"the idempotency key must be printable ASCII"_qs);
    const QString key = endpoint + u":"_qs + trimmed;
    if (key.size() > 255)
        return makeError(ErrorCode::Invalid,
                         u"the idempotency key is longer than 255 bytes with its endpoint prefix"_qs);
    return key;
}

std::optional<QJsonValue> resolvePointer(const QJsonValue &root, const QString &pointer)
{
    if (pointer.isEmpty())
        return root;
    QJsonValue current = root;
    const QStringList tokens = pointer.mid(1).split(u'/');
    for (QString token : tokens) {
        token.replace(u"~1"_qs, u"/"_qs).replace(u"~0"_qs, u"~"_qs);
        if (current.isObject()) {
            const QJsonObject o = current.toObject();
            if (!o.contains(token))
                return std::nullopt;
            current = o.value(token);
        } else if (current.isArray()) {
            bool ok = false;
            const int index = token.toInt(&ok);
            const QJsonArray a = current.toArray();
            if (!ok || index < 0 || index >= a.size())
                return std::nullopt;
            current = a.at(index);
        } else {
            return std::nullopt;
        }
    }
    return current;
}

QByteArray hmacSha256(const QByteArray &key, const QByteArray &data)
{
    return QMessageAuthenticationCode::hash(data, key, QCryptographicHash::Sha256);
}

Result<void> checkTimestamp(const QByteArray &timestamp, qint64 nowSeconds, qint64 toleranceSeconds)
{
    bool ok = false;
    const qint64 t = timestamp.toLongLong(&ok);
    if (!ok)
        return makeError(ErrorCode::Invalid, u"the signed timestamp '%1' is not a number"_qs.arg(QString::fromLatin1(timestamp.left(32))));
    if (toleranceSeconds <= 0)
        return {};
    // `t` is the sender's, any 64-bit number: bounded before any arithmetic (now - t would
    // overflow, which is undefined, for t near either end). 2^40 s is some 35,000 years.
    constexpr qint64 kFar = qint64(1) << 40;
    const qint64 age = nowSeconds - std::clamp(t, nowSeconds - kFar, nowSeconds + kFar);
    if (age > toleranceSeconds)
        return makeError(
            ErrorCode::Invalid,
            u"the signed timestamp is %1 s old, beyond the %2 s tolerance (a replay?)"_qs.arg(age)
                .arg(toleranceSeconds));
    if (-age > toleranceSeconds)
        return makeError(
            ErrorCode::Invalid,
            u"the signed timestamp is %1 s in the future, beyond the %2 s tolerance (check the clocks)"_qs
                .arg(-age)
                .arg(toleranceSeconds));
    return {};
}

Result<QList<BatchElement>> Provider::splitBatch(const HttpRequest &, qsizetype) const
{
    return makeError(ErrorCode::Internal, u"%1 does not send batches"_qs.arg(name()));
}

QJsonValue setPointer(const QJsonValue &node, QStringList tokens, const QString &value)
{
    if (tokens.isEmpty())
        return value;
    QString token = tokens.takeFirst();
    token.replace(u"~1"_qs, u"/"_qs).replace(u"~0"_qs, u"~"_qs);
    QJsonObject object = node.toObject();
    object.insert(token, setPointer(object.value(token), tokens, value));
    return object;
}

QString scalarText(const QJsonValue &v)
{
    if (v.isString())
        return v.toString();
    if (v.isDouble()) {
        const double d = v.toDouble();
        return d == double(qint64(d)) ? QString::number(qint64(d)) : QString::number(d, 'g', 17);
    }
    if (v.isBool())
        return v.toBool() ? u"true"_qs : u"false"_qs;
    return {};
}

namespace {

// Idempotency-Key header by default; or a configured header, JSON pointer, or the SHA-256 of
// composite fields, tried in that order. Optional HMAC-SHA256 of the body in a header.
class GenericProvider final : public Provider
{
public:
    QString name() const override { return u"generic"_qs; }
    qint64 retryWindowSeconds() const override { return 0; }

    Result<void> verify(const HttpRequest &request, const EndpointConfig &endpoint,
                        qint64) const override
    {
        if (endpoint.secrets.isEmpty())
            return {};
        QByteArray given = request.header(endpoint.signatureHeader);
        if (given.isEmpty())
            return makeError(ErrorCode::Invalid, u"missing signature header %1"_qs.arg(
                                                     QString::fromLatin1(endpoint.signatureHeader)));
        if (given.startsWith("sha256="))
            given = given.mid(7);
        const QByteArray givenRaw = QByteArray::fromHex(given);
        for (const QString &secret : endpoint.secrets) {
            const QByteArray expected = QMessageAuthenticationCode::hash(
                request.body, secret.toUtf8(), QCryptographicHash::Sha256);
            if (constantTimeEquals(expected, givenRaw))
                return {};
        }
        return makeError(ErrorCode::Invalid,
                         u"the %1 signature does not match the body (HMAC-SHA256, hex)"_qs.arg(
                             QString::fromLatin1(endpoint.signatureHeader)));
    }

    QStringList templates() const override { return {u"json"_qs}; }
    OutgoingDelivery sample(const EndpointConfig &e, const QString &, const QString &eventId,
                            qint64) const override
    {
        OutgoingDelivery out;
        const KeySpec &spec = e.key;
        QJsonObject body{{u"type"_qs, u"test.event"_qs},
                         {u"data"_qs, QJsonObject{{u"event"_qs, eventId}, {u"amount"_qs, 4200}}}};
        const bool configured =
            !spec.header.isEmpty() || !spec.jsonPointer.isEmpty() || !spec.composite.isEmpty();
        if (!configured || !spec.header.isEmpty())
            out.headers.append({configured ? spec.header : QByteArray("Idempotency-Key"), eventId.toUtf8()});
        else
            placeBodyKey(body, spec, eventId);
        out.headers.append({QByteArray("Content-Type"), QByteArray("application/json")});
        out.body = QJsonDocument(body).toJson(QJsonDocument::Compact);
        return out;
    }
    Result<void> sign(OutgoingDelivery &d, const EndpointConfig &e, qint64) const override
    {
        if (!e.secrets.isEmpty())
            setHeader(d.headers, e.signatureHeader,
                      "sha256=" + QMessageAuthenticationCode::hash(d.body,
                                                                   e.secrets.first().toUtf8(),
                                                                   QCryptographicHash::Sha256)
                                      .toHex());
        return {};
    }

    KeyExtraction extractKey(const HttpRequest &request, const EndpointConfig &e) const override
    {
        const KeySpec &spec = e.key;
        const bool configured = !spec.header.isEmpty() || !spec.jsonPointer.isEmpty()
                                || !spec.composite.isEmpty();
        const QByteArray header = configured ? spec.header : QByteArray("Idempotency-Key");
        QStringList tried;
        if (!header.isEmpty()) {
            const QByteArray value = request.header(header);
            if (!value.isEmpty())
                return {KeyExtraction::Kind::Found, QString::fromLatin1(value), {}};
            tried << u"the %1 header"_qs.arg(QString::fromLatin1(header));
        }
        if (auto fromBody = bodyKey(request.body, spec, tried))
            return *fromBody;
        return {KeyExtraction::Kind::Missing, {}, u"no idempotency key: looked for %1"_qs.arg(tried.join(u", then "_qs))};
    }
};

} // namespace

std::optional<KeyExtraction> bodyKey(const QByteArray &body, const KeySpec &spec,
                                     QStringList &tried)
{
    if (!spec.readsBody())
        return std::nullopt;
    QJsonParseError error;
    const QJsonDocument doc = QJsonDocument::fromJson(body, &error);
    if (error.error != QJsonParseError::NoError)
        return KeyExtraction{KeyExtraction::Kind::Invalid,
                             {},
                             u"the body is not JSON (%1), so the key cannot be read from it"_qs.arg(
                                 error.errorString())};
    const QJsonValue root = doc.isArray() ? QJsonValue(doc.array()) : QJsonValue(doc.object());
    if (!spec.jsonPointer.isEmpty()) {
        const auto v = resolvePointer(root, spec.jsonPointer);
        const QString text = v ? scalarText(*v) : QString();
        if (!text.isEmpty())
            return KeyExtraction{KeyExtraction::Kind::Found, text, {}};
        tried << u"the JSON pointer %1"_qs.arg(spec.jsonPointer);
    }
    if (!spec.composite.isEmpty()) {
        QByteArray joined;
        bool any = false;
        for (const QString &pointer : spec.composite) {
            const auto v = resolvePointer(root, pointer);
            any = any || v.has_value();
            joined +=
                v ? QJsonDocument(QJsonArray{*v}).toJson(QJsonDocument::Compact) : QByteArray("[]");
            joined += '\n';
        }
        if (any)
            return KeyExtraction{
                KeyExtraction::Kind::Found, QString::fromLatin1(sha256Hex(joined)), {}};
        tried << u"the composite fields %1"_qs.arg(spec.composite.join(u", "_qs));
    }
    return std::nullopt;
}

void placeBodyKey(QJsonObject &body, const KeySpec &spec, const QString &eventId)
{
    if (!spec.readsBody())
        return;
    // Where the pointer (or the first composite field) reads it; the whole body's ("") gets a
    // member of its own, "" (so that each event's body differs).
    const QString pointer = !spec.jsonPointer.isEmpty() ? spec.jsonPointer : spec.composite.first();
    body = setPointer(body, pointer.mid(1).split(u'/'), eventId).toObject();
}

OutgoingDelivery Provider::makeDelivery(const EndpointConfig &endpoint, const QString &eventId,
                                        qint64 nowSeconds) const
{
    OutgoingDelivery d = sample(endpoint, stormTemplate(), eventId, nowSeconds);
    (void)sign(d, endpoint, nowSeconds); // unsigned when it cannot be signed: the receiver says 401
    return d;
}

void setHeader(HeaderList &headers, const QByteArray &name, const QByteArray &value)
{
    headers.removeIf(
        [&](const auto &header) { return header.first.compare(name, Qt::CaseInsensitive) == 0; });
    headers.append({name, value});
}

const Provider *providerFor(QStringView name)
{
    static const GenericProvider generic;
    if (name == u"generic")
        return &generic;
    for (const Provider *p : {stripeProvider(), githubProvider(), shopifyProvider(), sendgridProvider(),
                              slackProvider(), standardProvider()})
        if (name == p->name())
            return p;
    return nullptr;
}

} // namespace idem
