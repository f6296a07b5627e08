#include "config/config.h"
#include "util/format.h"

#include "util/crypto.h"

#include <QFile>
#include <QJsonArray>
#include <QJsonDocument>
#include <QRegularExpression>
#include <QSet>

#include <optional>
#include <vector>

namespace idem {

QStringList builtinProviders()
{
    return {u"generic"_qs, u"stripe"_qs, u"github"_qs, u"shopify"_qs, u"sendgrid"_qs, u"slack"_qs, u"standard"_qs};
}

Result<ListenAddress> ListenAddress::parse(const QString &text)
{
    const qsizetype colon = text.lastIndexOf(u':');
    if (colon <= 0)
        return makeError(ErrorCode::Invalid, u"'%1' is not HOST:PORT"_qs.arg(text));
    QString host = text.left(colon);
    if (host.startsWith(u'[') && host.endsWith(u']'))
        host = host.mid(1, host.size() - 2);
    bool ok = false;
    const uint port = text.mid(colon + 1).toUInt(&ok);
    if (!ok || port > 65535)
        return makeError(ErrorCode::Invalid, u"'%1': the port must be 0-65535"_qs.arg(text));
    ListenAddress address;
    address.port = quint16(port);
    if (host == u"localhost"_qs)
        address.host = QHostAddress::LocalHost;
    else if (!address.host.setAddress(host))
        return makeError(ErrorCode::Invalid, u"'%1': '%2' is not an IP address"_qs.arg(text, host));
    return address;
}

QString ListenAddress::toString() const
{
    const QString h = host.protocol() == QAbstractSocket::IPv6Protocol
                          ? u"["_qs + host.toString() + u"]"_qs
                          : host.toString();
    return h + u":"_qs + QString::number(port);
}

namespace {

// Walks one JSON object, reporting errors as "<file>: <path>: <what>".
class Reader
{
public:
    Reader(QString source, QString path, QJsonObject object)
        : m_source(std::move(source)), m_path(std::move(path)), m_object(std::move(object))
    {}

    std::optional<Error> error;

