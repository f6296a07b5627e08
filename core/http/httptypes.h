#pragma once

#include "model/keyrecord.h"

#include <QByteArray>
#include <QHostAddress>
#include <QJsonObject>
#include <QPointer>

namespace idem {

class HttpConnection;

struct HttpRequest
{
    QByteArray method;
    QByteArray target; // as sent: path and query
    QByteArray path;   // percent-decoded path
    QByteArray query;
    HeaderList headers;
    QByteArray body;
    QHostAddress peer;
    qint64 receivedAtUs = 0; // monotonic, for latency

    QByteArray header(QByteArrayView name) const { return headerValue(headers, name); }
    bool hasHeader(QByteArrayView name) const;
};

struct HttpResponse
{
    int status = 200;
    HeaderList headers;
    QByteArray body;

    HttpResponse &setHeader(const QByteArray &name, const QByteArray &value);
    QByteArray header(QByteArrayView name) const { return headerValue(headers, name); }

    // application/problem+json (RFC 9457).
    static HttpResponse problem(int status, const QString &title, const QString &detail,
                                const QJsonObject &extra = {});
    static HttpResponse json(int status, const QJsonObject &body);
};

QByteArray reasonPhrase(int status);

// One field line as a parser read it: a field already in the list gets the value appended (RFC
// 9110 §5.3: ", ", or "; " for Cookie), so the list holds each field once, as everyone after the
// parser reads it. Used for requests (the receiver) and answers (the forwarder).
void addField(HeaderList &headers, const QByteArray &name, const QByteArray &value);

// The handle a handler answers through, now or later, from the connection's thread. Answering
// a connection that is gone does nothing; only the first answer counts.
class Responder
{
public:
    Responder() = default;
    Responder(HttpConnection *connection, quint64 sequence);
    void send(const HttpResponse &response) const;
    bool connected() const;

private:
    QPointer<HttpConnection> m_connection;
    quint64 m_sequence = 0;
};

} // namespace idem
