#pragma once

#include <QByteArray>
#include <QJsonArray>
#include <QJsonObject>
#include <QList>
#include <QPair>
#include <QString>

#include <optional>

namespace idem {

using HeaderList = QList<QPair<QByteArray, QByteArray>>;

// The lifecycle of one idempotency key (docs/http.md#outcomes). Reset is the operator's "process it
// again": the next delivery claims it whatever the endpoint's on_failed policy says.
enum class KeyState { Processing, Completed, Failed, Reset };

// What one delivery got (the Idempotency-Outcome header).
enum class Outcome {
    Processed,
    Replayed,
    InProgress,
    Reprocessed,
    Recovered,
    Mismatch,
    Rejected,
    Unavailable,
};

QString toString(KeyState state);
std::optional<KeyState> keyStateFromString(QStringView text);
QString toString(Outcome outcome);
std::optional<Outcome> outcomeFromString(QStringView text);

struct StoredRequest
{
    QByteArray method;
    QByteArray path;
    HeaderList headers;
    QByteArray body;
    // Not empty: the headers are a batch's, kept once in the store for all its events' records
    // (IdempotencyStore::claimBatch): sharedRef(headersJson(headers)). A read
    // (IdempotencyStore::key) fills `headers` in and clears it; still set after a read: the
    // shared headers were not found, and `headers` is empty.
    QByteArray headersRef;
};

struct StoredResult
{
    int status = 0;
    HeaderList headers;
    QByteArray body;
    // Not empty: the headers and body are a batch's answer, kept once in the store for all its
    // events' records (IdempotencyStore::finishBatch): sharedRef(sharedResultContent()). Read
    // back as StoredRequest::headersRef is.
    QByteArray ref;
};

struct HistoryEntry
{
    qint64 atMs = 0;
    QString event; // claimed, recovered, reprocessed, completed, failed, reset, ...
    qint64 token = 0;
    QString detail;
};

struct KeyRecord
{
    QString key; // namespaced: "<endpoint>:<key>"
    QString endpoint;
    QString provider;
    // The event's type as its sender names it (Provider::eventType); empty when it named none,
    // and on records written before types were kept.
    QString type;
    KeyState state = KeyState::Processing;
    QByteArray fingerprint; // hex SHA-256 of the body
    qint64 token = 0;       // fencing token, grows with every claim of this key
    int attempts = 0;       // deliveries seen
    qint64 createdMs = 0;
    qint64 updatedMs = 0;
    qint64 leaseUntilMs = 0;
    qint64 expiresAtMs = 0;
    StoredRequest request;
    StoredResult result;
    QString error;
    QList<HistoryEntry> history;

    bool expiredAt(qint64 nowMs) const { return expiresAtMs <= nowMs; }
};

// RFC 9110 §5.1: a field name is a token. §5.5: a value holds no control character but HTAB
// (CR, LF or NUL would end the field or the header section where the value says: response
// splitting); obs-text (0x80-0xFF) is allowed, as llhttp's strict mode allows it.
bool isFieldName(QByteArrayView name);
bool isFieldValue(QByteArrayView value);

// JSON forms shared by every backend and by the CLI; bodies are base64 so any bytes survive.
QJsonArray headersToJson(const HeaderList &headers);
// A pair that is no valid field (isFieldName, isFieldValue) is dropped with a warning: a store
// or a file may hold any bytes, and the desk writes stored fields onto the wire.
HeaderList headersFromJson(const QJsonArray &array);
QJsonObject historyEntryToJson(const HistoryEntry &entry);
QJsonArray historyToJson(const QList<HistoryEntry> &history);
QList<HistoryEntry> historyFromJson(const QJsonArray &array);
QByteArray headerValue(const HeaderList &headers, QByteArrayView name);
QByteArray compactJson(const QJsonArray &array);
// compactJson(headersToJson(headers)), the text every store keeps, made on every delivery: each
// [name, value] pair is QJson's text for it, remembered per thread for the pairs that recur
// (Content-Type, Host, ...), so only the ones that differ are made each time. Same bytes.
QByteArray headersJson(const HeaderList &headers);
QJsonArray parseJsonArray(const QByteArray &text);
// What a batch's events have in common (their request's headers, their result) is kept once in
// the store as shared content, named by its SHA-256 (hex): one name only ever holds one content,
// whoever writes it. Each record names it where it would have held it: {"shared":"<name>"} in
// place of the headers' JSON array.
QByteArray sharedRef(const QByteArray &content);
// The text a store keeps for a request's headers: their JSON array; or, when `shared` and the
// request has a headersRef, its name.
QByteArray storedHeadersJson(const StoredRequest &request, bool shared);
// Back from that text into `request`: its headers, or its headersRef (headers left empty).
void readStoredHeaders(StoredRequest &request, const QByteArray &text);
// A result's shared content: its headers' JSON, a line break, its body.
QByteArray sharedResultContent(const StoredResult &result);
// The text a store keeps for a result's headers, as storedHeadersJson(); with the name, the
// body is kept empty.
QByteArray storedResultHeadersJson(const StoredResult &result, bool shared);
// Back from the stored headers' text and body into `result`: headers and body, or its ref.
void readStoredResult(StoredResult &result, const QByteArray &headersText, QByteArray body);
// `result` filled in from its shared content (sharedResultContent()), its ref cleared.
void fillSharedResult(StoredResult &result, const QByteArray &content);
// What of a record read from a store is missing because the shared content it names is not in
// the store any more (a ref left unresolved): "its request headers", "its result", both joined
// by "and", or empty when the record is whole. Such a record is not exported, shown as whole or
// retried: its headers or its answer would be made up.
QString lostSharedContent(const KeyRecord &record);

// A record keeps its first history entry (how it started) and the newest ones, up to this many.
constexpr int kHistoryCap = 64;
void appendHistory(QList<HistoryEntry> &history, HistoryEntry entry);

// One arrival at the receiver, as the delivery log keeps it.
struct DeliveryEvent
{
    qint64 atMs = 0;
    QString endpoint;
    QString key; // empty when the delivery was rejected before a key was known
    QString type; // the event's type (Provider::eventType); empty when unknown or none
    Outcome outcome = Outcome::Processed;
    int status = 0;
    qint64 latencyUs = 0;
    qint64 token = 0; // the claim's token for processed / reprocessed / recovered
    QString instance;
    QString detail;
    QByteArray payload; // a mismatch's rejected body (capped), to show what differed
    // How many deliveries the entry stands for: 1, or for a summary the number of rejected
    // deliveries to its endpoint that were not logged one by one (IdempotencyEngine's budget).
    // Readers that count deliveries add this up; entries written before it existed are 1.
    qint64 count = 1;
};

// A stored count as readers add it up: at least 1 (less is damage: an entry stands for its own
// delivery at least), at most kMaxDeliveryCount, so that the sums of a log's entries never
// overflow.
constexpr qint64 kMaxDeliveryCount = 1'000'000'000'000;
constexpr qint64 deliveryCount(qint64 stored)
{
    return stored < 1 ? 1 : stored > kMaxDeliveryCount ? kMaxDeliveryCount : stored;
}

QJsonObject deliveryToJson(const DeliveryEvent &event);

} // namespace idem
