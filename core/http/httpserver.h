#pragma once

#include "http/connectionlimits.h"
#include "http/httptypes.h"

#include <QObject>
#include <QTcpServer>
#include <QTimer>

#include <atomic>
#include <functional>

#include <llhttp.h>

class QTcpSocket;

namespace idem {

struct HttpLimits
{
    qint64 maxHeaderBytes = 16 * 1024; // request line + headers; beyond: 431
    int maxHeaders = 100;              // beyond: 431
    // The body limit for a path (an endpoint's max_body_bytes); beyond: 413 before reading it.
    std::function<qint64(const QByteArray &path)> maxBodyFor;
    qint64 defaultMaxBody = 1024 * 1024;
    int idleTimeoutMs = 60'000;    // keep-alive connection with no request: closed
    int requestTimeoutMs = 30'000; // one request's headers and body must arrive within this: 408
    int maxConnections = 4096;     // beyond: 503 and closed
    // Connections of one client (clientKey: an IPv4 address, an IPv6 /64); beyond: 429, closed.
    int maxConnectionsPerClient = 256;
    // Request bodies buffered, from their first byte until their answer is written, all
    // connections together (beyond: 503 and closed) and one client's (beyond: 429 and closed).
    qint64 maxBufferedBytes = 64 * 1024 * 1024;
    qint64 maxBufferedBytesPerClient = 16 * 1024 * 1024;
    // A request arriving slower than this, over any window of uploadWindowMs from its first
    // byte: 408 and closed. 0: no minimum.
    qint64 minUploadBytesPerSecond = 1024;
    int uploadWindowMs = 10'000;
    // Answers written but not yet taken by the client, per connection: above this the
    // connection's next pipelined request is not read until the client drains its answers.
    qint64 maxUnsentBytes = 64 * 1024;
    // While it waits so, its answers must be taken at this rate over each idleTimeoutMs, or the
    // connection is closed: a reader taking a byte now and then does not keep it. 0: they must
    // be back under maxUnsentBytes within idleTimeoutMs.
    qint64 minDrainBytesPerSecond = 1024;
    // The most read from a connection's socket at once (the socket's read buffer). Nothing more
    // is read while a request is being answered or its answers wait for the client: the rest
    // stays in the kernel, whose window pushes back on a client that keeps sending.
    qint64 readBufferBytes = 64 * 1024;
};

using HttpHandler = std::function<void(HttpRequest request, Responder responder)>;
// Told of every request the HTTP layer answers itself (400, 408, 413, 417, 429, 431, 501, 503).
using HttpRejectObserver = std::function<void(const HttpRequest &partial, int status, const QString &detail)>;

// An HTTP/1.1 server on QTcpServer with llhttp (strict mode) as the parser. Keep-alive;
// pipelined requests are handled one after the other (the parser pauses while a request is
// being answered), so answers leave in order; a client that does not read its answers is not
// read either (HttpLimits::maxUnsentBytes). Lives on one thread; handlers are called there and
// may answer later through their Responder.
// A handler answers HEAD as it answers GET: the server sends that answer's headers, its
// Content-Length included, without the body (RFC 9110 9.3.2).
//
// What a handler gets is what was interpreted, once (RFC 9112): a field sent on several lines
// arrives as one line, its values joined with ", " (Cookie: "; "), so whoever reads the
// request — the engine, the forwarder — sees the same single value; trailer fields of a
// chunked body are read and dropped. Refused before any handler runs: obs-fold (400), an
// HTTP/1.1 request without exactly one Host (400), a Transfer-Encoding other than `chunked`
// alone (400 when `chunked` is not the final coding, 501 for another coding before it).
class HttpServer final : public QObject
{
    Q_OBJECT
public:
    explicit HttpServer(HttpLimits limits, HttpHandler handler, QObject *parent = nullptr);
    ~HttpServer() override;

    bool listen(const QHostAddress &address, quint16 port);
    QString errorString() const { return m_server.errorString(); }
    quint16 port() const { return m_server.serverPort(); }
    QHostAddress address() const { return m_server.serverAddress(); }
    // A planned stop: no new connection, and none of the open ones takes another request: an
    // idle keep-alive connection is closed, a request still arriving is answered 503 (nothing
    // was started: the sender sends it again) and one being answered goes with Connection: close.
    void stopAccepting();
    bool stopping() const { return m_stopping; }
    int connectionCount() const { return m_connections.load(); } // from any thread
    // Bytes the connections buffer now (HttpLimits::maxBufferedBytes: request bodies, request
    // bytes read ahead, answers not yet taken by their clients), from any thread.
    qint64 bufferedBytes() const { return m_bufferedBytes.load(); }
    const HttpLimits &limits() const { return m_limits; }
    const HttpHandler &handler() const { return m_handler; }
    void setRejectObserver(HttpRejectObserver observer) { m_onReject = std::move(observer); }

private:
    void acceptPending();
    friend class HttpConnection;
    QTcpServer m_server;
    HttpLimits m_limits;
    HttpHandler m_handler;
    HttpRejectObserver m_onReject;
    std::atomic<int> m_connections{0};
    ConnectionBudget m_budget;
    std::atomic<qint64> m_bufferedBytes{0}; // m_budget's total, for other threads
    bool m_stopping = false;
};

class HttpConnection final : public QObject
{
    Q_OBJECT
public:
    // `client`: clientKey of the peer, already counted in the server's budget.
    HttpConnection(QTcpSocket *socket, HttpServer *server, QByteArray client);
    ~HttpConnection() override;

