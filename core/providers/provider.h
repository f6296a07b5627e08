#pragma once

#include "config/config.h"
#include "http/httptypes.h"
#include "util/result.h"

#include <QString>

#include <optional>

namespace idem {

// Where a key came from when the provider found one.
struct KeyExtraction
{
    enum class Kind { Found, Missing, Invalid };
    Kind kind = Kind::Missing;
    QString key;    // raw, before namespacing by endpoint
    QString detail; // for Missing / Invalid: what was looked for
};

// One element of a batch delivery (SendGrid): its own key, fingerprint and bytes.
struct BatchElement
{
    QString key; // raw, before namespacing
    QByteArray fingerprint;
    QByteArray raw; // the element's bytes as sent: what is stored and forwarded for it
};

// A delivery as a provider's sender makes it: headers and body, signed.
struct OutgoingDelivery
{
    HeaderList headers;
    QByteArray body;
};

// One sender's conventions: how it signs and where it puts the event id. Stateless and
// thread-safe; one instance per provider for the whole process.
class Provider
{
public:
    virtual ~Provider() = default;
    virtual QString name() const = 0;
    // Unauthenticated (401) when the error is set; its message says which check failed and
    // never contains the expected signature.
    virtual Result<void> verify(const HttpRequest &request, const EndpointConfig &endpoint,
                                qint64 nowSeconds) const = 0;
    virtual KeyExtraction extractKey(const HttpRequest &request,
                                     const EndpointConfig &endpoint) const = 0;
    // How long the sender keeps retrying: a TTL shorter than this lets a late retry through.
    virtual qint64 retryWindowSeconds() const = 0;
    // Test events this sender sends (Send test event, `idemdesk send --template`); the first is
    // the default.
    virtual QStringList templates() const = 0;
    // The event `eventId` from template `name` as this sender delivers it, unsigned: the key
    // lands where extractKey() reads it (the body, or an id header).
    virtual OutgoingDelivery sample(const EndpointConfig &endpoint, const QString &name,
                                    const QString &eventId, qint64 nowSeconds) const = 0;
    // Signs `delivery` as this sender does, at `nowSeconds` (its timestamp header too), with the
    // endpoint's first secret (SendGrid: its private key), replacing an earlier signature; an
    // endpoint without a secret gets no signature. Invalid when it cannot be signed (SendGrid
    // verifying with a public key but no private key given).
    virtual Result<void> sign(OutgoingDelivery &delivery, const EndpointConfig &endpoint,
                              qint64 nowSeconds) const = 0;
    // The template storms send (one key per event).
    virtual QString stormTemplate() const { return templates().first(); }
    // The event `eventId` as this sender would deliver it to `endpoint`, signed with its first
    // secret at `nowSeconds` (storms and tests): sample() of the storm template, then sign().
    OutgoingDelivery makeDelivery(const EndpointConfig &endpoint, const QString &eventId,
                                  qint64 nowSeconds) const;

    // Batch senders (SendGrid) put several events in one delivery: each element is its own key.
    virtual bool isBatch() const { return false; }
    // The elements in the body's order; TooLarge when there are more than `maxElements`, told
    // before any element is looked at; Invalid when the body is not a batch.
    virtual Result<QList<BatchElement>> splitBatch(const HttpRequest &request,
                                                   qsizetype maxElements) const;
    // An answer the provider's protocol expects instead of processing (Slack's URL check).
    virtual std::optional<HttpResponse> directAnswer(const HttpRequest &) const { return std::nullopt; }
    // Worth keeping with the delivery (Slack's retry number, Shopify's event id): for the log.
    virtual QString note(const HttpRequest &) const { return {}; }
    // The event's type as this sender names it (payment_intent.succeeded, issues.opened), for
    // the Keys and Live lists, `keys list --type` and the serve log; empty when the delivery
    // names none (docs/providers.md#event-types). The sender's text, bounded by eventTypeText().
    // Reads the body without parsing all of it: on every delivery's path.
    virtual QString eventType(const HttpRequest &, const EndpointConfig &) const { return {}; }
    // A batch element's type (SendGrid's `event`), as eventType() is a delivery's: `element` is
    // the element's bytes as sent (BatchElement::raw).
    virtual QString elementType(QByteArrayView /*element*/) const { return {}; }
};

// At most this many characters of an event type are kept (docs/providers.md#event-types).
constexpr qsizetype kMaxEventTypeChars = 100;
// A sender's event type as the desk keeps and shows it: printable ASCII (anything else, a
// control character, a line break, a bidirectional override, any non-ASCII letter, becomes '?'),
// without surrounding spaces, cut to kMaxEventTypeChars ("..." at the end says it was cut).
QString eventTypeText(QStringView raw);

// A JSON text's value at an RFC 6901 pointer, as its raw bytes (a string with its quotes), read
// without parsing the rest of the text: members are skipped, not decoded. A name given twice in
// an object reads its last value, as QJsonDocument does. nullopt when a step is missing or the
// text is not JSON where it was read. Not a validator.
std::optional<QByteArrayView> jsonValueAt(QByteArrayView json, QStringView pointer);
// A raw JSON scalar (from jsonValueAt) as text: a string decoded, a number or true/false as
// written; empty for null, an object or an array.
QString jsonScalarText(QByteArrayView raw);
// The event type at `pointer` in a JSON body (eventTypeText() of its scalar); empty if none.
QString eventTypeAt(QByteArrayView body, QStringView pointer);

const Provider *providerFor(QStringView name);

// Sets header `name` (case-insensitive), replacing every earlier value.
void setHeader(HeaderList &headers, const QByteArray &name, const QByteArray &value);

// "<endpoint>:<key>", at most 255 bytes of printable ASCII (docs/providers.md); else a 400.
Result<QString> namespacedKey(const QString &endpoint, const QString &rawKey);

// RFC 6901 JSON pointer into a parsed document; nullopt when a step is missing.
std::optional<QJsonValue> resolvePointer(const QJsonValue &root, const QString &pointer);

// Equal-length, constant-time comparison (OpenSSL's CRYPTO_memcmp).
bool constantTimeEquals(QByteArrayView a, QByteArrayView b);
QByteArray hmacSha256(const QByteArray &key, const QByteArray &data);
// The signed timestamp against the endpoint's window (0 = not checked); the error says which way.
Result<void> checkTimestamp(const QByteArray &timestamp, qint64 nowSeconds, qint64 toleranceSeconds);
QString scalarText(const QJsonValue &value);
QJsonValue setPointer(const QJsonValue &node, QStringList tokens, const QString &value);

// Keys read from the signed body (an endpoint's "key": json_pointer, composite), for the generic
// provider and for those whose id headers no signature covers (GitHub, Shopify).
// The key where `spec` says: its json_pointer's value, else the SHA-256 of its composite fields
// (the pointer "" is the whole body); Invalid when the body is not JSON; nullopt when the spec
// reads none or the body has none of them (what was looked for is added to `tried`).
std::optional<KeyExtraction> bodyKey(const QByteArray &body, const KeySpec &spec,
                                     QStringList &tried);
// A test event's id put where bodyKey() reads it (nothing when the spec reads no body key).
void placeBodyKey(QJsonObject &body, const KeySpec &spec, const QString &eventId);

// The signed providers of docs/providers.md (providers/signed.cpp).
const Provider *stripeProvider();
const Provider *githubProvider();
const Provider *shopifyProvider();
const Provider *sendgridProvider();
const Provider *slackProvider();
const Provider *standardProvider();

} // namespace idem
