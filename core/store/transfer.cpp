#include "store/transfer.h"

#include "providers/provider.h"
#include "util/crypto.h"
#include "util/format.h"

#include <QHash>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QRegularExpression>
#include <QSet>

#include <algorithm>

namespace idem {

namespace {

QString base64(const QByteArray &bytes)
{
    return QString::fromLatin1(bytes.toBase64());
}

std::optional<QByteArray> fromBase64(const QJsonValue &value)
{
    if (value.isUndefined() || value.isNull())
        return QByteArray();
    if (!value.isString())
        return std::nullopt;
    auto decoded = QByteArray::fromBase64Encoding(value.toString().toLatin1(),
                                                  QByteArray::AbortOnBase64DecodingErrors);
    if (!decoded)
        return std::nullopt;
    return *decoded;
}

QJsonObject timelineEntry(const DeliveryEvent &event)
{
    QJsonObject o = deliveryToJson(event);
    if (!event.payload.isEmpty())
        o.insert(u"payload_base64"_qs, base64(event.payload));
    return o;
}

Error invalid(const QString &what)
{
    return makeError(ErrorCode::Invalid, what);
}

// A JSON number that is an integer in [lo, hi] (JSON has no integer type: 1.5 and "1" are not).
std::optional<qint64> integerIn(const QJsonValue &v, qint64 lo, qint64 hi)
{
    if (!v.isDouble())
        return std::nullopt;
    const double d = v.toDouble();
    if (d != double(qint64(d)) || d < double(lo) || d > double(hi))
        return std::nullopt;
    return qint64(d);
}

bool hasControl(QStringView text)
{
    return std::any_of(text.begin(), text.end(),
                       [](QChar c) { return c.unicode() < 0x20 || c.unicode() == 0x7f; });
}

// Headers as the stores keep them: [[name, value], …] of Latin-1 strings, no CR or LF.
std::optional<HeaderList> headersIn(const QJsonValue &v)
{
    if (v.isUndefined())
        return HeaderList();
    if (!v.isArray())
        return std::nullopt;
    const HeaderList headers = headersFromJson(v.toArray());
    if (headersToJson(headers) != v.toArray())
        return std::nullopt; // not pairs of strings, or not Latin-1
    for (const auto &[name, value] : headers)
        if (name.isEmpty() || name.contains('\r') || name.contains('\n') || name.contains(':') ||
            value.contains('\r') || value.contains('\n'))
            return std::nullopt;
    return headers;
}

constexpr qint64 kMaxTimeMs = 253402300799999; // 9999-12-31, what every store's columns hold
constexpr qint64 kMaxText = 64 * 1024;         // an error or a detail: longer is not ours

bool isFingerprint(const QByteArray &f)
{
    static const QRegularExpression hex(u"\\A[0-9a-f]{64}\\z"_qs);
    return hex.match(QString::fromLatin1(f)).hasMatch();
}

// What the import keeps of the line's history and timeline: the history's first entry and its
// newest, the timeline's deliveries as "delivered" entries marked imported, all in time order,
// at most kHistoryCap.
Result<QList<HistoryEntry>> importedHistory(const QString &key, const QJsonValue &historyValue,
                                            const QJsonValue &timelineValue)
{
    if (!historyValue.isArray() || (!timelineValue.isUndefined() && !timelineValue.isArray()))
        return invalid(u"%1: history and timeline must be arrays"_qs.arg(key));
    // An event is a word of the stores' ("claimed", "force-failed"): nothing a file makes up
    // can pass for a line of its own in `keys show`.
    static const QRegularExpression eventName(u"\\A[a-z][a-z-]{0,31}\\z"_qs);
    QList<HistoryEntry> entries;
    for (const QJsonValue &value : historyValue.toArray()) {
        const QJsonObject e = value.toObject();
        const auto at = integerIn(e.value(u"at"), 0, kMaxTimeMs);
        const auto token = integerIn(e.value(u"token"), 0, std::numeric_limits<qint64>::max() / 2);
        const QJsonValue detail = e.value(u"detail");
        if (!value.isObject() || !at || !token || !e.value(u"event").isString() ||
            !eventName.match(e.value(u"event").toString()).hasMatch() ||
            (!detail.isUndefined() && !detail.isString()) || detail.toString().size() > kMaxText)
            return invalid(u"%1: a history entry is not {at, event, token, detail}"_qs.arg(key));
        entries.append({*at, e.value(u"event").toString(), *token, detail.toString()});
    }
    const qsizetype own = entries.size();
    const QJsonArray timeline = timelineValue.toArray();
    if (timeline.size() > kTimelineCap)
        return invalid(u"%1: the timeline has %2 entries, at most %3 are taken"_qs.arg(key)
                           .arg(timeline.size())
                           .arg(kTimelineCap));
    for (const QJsonValue &value : timeline) {
        const QJsonObject e = value.toObject();
        const auto at = integerIn(e.value(u"at"), 0, kMaxTimeMs);
        const auto outcome = outcomeFromString(e.value(u"outcome").toString());
        const auto status = integerIn(e.value(u"status"), 0, 599);
        const auto latency = integerIn(e.value(u"latency_us"), 0, kMaxTimeMs);
        if (!value.isObject() || !at || !outcome || !status ||
            (!e.value(u"latency_us").isUndefined() && !latency))
            return invalid(
                u"%1: a timeline entry is not {at, outcome, status, latency_us, …}"_qs.arg(key));
        // Whatever key or endpoint the entry names, it is this record's delivery.
        QString detail = u"imported: %1 %2"_qs.arg(toString(*outcome)).arg(*status);
        if (latency)
            detail += u" in %1 ms"_qs.arg(double(*latency) / 1000.0, 0, 'f', 1);
        const QString instance = e.value(u"instance").toString().left(256);
        if (!instance.isEmpty())
            detail += u" (instance %1)"_qs.arg(instance);
        entries.append(
            {*at, u"delivered"_qs,
             integerIn(e.value(u"token"), 0, std::numeric_limits<qint64>::max() / 2).value_or(0),
             detail});
    }
    if (entries.isEmpty())
        return entries;
    // The record's own transitions first (claimed, completed, failed: its story); of another
    // desk's deliveries, only the newest that still fit under the cap.
    QList<HistoryEntry> delivered = entries.mid(own);
    entries.resize(own);
    std::stable_sort(delivered.begin(), delivered.end(),
                     [](const HistoryEntry &a, const HistoryEntry &b) { return a.atMs < b.atMs; });
    const qsizetype room =
        std::max<qsizetype>(0, kHistoryCap - std::min<qsizetype>(own, kHistoryCap));
    entries += delivered.mid(std::max<qsizetype>(0, delivered.size() - room));
    if (entries.isEmpty())
        return entries;
    const HistoryEntry first = entries.takeFirst(); // how it started: kept, as the stores keep it
    std::stable_sort(entries.begin(), entries.end(),
                     [](const HistoryEntry &a, const HistoryEntry &b) { return a.atMs < b.atMs; });
    QList<HistoryEntry> kept{first};
    for (const HistoryEntry &e : std::as_const(entries))
        appendHistory(kept, e);
    return kept;
}

} // namespace

QByteArray exportLine(const KeyRecord &r, const QList<DeliveryEvent> &timeline, qint64 now)
{
    QJsonObject record{{u"key"_qs, r.key},
                       {u"endpoint"_qs, r.endpoint},
                       {u"provider"_qs, r.provider},
                       {u"state"_qs, toString(r.state)},
                       {u"fingerprint"_qs, QString::fromLatin1(r.fingerprint)},
                       {u"token"_qs, r.token},
                       {u"attempts"_qs, r.attempts},
                       {u"created"_qs, r.createdMs},
                       {u"updated"_qs, r.updatedMs},
                       {u"expires_at"_qs, r.expiresAtMs},
                       {u"ttl_ms"_qs, r.expiresAtMs - now},
                       {u"lease_ms"_qs, r.state == KeyState::Processing
                                            ? std::max<qint64>(0, r.leaseUntilMs - now)
                                            : 0},
                       {u"error"_qs, r.error}};
    if (!r.type.isEmpty()) // absent: the event named none (as in exports from before types)
        record.insert(u"type"_qs, r.type);
    QJsonArray events;
    for (const DeliveryEvent &e : timeline)
        events.append(timelineEntry(e));
    const QJsonObject line{
        {u"record"_qs, record},
        {u"request"_qs, QJsonObject{{u"method"_qs, QString::fromLatin1(r.request.method)},
                                    {u"path"_qs, QString::fromUtf8(r.request.path)},
                                    {u"headers"_qs, headersToJson(r.request.headers)},
                                    {u"body_base64"_qs, base64(r.request.body)}}},
        {u"result"_qs, QJsonObject{{u"status"_qs, r.result.status},
                                   {u"headers"_qs, headersToJson(r.result.headers)},
                                   {u"body_base64"_qs, base64(r.result.body)}}},
        {u"history"_qs, historyToJson(r.history)},
        {u"timeline"_qs, events}};
    return QJsonDocument(line).toJson(QJsonDocument::Compact);
}

Result<ExportReport> exportKeys(IdempotencyStore &store, const KeyQuery &filter,
                                const QStringList &keys,
                                const std::function<void(const QByteArray &line)> &write,
                                const std::atomic<bool> *cancel)
{
    // Named keys as given (each once); else the filter's, collected in one pass first, so a
    // key that moves in the listing's order while deliveries arrive is neither lost nor
    // written twice.
    QStringList names;
    const bool named = !keys.isEmpty();
    if (named) {
        QSet<QString> seen;
        for (const QString &key : keys)
            if (!seen.contains(key)) {
                seen.insert(key);
                names << key;
            }
    } else {
        auto all = store.keyNames(filter);
        if (!all)
            return all.error();
        names = *all;
    }
    // A log without a per-key index (Redis' stream) is read once, not once per key.
    std::optional<QHash<QString, QList<DeliveryEvent>>> byKey;
    if (!store.deliveriesIndexedByKey() && names.size() > 1) {
        DeliveryQuery all;
        all.endpoint = named ? QString() : filter.endpoint;
        all.limit = std::numeric_limits<int>::max(); // the stream is capped: all of it
        auto events = store.deliveries(all);
        if (!events)
            return events.error();
        byKey.emplace();
        for (const DeliveryEvent &e : std::as_const(*events)) {
            auto &list = (*byKey)[e.key];
            if (list.size() < kTimelineCap)
                list.append(e); // newest first, as deliveries() answers
        }
    }
    ExportReport report;
    for (const QString &name : std::as_const(names)) {
        if (cancel && cancel->load())
            return makeError(ErrorCode::Invalid, u"export cancelled after %1"_qs.arg(
                                                     countOf(report.written, u"key", u"keys")));
        auto record = store.key(name);
        if (!record)
            return record.error();
        // The clock each record's TTL and lease are measured on: read after the record, so
        // what is left is never more than it was.
        auto now = store.clockMs();
        if (!now)
            return now.error();
        if (!record->has_value() || (*record)->expiredAt(*now)) {
            if (named)
                report.missing << name;
            continue; // deleted or expired meanwhile
        }
        const KeyRecord &r = **record;
        if (!named && ((filter.state && r.state != *filter.state) ||
                       (!filter.endpoint.isEmpty() && r.endpoint != filter.endpoint)))
            continue; // left the filter since it was listed
        if (const QString lost = lostSharedContent(r); !lost.isEmpty()) {
            report.incomplete << u"%1: %2"_qs.arg(r.key, lost);
            continue;
        }
        QList<DeliveryEvent> newestFirst;
        if (byKey) {
            newestFirst = byKey->value(r.key);
        } else {
            DeliveryQuery q;
            q.key = r.key;
            q.limit = kTimelineCap;
            auto events = store.deliveries(q);
            if (!events)
                return events.error();
            newestFirst = *events;
        }
        const QList<DeliveryEvent> oldestFirst(newestFirst.crbegin(), newestFirst.crend());
        write(exportLine(r, oldestFirst, *now));
        ++report.written;
    }
    return report;
}

Result<ImportedLine> importLine(IdempotencyStore &store, const QByteArray &line,
                                const Config &config, const QHash<QString, qint64> &earlier)
{
    QJsonParseError error;
    const QJsonDocument doc = QJsonDocument::fromJson(line, &error);
    if (error.error != QJsonParseError::NoError)
        return invalid(u"not JSON (%1 at offset %2)"_qs.arg(error.errorString()).arg(error.offset));
    if (!doc.isObject())
        return invalid(u"not a JSON object: not a line of `idemdesk keys export`"_qs);
    const QJsonObject o = doc.object();
    const QJsonValue recValue = o.value(u"record"), reqValue = o.value(u"request"),
                     resValue = o.value(u"result");
    if (!recValue.isObject() || !reqValue.isObject() || !resValue.isObject())
        return invalid(
            u"record, request and result must be objects: not a line of `idemdesk keys export`"_qs);
    const QJsonObject rec = recValue.toObject(), req = reqValue.toObject(),
                      res = resValue.toObject();
    KeyRecord r;
    r.key = rec.value(u"key").toString();
    if (r.key.isEmpty())
        return invalid(u"no record.key: not a line of `idemdesk keys export`"_qs);
    const QString shown = escapeControls(r.key.left(300));
    r.endpoint = rec.value(u"endpoint").toString();
    if (r.endpoint.isEmpty() || !r.key.startsWith(r.endpoint + u':'))
        return invalid(u"%1: record.key must be record.endpoint ':' key (endpoint '%2')"_qs.arg(
            shown, escapeControls(r.endpoint.left(100))));
    // An endpoint name the config could hold (a ':' in it would make its keys another's).
    static const QRegularExpression endpointName(u"\\A[A-Za-z0-9_.-]{1,64}\\z"_qs);
    if (!endpointName.match(r.endpoint).hasMatch())
        return invalid(
            u"%1: record.endpoint '%2' is not an endpoint name ([A-Za-z0-9_.-], at most 64)"_qs.arg(
                shown, escapeControls(r.endpoint.left(100))));
    // The receiver's own rule for a key: printable ASCII, at most 255 with the endpoint.
    auto keyed = namespacedKey(r.endpoint, r.key.mid(r.endpoint.size() + 1));
    if (!keyed || *keyed != r.key)
        return invalid(u"%1: not a key the receiver would store (%2)"_qs.arg(
            shown, keyed ? u"spaces around it"_qs : keyed.error().message));
    if (const auto line = earlier.constFind(r.key); line != earlier.cend())
        return invalid(u"%1: the same key as line %2"_qs.arg(shown, QString::number(*line)));
    r.provider = rec.value(u"provider").toString();
    if (!builtinProviders().contains(r.provider))
        return invalid(u"%1: record.provider '%2' is not one of %3"_qs.arg(
            shown, escapeControls(r.provider.left(100)), builtinProviders().join(u", "_qs)));
    if (const EndpointConfig *configured = config.endpoint(r.endpoint);
        configured && configured->provider != r.provider)
        return invalid(u"%1: record.provider '%2', but endpoint %3 here is %4"_qs.arg(
            shown, r.provider, r.endpoint, configured->provider));
    const auto state = keyStateFromString(rec.value(u"state").toString());
    if (!state)
        return invalid(
            u"%1: record.state must be processing, completed, failed or reset"_qs.arg(shown));
    r.state = *state;
    r.fingerprint = rec.value(u"fingerprint").toString().toLatin1();
    if (!isFingerprint(r.fingerprint))
        return invalid(u"%1: record.fingerprint must be a SHA-256 in lower-case hex"_qs.arg(shown));
    const auto attempts = integerIn(rec.value(u"attempts"), 1, std::numeric_limits<int>::max());
    const auto created = integerIn(rec.value(u"created"), 0, kMaxTimeMs);
    const auto updated = integerIn(rec.value(u"updated"), 0, kMaxTimeMs);
    if (!attempts || !created || !updated)
        return invalid(
            u"%1: record.attempts (≥ 1), created and updated (ms) must be integers"_qs.arg(shown));
    r.attempts = int(*attempts);
    // The token the app last saw for the key: the importing store's are above it.
    const QJsonValue tokenValue = rec.value(u"token");
    const auto carried = integerIn(tokenValue, 0, kMaxImportToken);
    if (!tokenValue.isUndefined() && !carried)
        return invalid(
            u"%1: record.token must be an integer from 0 to %2"_qs.arg(shown).arg(kMaxImportToken));
    r.token = carried.value_or(0);
    r.createdMs = *created;
    r.updatedMs = *updated;
    const QJsonValue errorValue = rec.value(u"error");
    if ((!errorValue.isUndefined() && !errorValue.isString()) ||
        errorValue.toString().size() > kMaxText)
        return invalid(
            u"%1: record.error must be a string of at most %2 characters"_qs.arg(shown).arg(
                kMaxText));
    r.error = errorValue.toString();
    // Optional (exports written before types were kept have none); kept as the receiver keeps
    // a sender's type, printable and bounded, so a hand-edited line cannot put more in a list.
    const QJsonValue typeValue = rec.value(u"type");
    if (!typeValue.isUndefined() && !typeValue.isString())
        return invalid(u"%1: record.type must be a string"_qs.arg(shown));
    r.type = eventTypeText(typeValue.toString());
    const QJsonValue ttlValue = rec.value(u"ttl_ms"), leaseValue = rec.value(u"lease_ms");
    const auto ttlMs = integerIn(ttlValue, std::numeric_limits<qint64>::min() / 2, kMaxImportTtlMs);
    const auto leaseMs = integerIn(leaseValue, 0, std::min(kMaxImportLeaseMs, ttlMs.value_or(0)));
    if (!ttlMs)
        return invalid(
            u"%1: record.ttl_ms must be an integer of at most %2 (10 years)"_qs.arg(shown).arg(
                kMaxImportTtlMs));
    if (*ttlMs <= 0)
        return invalid(u"%1: expired when it was exported (ttl_ms %2)"_qs.arg(shown).arg(*ttlMs));
    if (!leaseMs)
        return invalid(
            u"%1: record.lease_ms must be an integer from 0 to the TTL and 24 h"_qs.arg(shown));

    // The request and result as the receiver would have stored them for this endpoint.
    const EndpointConfig *endpoint = config.endpoint(r.endpoint);
    const EndpointSettings &limits = endpoint ? endpoint->settings : config.defaults;
    const QString method = req.value(u"method").toString();
    // RFC 9110's rule: a token (which admits ` and $: Copy as curl quotes it all the same).
    if (method.size() > 32 || !isHttpToken(method.toLatin1()))
        return invalid(u"%1: request.method '%2' is not an HTTP method"_qs.arg(
            shown, escapeControls(method.left(40))));
    const QString path = req.value(u"path").toString();
    if (!path.startsWith(u'/') || hasControl(path) || path.size() > 8192)
        return invalid(u"%1: request.path must start with '/', hold no control characters "
                       u"(line breaks) and be at most 8 KiB"_qs.arg(shown));
    r.request.method = method.toLatin1();
    r.request.path = path.toUtf8();
    const auto requestHeaders = headersIn(req.value(u"headers"));
    const auto resultHeaders = headersIn(res.value(u"headers"));
    if (!requestHeaders || !resultHeaders)
        return invalid(
            u"%1: headers must be [[name, value], …] of Latin-1 strings without line breaks"_qs.arg(
                shown));
    r.request.headers = *requestHeaders;
    r.result.headers = *resultHeaders;
    const bool finished = r.state == KeyState::Completed || r.state == KeyState::Failed;
    const auto status = integerIn(res.value(u"status"), 0, 599);
    if (!status || (*status != 0 && *status < 100) || (finished && *status == 0))
        return invalid(u"%1: result.status must be 100–599%2"_qs.arg(
            shown, finished ? u" for a "_qs + toString(r.state) + u" key"_qs : u" (or 0)"_qs));
    r.result.status = int(*status);
    const auto requestBody = fromBase64(req.value(u"body_base64"));
    const auto resultBody = fromBase64(res.value(u"body_base64"));
    if (!requestBody || !resultBody)
        return invalid(u"%1: a body_base64 is not base64"_qs.arg(shown));
    if (requestBody->size() > limits.maxBodyBytes || resultBody->size() > limits.maxResponseBytes)
        return invalid(u"%1: a body is longer than the endpoint allows (request %2 of %3 bytes, "
                       u"result %4 of %5)"_qs.arg(shown)
                           .arg(requestBody->size())
                           .arg(limits.maxBodyBytes)
                           .arg(resultBody->size())
                           .arg(limits.maxResponseBytes));
    r.request.body = *requestBody;
    r.result.body = *resultBody;
    // The fingerprint is the receiver's: the SHA-256 of the stored body (a SendGrid element's is
    // its event's). Another would answer 422 to the very body the record shows.
    if (r.provider != u"sendgrid"_qs && r.fingerprint != sha256Hex(r.request.body))
        return invalid(u"%1: record.fingerprint is not the SHA-256 of request.body"_qs.arg(shown));
    auto history = importedHistory(shown, o.value(u"history"), o.value(u"timeline"));
    if (!history)
        return history.error();
    r.history = *history;
    auto verdict = store.importRecord(r, *ttlMs, r.state == KeyState::Processing ? *leaseMs : 0);
    if (!verdict)
        return verdict.error();
    return ImportedLine{r.key, *verdict};
}

qint64 maxImportLine(const Config &config)
{
    qint64 body = config.defaults.maxBodyBytes, response = config.defaults.maxResponseBytes;
    for (const EndpointConfig &e : config.endpoints) {
        body = std::max(body, e.settings.maxBodyBytes);
        response = std::max(response, e.settings.maxResponseBytes);
    }
    // Base64 is 4/3; JSON may escape the rest (headers, history, timeline) 6 to 1.
    return (body + response) * 4 / 3 + 8 * 1024 * 1024;
}

ImportReport importLines(IdempotencyStore &store, QIODevice &in, const Config &config,
                         const std::function<void(qint64, const Result<ImportedLine> &)> &onLine,
                         const std::atomic<bool> *cancel)
{
    ImportReport report;
    const qint64 cap = maxImportLine(config);
    QHash<QString, qint64> firstLine; // key → the line that had it
    qint64 number = 0;
    while (!in.atEnd()) {
        if (cancel && cancel->load()) {
            report.stopped = u"cancelled after line %1"_qs.arg(number);
            return report;
        }
        ++number;
        // A piece at a time (readLine(n) would reserve n bytes up front), up to the cap.
        QByteArray line;
        bool tooLong = false;
        while (!in.atEnd() && !line.endsWith('\n')) {
            const QByteArray piece = in.readLine(64 * 1024 + 1);
            if (!tooLong && line.size() + piece.size() > cap + 1) {
                tooLong = true;
                line.clear(); // read past the rest without keeping it
            }
            if (tooLong) {
                if (piece.endsWith('\n'))
                    break;
                continue;
            }
            line += piece;
        }
        if (tooLong) {
            ++report.refused;
            onLine(number, invalid(u"longer than %1 bytes: not taken"_qs.arg(cap)));
            continue;
        }
        line = line.trimmed();
        if (line.isEmpty())
            continue;
        auto done = importLine(store, line, config, firstLine);
        if (done) {
            firstLine.insert(done->key, number);
        } else if (done.error().code != ErrorCode::Invalid && !store.ping()) {
            // The store is gone: what went in went in, nothing more can.
            report.stopped = u"line %1: %2; stopped there (%3 imported, %4 already here, %5 "
                             u"refused)"_qs.arg(number)
                                 .arg(done.error().message)
                                 .arg(report.imported)
                                 .arg(report.existing)
                                 .arg(report.refused);
            return report;
        }
        if (!done)
            ++report.refused;
        else if (done->verdict == ImportVerdict::Imported)
            ++report.imported;
        else
            ++report.existing;
        onLine(number, done);
    }
    return report;
}

} // namespace idem
