#pragma once

#include "model/statemachine.h"
#include "util/result.h"

#include <QHostAddress>
#include <QJsonObject>
#include <QStringList>
#include <QUrl>

#include <optional>

namespace idem {

// lease_seconds must exceed forward_timeout_seconds by at least this: the processor's hard
// deadline (forward_timeout, counted from when the claim was sent) then always ends before the
// lease, and the margin is left to record the result, retried while the lease lasts.
constexpr qint64 kLeaseMarginSeconds = 2;

// Every field of "defaults" (docs/configuration.md#defaults); each may also be set on one endpoint.
struct EndpointSettings
{
    qint64 ttlSeconds = 604800;
    qint64 leaseSeconds = 60;
    qint64 forwardTimeoutSeconds = 30;
    qint64 maxBodyBytes = 1048576;
    qint64 maxResponseBytes = 1048576; // a longer downstream answer: 502, failed, nothing stored
    // Events in one batch delivery (SendGrid) at most; more: 413, nothing stored. SendGrid posts
    // a batch once it reaches 768 KB, and its smallest events take some 160 bytes: about 4,900
    // events at most, so 5,000 refuses none of its batches. Each event is a record of its own in
    // the store (docs/security.md: store bytes per request byte).
    qint64 maxBatchElements = 5000;
    int inProgressStatus = 409;
    qint64 signatureToleranceSeconds = 300;
    OnFailed onFailed = OnFailed::Reprocess;
    OnMismatch onMismatch = OnMismatch::Reject;
    bool passthroughMissingKey = false; // on_missing_key: "passthrough"

    ClaimPolicy claimPolicy() const
    {
        return {onFailed, onMismatch, leaseSeconds * 1000, ttlSeconds * 1000};
    }
};

struct KeySpec
{
    QByteArray header;       // default Idempotency-Key when nothing is configured
    QString jsonPointer;     // RFC 6901
    QStringList composite;   // JSON pointers; the key is the SHA-256 of their values
    // Read from the body: a json_pointer or composite fields given.
    bool readsBody() const { return !jsonPointer.isEmpty() || !composite.isEmpty(); }
};

struct SimulateSpec
{
    int delayMs = 0;
    double failRate = 0.0;
};

struct EndpointConfig
{
    QString name;
    QString provider;
    QStringList secrets; // several during a rotation: any one may sign
    QByteArray signatureHeader; // generic only
    QList<QByteArray> publicKeys; // sendgrid: ECDSA P-256 verification keys (rotation: several)
    QByteArray privateKey;        // sendgrid, optional: signs `storm` deliveries (never needed to verify)
    QUrl forwardTo;              // empty: the built-in processor
    SimulateSpec simulate;
    KeySpec key;
    // generic: where the event type is in a JSON body (RFC 6901); empty: the endpoint has none.
    QString typePointer = QStringLiteral("/type");
    EndpointSettings settings;
};

struct ListenAddress
{
    QHostAddress host = QHostAddress::LocalHost;
    quint16 port = 8787;
    static Result<ListenAddress> parse(const QString &text);
    QString toString() const;
};

// Limits of the webhook listener's connections (docs/http.md#limits). Unset: the
// receiver's defaults (HttpLimits), so what a test injects stays.
struct ConnectionSettings
{
    std::optional<qint64> maxConnectionsPerClient;
    // Request bytes buffered, all connections together; a client gets a quarter of it.
    std::optional<qint64> maxBufferedRequestBytes;
    std::optional<qint64> minUploadBytesPerSecond; // 0: no minimum
    std::optional<qint64> idleTimeoutSeconds;
    std::optional<qint64> requestTimeoutSeconds;
};

struct Config
{
    QString sourceFile; // empty: built in
    ListenAddress listen;
    QString store; // empty: sqlite in the user's data folder
    std::optional<ListenAddress> metricsListen; // Prometheus /metrics; none: off
    EndpointSettings defaults;
    QList<EndpointConfig> endpoints;
    int maxConnections = 4096;  // beyond: 503 and closed
    ConnectionSettings connections;
    QStringList loadWarnings;   // e.g. secrets in a file others may read

    // Errors name the file, the field and what is wrong; unknown fields are errors.
    static Result<Config> load(const QString &path);
    static Result<Config> parse(const QByteArray &json, const QString &sourceName);
    // No config file: one endpoint per built-in provider at /hooks/<provider>, no secrets.
    static Config builtin();

    const EndpointConfig *endpoint(QStringView name) const;
    // The JSON form (what the dashboard's settings write); parse(toJson()) gives this back.
    QJsonObject toJson() const;
};

QStringList builtinProviders();
// The largest body the receiver reads (max_body_bytes): an endpoint's, or the defaults', up to
// which a body sent to any other path is read before its 404.
qint64 largestBody(const Config &config);

} // namespace idem
