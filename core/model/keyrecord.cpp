#include "model/keyrecord.h"

#include "util/format.h"

#include <QCryptographicHash>
#include <QHash>
#include <QJsonDocument>

#include <algorithm>
#include <array>
#include <string_view>

namespace idem {

namespace {
constexpr std::array kStateNames{u"processing", u"completed", u"failed", u"reset"};
constexpr std::array kOutcomeNames{u"processed",   u"replayed",  u"in-progress", u"reprocessed",
                                   u"recovered",   u"mismatch",  u"rejected",    u"unavailable"};
} // namespace

QString toString(KeyState state)
{
    return QString::fromUtf16(kStateNames[static_cast<size_t>(state)]);
}

std::optional<KeyState> keyStateFromString(QStringView text)
{
    for (size_t i = 0; i < kStateNames.size(); ++i)
        if (text == QStringView(kStateNames[i]))
            return static_cast<KeyState>(i);
    return std::nullopt;
}

QString toString(Outcome outcome)
{
    return QString::fromUtf16(kOutcomeNames[static_cast<size_t>(outcome)]);
}

std::optional<Outcome> outcomeFromString(QStringView text)
{
    for (size_t i = 0; i < kOutcomeNames.size(); ++i)
        if (text == QStringView(kOutcomeNames[i]))
            return static_cast<Outcome>(i);
    return std::nullopt;
}

QJsonArray headersToJson(const HeaderList &headers)
{
    QJsonArray array;
    for (const auto &[name, value] : headers)
        array.append(QJsonArray{QString::fromLatin1(name), QString::fromLatin1(value)});
    return array;
}

bool isFieldName(QByteArrayView name)
{
    static constexpr std::string_view kTokenPunctuation = "!#$%&'*+-.^_`|~";
    return !name.isEmpty() && std::all_of(name.begin(), name.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               kTokenPunctuation.find(c) != std::string_view::npos;
    });
}

bool isFieldValue(QByteArrayView value)
{
    return std::none_of(value.begin(), value.end(), [](char c) {
        const auto u = static_cast<unsigned char>(c);
        return (u < 0x20 && u != '\t') || u == 0x7f;
    });
}

HeaderList headersFromJson(const QJsonArray &array)
{
    HeaderList headers;
    headers.reserve(array.size());
    for (const auto &item : array) {
        const QJsonArray pair = item.toArray();
        QByteArray name = pair.at(0).toString().toLatin1();
        QByteArray value = pair.at(1).toString().toLatin1();
        if (!isFieldName(name) || !isFieldValue(value)) {
            qWarning("idemdesk: a stored header field is not valid HTTP and was dropped: %s",
                     qUtf8Printable(escapeControls(QString::fromLatin1(name + ": " + value))));
            continue;
        }
        headers.append({std::move(name), std::move(value)});
    }
    return headers;
}

QJsonObject historyEntryToJson(const HistoryEntry &entry)
{
    QJsonObject object{{u"at"_qs, entry.atMs}, {u"event"_qs, entry.event}, {u"token"_qs, entry.token}};
    if (!entry.detail.isEmpty())
        object.insert(u"detail"_qs, entry.detail);
    return object;
}

QJsonArray historyToJson(const QList<HistoryEntry> &history)
{
    QJsonArray array;
    for (const auto &entry : history)
        array.append(historyEntryToJson(entry));
    return array;
}

QList<HistoryEntry> historyFromJson(const QJsonArray &array)
{
    QList<HistoryEntry> history;
    for (const auto &item : array) {
        const QJsonObject o = item.toObject();
        history.append({o.value(u"at").toInteger(), o.value(u"event").toString(),
                        o.value(u"token").toInteger(), o.value(u"detail").toString()});
    }
    return history;
}

QByteArray compactJson(const QJsonArray &array)
{
    return QJsonDocument(array).toJson(QJsonDocument::Compact);
}