    void answer(quint64 sequence, const HttpResponse &response);
    void stop(); // HttpServer::stopAccepting

private:
    // Draining: answered, but more than maxUnsentBytes wait for the client to read them.
    enum class Phase { Idle, Reading, Waiting, Draining, Closing };
    static int onMessageBegin(llhttp_t *p);
    static int onUrl(llhttp_t *p, const char *at, size_t len);
    static int onHeaderField(llhttp_t *p, const char *at, size_t len);
    static int onHeaderValue(llhttp_t *p, const char *at, size_t len);
    static int onHeadersComplete(llhttp_t *p);
    static int onBody(llhttp_t *p, const char *at, size_t len);
    static int onMessageComplete(llhttp_t *p);
    static const llhttp_settings_t &settings();

    void processInput();
    bool scanForObsFold(QByteArrayView data);
    int checkFraming(const llhttp_t *p);
    void addHeader();
    void dispatch();
    void onBytesWritten(qint64 bytes);
    void fail(int status, const QString &detail);
    int refuseEarly(int status, const QString &detail);
    void writeResponse(const HttpResponse &response, bool close, bool head);
    void onTimeout();
    void onReadingTimeout();
    int readingTimerMs() const; // to the request's deadline or its pace's next check
    // The body buffer grown to hold `needed` bytes, within the budget; false (and the refusal
    // decided) when the budget refuses.
    bool growBody(qint64 needed);
    void releaseBody();
    // Up to readBufferBytes from the socket into m_pending; 0 when the socket holds nothing.
    qint64 readMore();
    void consumePending(qint64 bytes);
    // m_pending counted in the budget: it is kept while the request it ended is answered.
    void holdPending();
    void dropPending();
    // The budget's count of this connection's unsent answers, brought to what the socket holds.
    void countUnsent();
    // Whether its next request must wait for the client to take the answers it has not.
    bool mustDrain() const;
    // Bytes of its answers the client has taken: handed to the kernel and acknowledged by the
    // peer. Not bytesWritten alone: the kernel takes megabytes at once and reports room again
    // only once much of it is gone, so a client reading steadily can go a whole idle time
    // without one bytesWritten.
    qint64 takenByClient() const;
    // Counts what the client took since the last count towards the drain pace.
    void countTaken();
    // An idle connection whose next request is already here (in the kernel, the socket's
    // buffer or m_pending) reads it; false when nothing is.
    bool readArrived();
    void close();
    bool countHeaderBytes(size_t len);

    QTcpSocket *m_socket;
    HttpServer *m_server;
    QByteArray m_client; // clientKey of the peer
    // What this connection holds of the server's budget: the capacity of the body being read or
    // answered (held until the answer is written; the handler has the body until then).
    qint64 m_reserved = 0;
    qint64 m_bodyLimit = 0; // its Content-Length, else the endpoint's maximum
    UploadPace m_pace;
    qint64 m_requestStartMs = 0;
    llhttp_t m_parser;
    QTimer m_timer;
    Phase m_phase = Phase::Idle;
    // Bytes read, from m_pendingAt on not yet parsed (pipelined requests): at most one read,
    // since nothing is read before they are parsed.
    QByteArray m_pending;
    qsizetype m_pendingAt = 0;
    qint64 m_pendingHeld = 0; // what the budget counts of it (holdPending)
    qint64 m_unsent = 0;      // the budget's count of the answers the socket has not sent
    UploadPace m_drainPace;   // the client taking its answers while Draining
    qint64 m_written = 0;     // bytes the socket handed to the kernel (bytesWritten), all told
    qint64 m_taken = 0;       // takenByClient() when the drain pace last counted it
    HttpRequest m_request;
    QByteArray m_field;
    QByteArray m_value;
    bool m_inValue = false;
    qint64 m_headerBytes = 0;
    qint64 m_maxBody = 0;
    int m_headerLines = 0;
    int m_hostLines = 0;
    // Raw scan of the header section for obs-fold (llhttp reports a folded line as part of the
    // value): armed at the start of each message, until the blank line that ends its headers.
    bool m_scanArmed = true;
    bool m_scanAtLineStart = true;
    bool m_scanSawLine = false; // a non-empty line (the request line) was seen
    bool m_scanLineEmpty = true;
    bool m_obsFold = false;
    bool m_unnamedField = false; // a header line with no field name (": value")
    int m_earlyStatus = 0; // decided inside a parser callback (400 / 413 / 417 / 431 / 501)
    QString m_earlyDetail;
    bool m_keepAlive = true;
    bool m_messageDone = false;
    bool m_head = false; // the request being answered is a HEAD: its answer goes without body
    quint64 m_sequence = 0;
};

} // namespace idem
