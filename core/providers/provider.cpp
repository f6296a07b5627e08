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

QString eventTypeText(QStringView raw)
{
    QString text;
    text.reserve(std::min(raw.size(), kMaxEventTypeChars + 1));
    for (const QChar c : raw.trimmed()) {
        if (text.size() > kMaxEventTypeChars)
            break;
        text += c.unicode() >= 0x20 && c.unicode() < 0x7f ? c : u'?';
    }
    if (text.size() > kMaxEventTypeChars)
        text = text.left(kMaxEventTypeChars - 3).trimmed() + u"..."_qs;
    return text;
}

namespace {

// A forward-only reader of JSON text that finds values without building them.
class JsonCursor
{
public:
    JsonCursor(QByteArrayView text, qsizetype at) : m_text(text), m_at(at) {}
    qsizetype at() const { return m_at; }
    // Where the next value starts (past white space).
    qsizetype next()
    {
        skipSpace();
        return m_at;
    }
    char peek()
    {
        skipSpace();
        return m_at < m_text.size() ? m_text[m_at] : '\0';
    }
    bool take(char c)
    {
        if (peek() != c)
            return false;
        ++m_at;
        return true;
    }
    // Past a string whose opening quote is at the cursor; false when it does not end.
    bool skipString()
    {
        if (!take('"'))
            return false;
        while (m_at < m_text.size()) {
            const char c = m_text[m_at++];
            if (c == '\\')
                ++m_at;
            else if (c == '"')
                return true;
        }
        return false;
    }
    // Past one value of any kind (nested ones counted, not recursed into).
    bool skipValue()
    {
        const char first = peek();
        if (first == '"')
            return skipString();
        if (first != '{' && first != '[') {
            const qsizetype start = m_at;
            while (m_at < m_text.size() && !isDelimiter(m_text[m_at]))
                ++m_at;
            return m_at > start;
        }
        qsizetype depth = 0;
        while (m_at < m_text.size()) {
            const char c = m_text[m_at];
            if (c == '"') {
                if (!skipString())
                    return false;
                continue;
            }
            ++m_at;
            if (c == '{' || c == '[')
                ++depth;
            else if ((c == '}' || c == ']') && --depth == 0)
                return true;
        }
        return false;
    }

private:
    static bool isDelimiter(char c)
    {
        return c == ',' || c == '}' || c == ']' || c == ' ' || c == '\t' || c == '\n' || c == '\r';
    }
    void skipSpace()
    {
        while (m_at < m_text.size() && (m_text[m_at] == ' ' || m_text[m_at] == '\t' ||
                                        m_text[m_at] == '\n' || m_text[m_at] == '\r'))
            ++m_at;
    }
    QByteArrayView m_text;
    qsizetype m_at;
};

// A JSON string (with its quotes) decoded; nullopt when it is not one.
std::optional<QString> jsonString(QByteArrayView raw)
{
    if (raw.size() < 2 || raw.front() != '"' || raw.back() != '"')
        return std::nullopt;
    const QByteArrayView inner = raw.sliced(1, raw.size() - 2);
    if (!inner.contains('\\'))
        return QString::fromUtf8(inner);
    const QJsonDocument doc = QJsonDocument::fromJson('[' + raw.toByteArray() + ']');
    if (!doc.isArray() || !doc.array().at(0).isString())
        return std::nullopt;
    return doc.array().at(0).toString();
}

// The value of member `name` of the object, or element `name` of the array, whose first byte is
// at `at`.
std::optional<QByteArrayView> jsonStep(QByteArrayView json, qsizetype at, const QString &name)
{
    JsonCursor cursor(json, at);
    if (cursor.take('[')) {
        // RFC 6901: digits, no leading zero.
        bool ok = !name.isEmpty() && name.size() < 10 && (name == u"0"_qs || name.front() != u'0');
        for (const QChar c : name)
            ok = ok && c.isDigit() && c.unicode() < 0x80;
        if (!ok)
            return std::nullopt;
        const int index = name.toInt();
        for (int i = 0; cursor.peek() != ']'; ++i) {
            if (i > 0 && !cursor.take(','))
                return std::nullopt;
            const qsizetype start = cursor.next();
            if (!cursor.skipValue())
                return std::nullopt;
            if (i == index)
                return json.sliced(start, cursor.at() - start);
        }
        return std::nullopt;
    }
    if (!cursor.take('{'))
        return std::nullopt;
    // A name given twice means its last value, as QJsonDocument (and so the key, the window and
    // most apps' parsers) reads it: the whole object is read, not up to the first match.
    const QByteArray wanted = '"' + name.toUtf8() + '"';
    std::optional<QByteArrayView> found;
    for (bool first = true; cursor.peek() != '}'; first = false) {
        if (!first && !cursor.take(','))
            return std::nullopt;
        const qsizetype nameStart = cursor.next();
        if (!cursor.skipString() || !cursor.take(':'))
            return std::nullopt;
        const QByteArrayView rawName = json.sliced(nameStart, cursor.at() - nameStart);
        const qsizetype start = cursor.next();
        if (!cursor.skipValue())
            return std::nullopt;
        const QByteArrayView quoted = rawName.first(rawName.lastIndexOf('"') + 1);
        if (quoted == wanted || (quoted.contains('\\') && jsonString(quoted) == name))
            found = json.sliced(start, cursor.at() - start);
    }
    return found;
}

} // namespace

std::optional<QByteArrayView> jsonValueAt(QByteArrayView json, QStringView pointer)
{
    if (!pointer.isEmpty() && !pointer.startsWith(u'/'))
        return std::nullopt;
    // A leading UTF-8 byte order mark is skipped, as QJsonDocument skips it.
    if (json.startsWith("\xEF\xBB\xBF"))
        json = json.sliced(3);
    QByteArrayView node = json.sliced(JsonCursor(json, 0).next());
    if (pointer.isEmpty()) {
        JsonCursor whole(node, 0);
        if (!whole.skipValue())
            return std::nullopt;
        return node.first(whole.at());
    }
    for (QStringView token : pointer.mid(1).split(u'/')) {
        QString name = token.toString();
        name.replace(u"~1"_qs, u"/"_qs).replace(u"~0"_qs, u"~"_qs);
        auto value = jsonStep(node, 0, name);
        if (!value)
            return std::nullopt;
        node = *value;
    }
    return node;
}

QString jsonScalarText(QByteArrayView raw)
{
    if (raw.startsWith('"'))
        return jsonString(raw).value_or(QString());
    if (raw.isEmpty() || raw == "null" || raw.startsWith('{') || raw.startsWith('['))
        return {};
    return QString::fromUtf8(raw);
}

QString eventTypeAt(QByteArrayView body, QStringView pointer)
{
    const auto value = jsonValueAt(body, pointer);
    return value ? eventTypeText(jsonScalarText(*value)) : QString();
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

    // The endpoint's type_pointer (default /type) in a JSON body; none when it is "".
    QString eventType(const HttpRequest &request, const EndpointConfig &e) const override
    {
        return e.typePointer.isEmpty() ? QString() : eventTypeAt(request.body, e.typePointer);
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