    QString where(const QString &field) const
    {
        return m_path.isEmpty() ? field : m_path + u"."_qs + field;
    }
    void fail(const QString &field, const QString &what)
    {
        if (!error)
            error = makeError(ErrorCode::Invalid, u"%1: %2: %3"_qs.arg(m_source, where(field), what));
    }
    bool has(const QString &field) const { return m_object.contains(field); }
    QJsonValue value(const QString &field)
    {
        m_seen.insert(field);
        return m_object.value(field);
    }
    void integer(const QString &field, qint64 &out, qint64 min, qint64 max)
    {
        if (!has(field))
            return;
        const QJsonValue v = value(field);
        const double d = v.toDouble(-1e300);
        if (!v.isDouble() || d != double(qint64(d)) || d < double(min) || d > double(max))
            return fail(field, u"must be an integer from %1 to %2"_qs.arg(min).arg(max));
        out = qint64(d);
    }
    void number(const QString &field, double &out, double min, double max)
    {
        if (!has(field))
            return;
        const QJsonValue v = value(field);
        if (!v.isDouble() || v.toDouble() < min || v.toDouble() > max)
            return fail(field, u"must be a number from %1 to %2"_qs.arg(min).arg(max));
        out = v.toDouble();
    }
    void string(const QString &field, QString &out)
    {
        if (!has(field))
            return;
        const QJsonValue v = value(field);
        if (!v.isString())
            return fail(field, u"must be a string"_qs);
        out = v.toString();
    }
    void choice(const QString &field, QString &out, const QStringList &allowed)
    {
        string(field, out);
        if (has(field) && !allowed.contains(out))
            fail(field, u"must be one of \"%1\" (got \"%2\")"_qs.arg(allowed.join(u"\", \""_qs), out));
    }
    QJsonObject object(const QString &field)
    {
        if (!has(field))
            return {};
        const QJsonValue v = value(field);
        if (!v.isObject())
            fail(field, u"must be an object"_qs);
        return v.toObject();
    }
    void finish()
    {
        for (auto it = m_object.begin(); it != m_object.end(); ++it)
            if (!m_seen.contains(it.key()))
                fail(it.key(), u"unknown field"_qs);
    }
    const QString &source() const { return m_source; }

private:
    QString m_source;
    QString m_path;
    QJsonObject m_object;
    QSet<QString> m_seen;
};

void readSettings(Reader &r, EndpointSettings &s)
{
    r.integer(u"ttl_seconds"_qs, s.ttlSeconds, 1, 10LL * 365 * 24 * 3600);
    r.integer(u"lease_seconds"_qs, s.leaseSeconds, 1, 24 * 3600);
    r.integer(u"forward_timeout_seconds"_qs, s.forwardTimeoutSeconds, 1, 3600);
    r.integer(u"max_body_bytes"_qs, s.maxBodyBytes, 1, 1LL << 30);
    r.integer(u"max_response_bytes"_qs, s.maxResponseBytes, 1, 1LL << 30);
    r.integer(u"max_batch_elements"_qs, s.maxBatchElements, 1, 100'000);
    qint64 inProgress = s.inProgressStatus;
    r.integer(u"in_progress_status"_qs, inProgress, 200, 599);
    if (inProgress != 409 && inProgress != 202 && inProgress != 429 && inProgress != 503)
        r.fail(u"in_progress_status"_qs, u"must be 409, 202, 429 or 503"_qs);
    s.inProgressStatus = int(inProgress);
    r.integer(u"signature_tolerance_seconds"_qs, s.signatureToleranceSeconds, 0, 7 * 24 * 3600);
    QString text;
    r.choice(u"on_failed"_qs, text, {u"reprocess"_qs, u"reject"_qs});
    if (!text.isEmpty())
        s.onFailed = text == u"reject"_qs ? OnFailed::Reject : OnFailed::Reprocess;
    text.clear();
    r.choice(u"on_mismatch"_qs, text, {u"reject"_qs, u"ignore"_qs});
    if (!text.isEmpty())
        s.onMismatch = text == u"ignore"_qs ? OnMismatch::Ignore : OnMismatch::Reject;
    text.clear();
    r.choice(u"on_missing_key"_qs, text, {u"reject"_qs, u"passthrough"_qs});
    if (!text.isEmpty())
        s.passthroughMissingKey = text == u"passthrough"_qs;
    // A delivery still being processed must never lose its lease, and a key must outlive it.
    if (s.leaseSeconds < s.forwardTimeoutSeconds + kLeaseMarginSeconds)
        r.fail(u"lease_seconds"_qs,
               u"must be at least forward_timeout_seconds + %1 (%2 + %1 = %3), so that processing ends before its lease; got %4"_qs
                   .arg(kLeaseMarginSeconds)
                   .arg(s.forwardTimeoutSeconds)
                   .arg(s.forwardTimeoutSeconds + kLeaseMarginSeconds)
                   .arg(s.leaseSeconds));
    else if (s.ttlSeconds < s.leaseSeconds)
        r.fail(u"ttl_seconds"_qs, u"must be at least lease_seconds (%1); got %2"_qs.arg(s.leaseSeconds).arg(s.ttlSeconds));
}

bool validPointer(const QString &pointer)
{
    return pointer.isEmpty() || pointer.startsWith(u'/');
}

void readKeySpec(Reader &parent, const QJsonObject &object, const QString &path, KeySpec &key)
{
    Reader r(parent.source(), path, object);
    QString header;
    r.string(u"header"_qs, header);
    if (r.has(u"header"_qs) && !QRegularExpression(u"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$"_qs).match(header).hasMatch())
        r.fail(u"header"_qs, u"is not a valid header name"_qs);
    key.header = header.toLatin1();
    r.string(u"json_pointer"_qs, key.jsonPointer);
    if (!validPointer(key.jsonPointer))
        r.fail(u"json_pointer"_qs, u"must start with '/' (RFC 6901)"_qs);
    if (r.has(u"composite"_qs)) {
        const QJsonValue v = r.value(u"composite"_qs);
        if (!v.isArray() || v.toArray().isEmpty())
            r.fail(u"composite"_qs, u"must be a non-empty array of JSON pointers"_qs);
        for (const auto &item : v.toArray()) {
            // "" is RFC 6901's pointer to the whole document.
            if (!item.isString() || !validPointer(item.toString()))
                r.fail(
                    u"composite"_qs,
                    u"every element must be a JSON pointer: \"\" (the whole body) or one starting with '/'"_qs);
            key.composite.append(item.toString());
        }
    }
    r.finish();
    if (r.error)
        parent.error = parent.error ? parent.error : r.error;
}

// The path of the first member named twice in one object ("endpoints[1].secret"), if any.
// QJsonDocument keeps the last of the two without a word, so a config naming a secret twice
// would run on one of them silently. `json` is valid JSON: QJsonDocument has read it.
std::optional<QString> firstDuplicateMember(const QByteArray &json)
{
    struct Level
    {
        bool object = false;
        QString path;
        QSet<QString> names;
        QString name;        // the object's member being read
        qsizetype index = 0; // the array's element being read
        bool expectName = false;
    };
    std::vector<Level> levels;
    const auto childPath = [&levels] {
        if (levels.empty())
            return QString();
        const Level &l = levels.back();
        if (!l.object)
            return l.path + u"[%1]"_qs.arg(l.index);
        return l.path.isEmpty() ? l.name : l.path + u"."_qs + l.name;
    };
    for (qsizetype i = 0; i < json.size(); ++i) {
        switch (json[i]) {
        case '{':
        case '[':
            levels.push_back({json[i] == '{', childPath(), {}, {}, 0, json[i] == '{'});
            break;
        case '}':
        case ']':
            if (!levels.empty())
                levels.pop_back();
            break;
        case ',':
            if (levels.empty())
                break;
            if (levels.back().object)
                levels.back().expectName = true;
            else
                ++levels.back().index;
            break;
        case '"': {
            const qsizetype start = i;
            for (++i; i < json.size() && json[i] != '"'; ++i)
                if (json[i] == '\\')
                    ++i;
            if (levels.empty())
                break;
            Level &l = levels.back();
            if (!l.object || !l.expectName)
                break;
            l.expectName = false;
            // The name as JSON means it, escapes and all.
            l.name = QJsonDocument::fromJson('[' + json.mid(start, i + 1 - start) + ']')
                         .array()
                         .at(0)
                         .toString();
            if (l.names.contains(l.name))
                return childPath();
            l.names.insert(l.name);
            break;
        }
        default:
            break;
        }
    }
    return std::nullopt;
}

} // namespace

Result<Config> Config::load(const QString &path)
{
    QFile file(path);
    if (!file.open(QIODevice::ReadOnly))
        return makeError(ErrorCode::Invalid,
                         u"%1: cannot read the config file: %2"_qs.arg(path, file.errorString()));
    auto config = parse(file.readAll(), path);
    if (!config)
        return config;
    bool secrets = false;
    for (const EndpointConfig &e : config->endpoints)
        secrets |= !e.secrets.isEmpty() || !e.privateKey.isEmpty();
    if (secrets && (file.permissions() & (QFileDevice::ReadGroup | QFileDevice::ReadOther)))
        config->loadWarnings << u"%1 holds secrets and others may read it: chmod 600 %1"_qs.arg(path);
    return config;
}

namespace {
const std::pair<const char16_t *, std::optional<qint64> ConnectionSettings::*> kConnectionFields[] =
    {
        {u"max_connections_per_client", &ConnectionSettings::maxConnectionsPerClient},
        {u"max_buffered_request_bytes", &ConnectionSettings::maxBufferedRequestBytes},
        {u"min_upload_bytes_per_second", &ConnectionSettings::minUploadBytesPerSecond},
        {u"idle_timeout_seconds", &ConnectionSettings::idleTimeoutSeconds},
        {u"request_timeout_seconds", &ConnectionSettings::requestTimeoutSeconds},
};

void readConnectionSettings(Reader &root, ConnectionSettings &s)
{
    const std::pair<qint64, qint64> ranges[] = {
        {1, 100'000}, {1024, 1LL << 40}, {0, 1LL << 30}, {1, 24 * 3600}, {1, 3600}};
    for (size_t i = 0; i < std::size(kConnectionFields); ++i) {
        const QString field = QString::fromUtf16(kConnectionFields[i].first);
        if (!root.has(field))
            continue;
        qint64 value = 0;
        root.integer(field, value, ranges[i].first, ranges[i].second);
        s.*kConnectionFields[i].second = value;
    }
}
} // namespace

qint64 largestBody(const Config &config)
{
    qint64 largest = config.defaults.maxBodyBytes;
    for (const EndpointConfig &e : config.endpoints)
        largest = std::max(largest, e.settings.maxBodyBytes);
    return largest;
}

Result<Config> Config::parse(const QByteArray &json, const QString &sourceName)
{
    QJsonParseError parseError;
    const QJsonDocument doc = QJsonDocument::fromJson(json, &parseError);
    if (parseError.error != QJsonParseError::NoError)
        return makeError(ErrorCode::Invalid, u"%1: not valid JSON at offset %2: %3"_qs.arg(
                                                 sourceName, QString::number(parseError.offset),
                                                 parseError.errorString()));
    if (!doc.isObject())
        return makeError(ErrorCode::Invalid, u"%1: the config must be a JSON object"_qs.arg(sourceName));
    if (const auto twice = firstDuplicateMember(json))
        return makeError(ErrorCode::Invalid,
                         u"%1: %2: given twice (only one may be given)"_qs.arg(sourceName, *twice));

    Config config;
    config.sourceFile = sourceName;
    Reader root(sourceName, QString(), doc.object());
    QString listen;
    root.string(u"listen"_qs, listen);
    if (!listen.isEmpty()) {
        auto address = ListenAddress::parse(listen);
        if (address)
            config.listen = *address;
        else
            root.fail(u"listen"_qs, address.error().message);
    }
    QString metricsListen;
    root.string(u"metrics_listen"_qs, metricsListen);
    if (!metricsListen.isEmpty()) {
        auto address = ListenAddress::parse(metricsListen);
        if (!address)
            root.fail(u"metrics_listen"_qs, address.error().message);
        // Any host: 0.0.0.0 and 127.0.0.1 on one port are the same listener to the kernel, and
        // metrics next to webhooks on one port is never what is wanted.
        else if (address->port != 0 && address->port == config.listen.port)
            root.fail(
                u"metrics_listen"_qs,
                u"must differ from \"listen\": metrics are never served on the webhook port"_qs);
        else
            config.metricsListen = *address;
    }
    root.string(u"store"_qs, config.store);
    qint64 maxConnections = config.maxConnections;
    root.integer(u"max_connections"_qs, maxConnections, 1, 100000);
    config.maxConnections = int(maxConnections);
    readConnectionSettings(root, config.connections);
    {
        Reader defaults(sourceName, u"defaults"_qs, root.object(u"defaults"_qs));
        readSettings(defaults, config.defaults);
        defaults.finish();
        if (defaults.error && !root.error)
            root.error = defaults.error;
    }

    const bool hasEndpoints = root.has(u"endpoints"_qs);
    const QJsonValue endpoints = root.value(u"endpoints"_qs);
    if (hasEndpoints && !endpoints.isArray())
        root.fail(u"endpoints"_qs, u"must be an array"_qs);
    QSet<QString> names;
    const QJsonArray list = endpoints.toArray();
    for (qsizetype i = 0; i < list.size(); ++i) {
        const QString path = u"endpoints[%1]"_qs.arg(i);
        if (!list.at(i).isObject()) {
            root.fail(path, u"must be an object"_qs);
            continue;
        }
        Reader r(sourceName, path, list.at(i).toObject());
        EndpointConfig e;
        e.settings = config.defaults;
        r.string(u"name"_qs, e.name);
        if (!r.has(u"name"_qs))
            r.fail(u"name"_qs, u"is required"_qs);
        else if (!QRegularExpression(u"^[A-Za-z0-9_.-]{1,64}$"_qs).match(e.name).hasMatch())
            r.fail(u"name"_qs, u"must be 1-64 letters, digits, '_', '.' or '-'"_qs);
        else if (names.contains(e.name))
            r.fail(u"name"_qs, u"\"%1\" is used by another endpoint"_qs.arg(e.name));
        names.insert(e.name);
        e.provider = u"generic"_qs;
        r.choice(u"provider"_qs, e.provider, builtinProviders());
        const bool sendgrid = e.provider == u"sendgrid"_qs;
        auto strings = [&](const QString &field, const QString &what) {
            QStringList values;
            const QJsonValue v = r.value(field);
            if (v.isString() && !v.toString().isEmpty()) {
                values = {v.toString()};
            } else if (v.isArray() && !v.toArray().isEmpty()) {
                for (const auto &item : v.toArray()) {
                    if (!item.isString() || item.toString().isEmpty())
                        r.fail(field, u"every %1 must be a non-empty string"_qs.arg(what));
                    values.append(item.toString());
                }
            } else {
                r.fail(field, u"must be a non-empty string or an array of them (rotation)"_qs);
            }
            return values;
        };
        if (r.has(u"secret"_qs)) {
            if (sendgrid)
                r.fail(u"secret"_qs, u"sendgrid signs with ECDSA: give its verification key as public_key"_qs);
            e.secrets = strings(u"secret"_qs, u"secret"_qs);
            if (e.provider == u"standard"_qs)
                for (const QString &secret : std::as_const(e.secrets)) {
                    const QString b64 = secret.startsWith(u"whsec_"_qs) ? secret.mid(6) : secret;
                    if (QByteArray::fromBase64Encoding(b64.toLatin1(), QByteArray::AbortOnBase64DecodingErrors).decodingStatus
                            != QByteArray::Base64DecodingStatus::Ok || b64.isEmpty())
                        r.fail(u"secret"_qs, u"a Standard Webhooks secret is whsec_ followed by base64"_qs);
                }
        }
        if (r.has(u"public_key"_qs)) {
            if (!sendgrid)
                r.fail(u"public_key"_qs, u"only the sendgrid provider verifies with a public key"_qs);
            for (const QString &key : strings(u"public_key"_qs, u"public key"_qs)) {
                if (auto ok = checkEcPublicKey(key.toLatin1()); !ok)
                    r.fail(u"public_key"_qs, ok.error().message);
                e.publicKeys.append(key.toLatin1());
            }
        }
        if (r.has(u"private_key"_qs)) {
            if (!sendgrid)
                r.fail(u"private_key"_qs, u"only the sendgrid provider has a private key (for storms)"_qs);
            QString pem;
            r.string(u"private_key"_qs, pem);
            if (auto ok = checkEcPrivateKey(pem.toLatin1()); !ok)
                r.fail(u"private_key"_qs, ok.error().message);
            e.privateKey = pem.toLatin1();
        }
        QString signatureHeader;
        r.string(u"signature_header"_qs, signatureHeader);
        if (r.has(u"signature_header"_qs) && e.provider != u"generic"_qs)
            r.fail(u"signature_header"_qs, u"only the generic provider's signature header can be chosen"_qs);
        e.signatureHeader = signatureHeader.isEmpty() ? QByteArray("X-Signature-256") : signatureHeader.toLatin1();
        if (r.has(u"type_pointer"_qs)) {
            r.string(u"type_pointer"_qs, e.typePointer);
            if (e.provider != u"generic"_qs)
                r.fail(u"type_pointer"_qs, u"only the generic provider's event type can be chosen "
                                           u"(the others read it where their sender puts it)"_qs);
            else if (!validPointer(e.typePointer))
                r.fail(u"type_pointer"_qs,
                       u"must be \"\" (no type) or start with '/' (RFC 6901)"_qs);
        }
        QString forward;
        r.string(u"forward_to"_qs, forward);
        if (!forward.isEmpty()) {
            e.forwardTo = QUrl(forward, QUrl::StrictMode);
            if (!e.forwardTo.isValid() || e.forwardTo.host().isEmpty()
                || (e.forwardTo.scheme() != u"http"_qs && e.forwardTo.scheme() != u"https"_qs))
                r.fail(u"forward_to"_qs, u"must be an http:// or https:// URL (got \"%1\")"_qs.arg(displayUrl(forward)));
        }
        if (r.has(u"simulate"_qs)) {
            if (!forward.isEmpty())
                r.fail(u"simulate"_qs, u"cannot be combined with forward_to"_qs);
            Reader s(sourceName, path + u".simulate"_qs, r.object(u"simulate"_qs));
            qint64 delay = 0;
            s.integer(u"delay_ms"_qs, delay, 0, 600'000);
            e.simulate.delayMs = int(delay);
            s.number(u"fail_rate"_qs, e.simulate.failRate, 0.0, 1.0);
            s.finish();
            if (s.error && !r.error)
                r.error = s.error;
        }
        if (r.has(u"key"_qs)) {
            // GitHub's and Shopify's id headers are outside their signature: a key read from the
            // signed body instead keeps a captured body re-sent under a fresh id a duplicate.
            const bool bodyOnly = e.provider == u"github"_qs || e.provider == u"shopify"_qs;
            if (e.provider != u"generic"_qs && !bodyOnly)
                r.fail(
                    u"key"_qs,
                    u"only the generic, github and shopify providers' key can be configured; %1 keys come from the provider"_qs
                        .arg(e.provider));
            readKeySpec(r, r.object(u"key"_qs), path + u".key"_qs, e.key);
            if (bodyOnly && (!e.key.header.isEmpty() || !e.key.readsBody()))
                r.fail(u"key"_qs,
                       u"a %1 key is read from the signed body: give json_pointer or composite "
                       u"(no header: none but the body is signed)"_qs.arg(e.provider));
        }
        readSettings(r, e.settings);
        if (r.has(u"max_batch_elements"_qs) && !sendgrid)
            r.fail(u"max_batch_elements"_qs,
                   u"only batch providers (sendgrid) take it; a %1 delivery is one event"_qs.arg(
                       e.provider));
        r.finish();
        if (r.error && !root.error)
            root.error = r.error;
        config.endpoints.append(e);
    }
    root.finish();
    if (const qint64 largest = largestBody(config);
        !root.error && config.connections.maxBufferedRequestBytes &&
        *config.connections.maxBufferedRequestBytes < largest)
        root.fail(u"max_buffered_request_bytes"_qs,
                  u"must be at least the largest max_body_bytes (%1): such a body could never "
                  "be received"_qs.arg(largest));
    if (root.error)
        return *root.error;
    if (!hasEndpoints) {
        const EndpointSettings defaults = config.defaults;
        config.endpoints = builtin().endpoints;
        for (auto &e : config.endpoints)
            e.settings = defaults;
    }
    return config;
}

Config Config::builtin()
{
    Config config;
    for (const QString &provider : builtinProviders()) {
        EndpointConfig e;
        e.name = provider;
        e.provider = provider;
        e.signatureHeader = "X-Signature-256";
        config.endpoints.append(e);
    }
    return config;
}

namespace {
void writeSettings(QJsonObject &o, const EndpointSettings &s)
{
    o.insert(u"ttl_seconds"_qs, s.ttlSeconds);
    o.insert(u"lease_seconds"_qs, s.leaseSeconds);
    o.insert(u"forward_timeout_seconds"_qs, s.forwardTimeoutSeconds);
    o.insert(u"max_body_bytes"_qs, s.maxBodyBytes);
    o.insert(u"max_response_bytes"_qs, s.maxResponseBytes);
    o.insert(u"max_batch_elements"_qs, s.maxBatchElements);
    o.insert(u"in_progress_status"_qs, s.inProgressStatus);
    o.insert(u"signature_tolerance_seconds"_qs, s.signatureToleranceSeconds);
    o.insert(u"on_failed"_qs, s.onFailed == OnFailed::Reject ? u"reject"_qs : u"reprocess"_qs);
    o.insert(u"on_mismatch"_qs, s.onMismatch == OnMismatch::Ignore ? u"ignore"_qs : u"reject"_qs);
    o.insert(u"on_missing_key"_qs, s.passthroughMissingKey ? u"passthrough"_qs : u"reject"_qs);
}
} // namespace

QJsonObject Config::toJson() const
{
    QJsonObject root{{u"listen"_qs, listen.toString()}, {u"max_connections"_qs, maxConnections}};
    if (!store.isEmpty())
        root.insert(u"store"_qs, store);
    if (metricsListen)
        root.insert(u"metrics_listen"_qs, metricsListen->toString());
    for (const auto &[field, member] : kConnectionFields)
        if (const std::optional<qint64> &value = connections.*member)
            root.insert(QString::fromUtf16(field), *value);
    QJsonObject d;
    writeSettings(d, defaults);
    root.insert(u"defaults"_qs, d);
    QJsonArray list;
    for (const EndpointConfig &e : endpoints) {
        QJsonObject o{{u"name"_qs, e.name}, {u"provider"_qs, e.provider}};
        if (!e.secrets.isEmpty())
            o.insert(u"secret"_qs, e.secrets.size() == 1 ? QJsonValue(e.secrets.first()) : QJsonValue(QJsonArray::fromStringList(e.secrets)));
        if (!e.publicKeys.isEmpty()) {
            QJsonArray keys;
            for (const QByteArray &k : e.publicKeys)
                keys.append(QString::fromLatin1(k));
            o.insert(u"public_key"_qs, keys);
        }
        if (!e.privateKey.isEmpty())
            o.insert(u"private_key"_qs, QString::fromLatin1(e.privateKey));
        if (e.provider == u"generic"_qs && e.signatureHeader != "X-Signature-256")
            o.insert(u"signature_header"_qs, QString::fromLatin1(e.signatureHeader));
        if (e.provider == u"generic"_qs && e.typePointer != u"/type"_qs)
            o.insert(u"type_pointer"_qs, e.typePointer);
        if (!e.forwardTo.isEmpty())
            o.insert(u"forward_to"_qs, e.forwardTo.toString());
        else if (e.simulate.delayMs || e.simulate.failRate > 0)
            o.insert(u"simulate"_qs, QJsonObject{{u"delay_ms"_qs, e.simulate.delayMs}, {u"fail_rate"_qs, e.simulate.failRate}});
        if (!e.key.header.isEmpty() || !e.key.jsonPointer.isEmpty() || !e.key.composite.isEmpty()) {
            QJsonObject k;
            if (!e.key.header.isEmpty())
                k.insert(u"header"_qs, QString::fromLatin1(e.key.header));
            if (!e.key.jsonPointer.isEmpty())
                k.insert(u"json_pointer"_qs, e.key.jsonPointer);
            if (!e.key.composite.isEmpty())
                k.insert(u"composite"_qs, QJsonArray::fromStringList(e.key.composite));
            o.insert(u"key"_qs, k);
        }
        writeSettings(o, e.settings);
        if (e.provider != u"sendgrid"_qs) // a batch's setting, refused on other endpoints
            o.remove(u"max_batch_elements"_qs);
        list.append(o);
    }
    root.insert(u"endpoints"_qs, list);
    return root;
}

const EndpointConfig *Config::endpoint(QStringView name) const
{
    for (const auto &e : endpoints)
        if (e.name == name)
            return &e;
    return nullptr;
}

} // namespace idem
