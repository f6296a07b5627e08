#include "store/transfer.h"

#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>

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

Result<qint64> exportKeys(IdempotencyStore &store, const KeyQuery &filter, const QStringList &keys,
                          const std::function<void(const QByteArray &line)> &write)
{
    auto now = store.clockMs();
    if (!now)
        return now.error();
    auto one = [&](const KeyRecord &record) -> Result<void> {
        DeliveryQuery q;
        q.key = record.key;
        q.limit = 500;
        auto events = store.deliveries(q);
        if (!events)
            return events.error();
        QList<DeliveryEvent> oldestFirst(events->crbegin(), events->crend());
        write(exportLine(record, oldestFirst, *now));
        return {};
    };
    qint64 written = 0;
    if (!keys.isEmpty()) {
        for (const QString &key : keys) {
            auto record = store.key(key);
            if (!record)
                return record.error();
            if (!record->has_value())
                continue; // deleted or expired meanwhile
            if (auto done = one(**record); !done)
                return done.error();
            ++written;
        }
        return written;
    }
    // Full records a page at a time; the filter's state, endpoint and glob.
    KeyQuery page = filter;
    page.limit = 500;
    for (page.offset = 0;; page.offset += page.limit) {
        auto rows = store.listKeys(page);
        if (!rows)
            return rows.error();
        for (const KeyRecord &summary : std::as_const(*rows)) {
            auto record = store.key(summary.key); // the listing may leave request and result out
            if (!record)
                return record.error();
            if (!record->has_value())
                continue;
            if (auto done = one(**record); !done)
                return done.error();
            ++written;
        }
        if (rows->size() < page.limit)
            return written;
    }
}

Result<ImportedLine> importLine(IdempotencyStore &store, const QByteArray &line)
{
    QJsonParseError error;
    const QJsonDocument doc = QJsonDocument::fromJson(line, &error);
    if (error.error != QJsonParseError::NoError)
        return invalid(u"not JSON (%1 at offset %2)"_qs.arg(error.errorString()).arg(error.offset));
    const QJsonObject o = doc.object();
    const QJsonObject rec = o.value(u"record").toObject();
    const QJsonObject req = o.value(u"request").toObject();
    const QJsonObject res = o.value(u"result").toObject();
    KeyRecord r;
    r.key = rec.value(u"key").toString();
    if (r.key.isEmpty())
        return invalid(u"no record.key: not a line of `idemdesk keys export`"_qs);
    r.endpoint = rec.value(u"endpoint").toString();
    r.provider = rec.value(u"provider").toString();
    const auto state = keyStateFromString(rec.value(u"state").toString());
    if (!state)
        return invalid(
            u"%1: record.state must be processing, completed, failed or reset"_qs.arg(r.key));
    r.state = *state;
    r.fingerprint = rec.value(u"fingerprint").toString().toLatin1();
    r.attempts = rec.value(u"attempts").toInt();
    r.createdMs = rec.value(u"created").toInteger();
    r.updatedMs = rec.value(u"updated").toInteger();
    r.error = rec.value(u"error").toString();
    const qint64 ttlMs = rec.value(u"ttl_ms").toInteger();
    const qint64 leaseMs = rec.value(u"lease_ms").toInteger();
    if (ttlMs <= 0)
        return invalid(u"%1: expired when it was exported (ttl_ms %2)"_qs.arg(r.key).arg(ttlMs));
    r.request.method = req.value(u"method").toString().toLatin1();
    r.request.path = req.value(u"path").toString().toUtf8();
    r.request.headers = headersFromJson(req.value(u"headers").toArray());
    r.result.status = res.value(u"status").toInt();
    r.result.headers = headersFromJson(res.value(u"headers").toArray());
    const auto requestBody = fromBase64(req.value(u"body_base64"));
    const auto resultBody = fromBase64(res.value(u"body_base64"));
    if (!requestBody || !resultBody)
        return invalid(u"%1: a body_base64 is not base64"_qs.arg(r.key));
    r.request.body = *requestBody;
    r.result.body = *resultBody;
    r.history = historyFromJson(o.value(u"history").toArray());
    QList<DeliveryEvent> timeline;
    for (const QJsonValue &value : o.value(u"timeline").toArray()) {
        const QJsonObject e = value.toObject();
        DeliveryEvent event;
        event.atMs = e.value(u"at").toInteger();
        event.endpoint = e.value(u"endpoint").toString();
        event.key = e.value(u"key").toString();
        event.outcome =
            outcomeFromString(e.value(u"outcome").toString()).value_or(Outcome::Rejected);
        event.status = e.value(u"status").toInt();
        event.latencyUs = e.value(u"latency_us").toInteger();
        event.token = e.value(u"token").toInteger();
        event.instance = e.value(u"instance").toString();
        event.detail = e.value(u"detail").toString();
        event.payload = fromBase64(e.value(u"payload_base64")).value_or(QByteArray());
        timeline.append(event);
    }
    auto verdict = store.importRecord(r, ttlMs, leaseMs);
    if (!verdict)
        return verdict.error();
    if (*verdict == ImportVerdict::Imported && !timeline.isEmpty())
        if (auto logged = store.appendDeliveries(timeline); !logged)
            return logged.error();
    return ImportedLine{r.key, *verdict};
}

} // namespace idem