QByteArray headersJson(const HeaderList &headers)
{
    constexpr qsizetype kRemembered = 512; // pairs per thread, forgotten all at once past this
    thread_local QHash<QPair<QByteArray, QByteArray>, QByteArray> pairs;
    QByteArray out = "[";
    for (const auto &header : headers) {
        auto it = pairs.constFind(header);
        if (it == pairs.cend()) {
            if (pairs.size() >= kRemembered)
                pairs.clear();
            QByteArray text = compactJson(
                QJsonArray{QString::fromLatin1(header.first), QString::fromLatin1(header.second)});
            it = pairs.insert(header, std::move(text));
        }
        if (out.size() > 1)
            out += ',';
        out += *it;
    }
    out += ']';
    return out;
}

QJsonArray parseJsonArray(const QByteArray &text)
{
    return QJsonDocument::fromJson(text).array();
}

QByteArray sharedRef(const QByteArray &content)
{
    return QCryptographicHash::hash(content, QCryptographicHash::Sha256).toHex();
}

QString lostSharedContent(const KeyRecord &record)
{
    QStringList lost;
    if (!record.request.headersRef.isEmpty())
        lost << u"its request headers"_qs;
    if (!record.result.ref.isEmpty())
        lost << u"its result"_qs;
    return lost.join(u" and "_qs);
}

namespace {

QByteArray sharedName(const QByteArray &ref)
{
    return R"({"shared":")" + ref + R"("})";
}

// The name in a stored headers' text, or empty: an array is the headers themselves (every record
// written before shared content existed, and every single delivery's).
QByteArray sharedNameIn(const QByteArray &text)
{
    if (!text.startsWith('{'))
        return {};
    return QJsonDocument::fromJson(text).object().value(u"shared").toString().toLatin1();
}

} // namespace

QByteArray storedHeadersJson(const StoredRequest &request, bool shared)
{
    return shared && !request.headersRef.isEmpty() ? sharedName(request.headersRef)
                                                   : headersJson(request.headers);
}

void readStoredHeaders(StoredRequest &request, const QByteArray &text)
{
    request.headersRef = sharedNameIn(text);
    request.headers = request.headersRef.isEmpty() && !text.startsWith('{')
                          ? headersFromJson(parseJsonArray(text))
                          : HeaderList();
}

QByteArray sharedResultContent(const StoredResult &result)
{
    return headersJson(result.headers) + '\n' + result.body;
}

QByteArray storedResultHeadersJson(const StoredResult &result, bool shared)
{
    return shared && !result.ref.isEmpty() ? sharedName(result.ref) : headersJson(result.headers);
}

void readStoredResult(StoredResult &result, const QByteArray &headersText, QByteArray body)
{
    result.ref = sharedNameIn(headersText);
    if (!result.ref.isEmpty() || headersText.startsWith('{')) {
        result.headers.clear();
        result.body.clear();
        return;
    }
    result.headers = headersFromJson(parseJsonArray(headersText));
    result.body = std::move(body);
}

void fillSharedResult(StoredResult &result, const QByteArray &content)
{
    const qsizetype eol = content.indexOf('\n');
    result.headers = headersFromJson(parseJsonArray(content.left(eol)));
    result.body = eol < 0 ? QByteArray() : content.mid(eol + 1);
    result.ref.clear();
}

void appendHistory(QList<HistoryEntry> &history, HistoryEntry entry)
{
    history.append(std::move(entry));
    if (history.size() > kHistoryCap)
        history.remove(1, history.size() - kHistoryCap);
}

QByteArray headerValue(const HeaderList &headers, QByteArrayView name)
{
    for (const auto &[n, v] : headers)
        if (n.compare(name, Qt::CaseInsensitive) == 0)
            return v;
    return {};
}

QJsonObject deliveryToJson(const DeliveryEvent &event)
{
    QJsonObject object{{u"at"_qs, event.atMs},         {u"endpoint"_qs, event.endpoint},
                       {u"key"_qs, event.key},         {u"outcome"_qs, toString(event.outcome)},
                       {u"status"_qs, event.status},   {u"latency_us"_qs, event.latencyUs},
                       {u"token"_qs, event.token},     {u"instance"_qs, event.instance}};
    if (!event.type.isEmpty())
        object.insert(u"type"_qs, event.type);
    if (!event.detail.isEmpty())
        object.insert(u"detail"_qs, event.detail);
    if (event.count != 1)
        object.insert(u"count"_qs, event.count);
    return object;
}

} // namespace idem
