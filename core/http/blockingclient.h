#pragma once

#include "model/keyrecord.h"

#include <QByteArray>
#include <QString>

// A blocking HTTP/1.1 client on plain sockets (loopback or any IPv4 host), for `storm` and the
// tests: it may run on any thread (64 at once for a storm) and sends exactly the bytes it is
// given, malformed ones included. Responses are framed by Content-Length.
namespace idem {

struct ClientResponse
{
    int status = 0; // 0: no answer (see error)
    HeaderList headers;
    QByteArray body;
    QString error;
    QByteArray header(QByteArrayView name) const { return headerValue(headers, name); }
};

class RawConnection
{
public:
    // Connected within timeoutMs, or not open. `sourceIpv4`: the local address to send from
    // (another 127.x.y.z is another client on loopback); empty: the system's choice.
    explicit RawConnection(quint16 port, int timeoutMs = 15000,
                           const QByteArray &ipv4 = "127.0.0.1", const QByteArray &sourceIpv4 = {});
    ~RawConnection();
    RawConnection(const RawConnection &) = delete;

    bool isOpen() const { return m_fd >= 0; }
    void setTimeout(int timeoutMs) { m_timeoutMs = timeoutMs; } // for the reads and sends to come
    quint16 localPort() const; // 0 when not open
    bool send(QByteArrayView bytes);
    // Reads one response (Content-Length framed); status 0 on timeout or close. Interim
    // answers (100 Continue) are skipped: readBytes sees them. The answer to a HEAD (`toHead`)
    // has no body whatever its Content-Length says.
    ClientResponse readResponse(bool toHead = false);
    // The next `count` bytes exactly as they arrive (fewer on timeout or close).
    QByteArray readBytes(qsizetype count);
    // True when the server closed the connection (reads EOF) within timeoutMs.
    bool waitClosed(int timeoutMs);
    void close();
    // Closes with a reset (SO_LINGER 0): no TIME_WAIT is left behind, for clients that open
    // connections by the ten thousand (the HTTP fuzzer).
    void abort();

private:
    int m_fd = -1;
    int m_connectErrno = 0; // why the connection is not open
    int m_timeoutMs;
    QByteArray m_buffer;
    bool readMore();
};

ClientResponse post(quint16 port, const QByteArray &path, const QByteArray &body,
                    const HeaderList &headers = {});
// A POST as bytes; Content-Type: application/json unless `headers` carry their own.
QByteArray buildPost(const QByteArray &path, const QByteArray &body, const HeaderList &headers,
                     bool close = true);

} // namespace idem
