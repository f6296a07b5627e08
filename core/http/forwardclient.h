#pragma once

#include "model/keyrecord.h"

#include <QString>
#include <QUrl>

#include <functional>

class QObject;

namespace idem {

struct ForwardRequest
{
    QUrl url;           // http:// or https://; its user info is never sent (the caller decides)
    HeaderList headers; // written exactly as given, in this order
    QByteArray body;
    qint64 deadlineMs = 30'000;            // the whole answer by then, or TimedOut
    qint64 maxResponseBytes = 1024 * 1024; // a body past this: TooLarge, at once
};

struct ForwardOutcome
{
    enum class Kind {
        Answered,    // a whole answer, of any status (a 3xx is not followed)
        Unreachable, // no connection: refused, no route, no such host, TLS handshake or certificate
        BrokenAnswer, // closed before the answer was whole, or not HTTP/1.x as llhttp reads it
        TooLarge,     // the body passed maxResponseBytes
        TimedOut,     // no whole answer by the deadline
    };
    Kind kind = Kind::Unreachable;
    int status = 0;
    HeaderList
        headers;     // as received, each field once (repeated fields joined with ", "), no trailers
    QByteArray body; // the chunked framing removed; content codings untouched
    QString error;   // for every kind but Answered: what went wrong, without the URL
    // For Unreachable: why, in a fixed phrase ("connection refused", "host not found") that
    // names nothing of the URL or the network (`error` may name the host): for the sender.
    QString cause;
    // The connection stood (and its TLS handshake), so the request went out: the app may have it.
    // False for a TimedOut that never connected: nothing reached the app.
    bool connected = false;
    // A final (non-1xx) status line was read: the app has done its work and answered, whatever
    // became of the rest of the answer.
    bool finalStatusRead = false;
};

// A one-shot asynchronous HTTP/1.1 POST for the forwarder, on QTcpSocket (http) or QSslSocket
// (https, certificates verified as usual). One connection per request, `Connection: close`.
// The request carries exactly the given headers plus Host, Content-Length and Connection:
// nothing else — QNetworkAccessManager adds Accept-Encoding and Accept-Language that cannot be
// turned off. The answer is read by llhttp (strict mode), framed by Content-Length, chunked or
// the close. No redirects, cookies, cache or decoding.
//
// Runs on the calling thread's event loop; `done` is called there exactly once, at the latest
// at the deadline — unless `context` is destroyed first (then never, and the connection goes
// with it).
void forwardRequest(ForwardRequest request, QObject *context,
                    std::function<void(ForwardOutcome)> done);

} // namespace idem
