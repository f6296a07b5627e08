#include "http/httpserver.h"

#include <QDateTime>
#include "util/clock.h"
#include "util/format.h"

#include <QJsonDocument>
#include <QTcpSocket>
#include <QUrl>

#include <linux/sockios.h> // SIOCOUTQ
#include <sys/ioctl.h>

namespace idem {

namespace {

// The Date header, formatted at most once a second per thread.
QByteArray httpDate()
{
    thread_local qint64 cachedSecond = -1;
    thread_local QByteArray cached;
    const qint64 now = QDateTime::currentSecsSinceEpoch();
    if (now != cachedSecond) {
        cachedSecond = now;
        cached = QLocale::c()
                     .toString(QDateTime::fromSecsSinceEpoch(now, Qt::UTC),
                               u"ddd, dd MMM yyyy hh:mm:ss 'GMT'"_qs)
                     .toLatin1();
    }
    return cached;
}

} // namespace

bool HttpRequest::hasHeader(QByteArrayView name) const
{
    for (const auto &h : headers)
        if (h.first.compare(name, Qt::CaseInsensitive) == 0)
            return true;
    return false;
}

HttpResponse &HttpResponse::setHeader(const QByteArray &name, const QByteArray &value)
{
    for (auto &h : headers) {
        if (h.first.compare(name, Qt::CaseInsensitive) == 0) {
            h.second = value;
            return *this;
        }
    }
    headers.append({name, value});
    return *this;
}

HttpResponse HttpResponse::problem(int status, const QString &title, const QString &detail,
                                   const QJsonObject &extra)
{
    QJsonObject body = extra;
    body.insert(u"type"_qs, u"about:blank"_qs);
    body.insert(u"title"_qs, title);
    body.insert(u"status"_qs, status);
    body.insert(u"detail"_qs, detail);
    HttpResponse r;
    r.status = status;
    r.setHeader("Content-Type", "application/problem+json");
    r.body = QJsonDocument(body).toJson(QJsonDocument::Compact);
    return r;
}

HttpResponse HttpResponse::json(int status, const QJsonObject &body)
{
    HttpResponse r;
    r.status = status;
    r.setHeader("Content-Type", "application/json");
    r.body = QJsonDocument(body).toJson(QJsonDocument::Compact);
    return r;
}

QByteArray reasonPhrase(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 301: return "Moved Permanently";
    case 302: return "Found";
    case 303: return "See Other";
    case 304: return "Not Modified";
    case 307: return "Temporary Redirect";
    case 308: return "Permanent Redirect";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 413: return "Content Too Large";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 508: return "Loop Detected";
    default:
        return status < 300   ? "OK"
               : status < 400 ? "Redirection"
               : status < 500 ? "Client Error"
                              : "Server Error";
    }
}

Responder::Responder(HttpConnection *connection, quint64 sequence)
    : m_connection(connection), m_sequence(sequence)
{}

void Responder::send(const HttpResponse &response) const
{
    if (m_connection)
        m_connection->answer(m_sequence, response);
}

bool Responder::connected() const
{
    return !m_connection.isNull();
}

// ---------------------------------------------------------------------------------------------

HttpServer::HttpServer(HttpLimits limits, HttpHandler handler, QObject *parent)
    : QObject(parent), m_server(this), m_limits(std::move(limits)), m_handler(std::move(handler)),
      m_budget({m_limits.maxBufferedBytes, m_limits.maxBufferedBytesPerClient,
                m_limits.maxConnectionsPerClient})
{
    m_server.setMaxPendingConnections(1024);
    connect(&m_server, &QTcpServer::newConnection, this, &HttpServer::acceptPending);
}

HttpServer::~HttpServer()
{
    // Connections first, while this is still an HttpServer: they count themselves out of it.
    qDeleteAll(findChildren<HttpConnection *>(Qt::FindDirectChildrenOnly));
}

bool HttpServer::listen(const QHostAddress &address, quint16 port)
{
    // Qt's own is 50; SO_REUSEADDR it sets itself on Unix (a restart binds a port whose last
    // connections are in TIME-WAIT).
    m_server.setListenBacklogSize(listenBacklog());
    return m_server.listen(address, port);
}

void HttpServer::stopAccepting()
{
    m_server.close();
    m_stopping = true;
    for (HttpConnection *connection : findChildren<HttpConnection *>(Qt::FindDirectChildrenOnly))
        connection->stop();
}

namespace {

// A connection refused as it is accepted: its answer written into the kernel and the socket
// closed now, not when the loop next runs: a burst of refused connections would otherwise hold
// a descriptor each, past the open-file limit (receiver.h, connectionsTheFileLimitAllows).
void refuseConnection(QTcpSocket *socket, int status, const QString &title, const QString &detail)
{
    const HttpResponse refusal = HttpResponse::problem(status, title, detail);
    const QByteArray out = "HTTP/1.1 " + QByteArray::number(status) + ' ' + reasonPhrase(status) +
                           "\r\nContent-Type: application/problem+json\r\nRetry-After: 1\r\n"
                           "Idempotency-Outcome: rejected\r\nConnection: close\r\n"
                           "Content-Length: " +
                           QByteArray::number(refusal.body.size()) + "\r\n\r\n" + refusal.body;
    socket->write(out);
    socket->flush();
    socket->close();
    socket->deleteLater();
}

} // namespace

void HttpServer::acceptPending()
{
    while (QTcpSocket *socket = m_server.nextPendingConnection()) {
        if (m_connections >= m_limits.maxConnections) {
            refuseConnection(socket, 503, u"Too many connections"_qs,
                             u"the receiver has reached its connection limit (%1)"_qs.arg(
                                 m_limits.maxConnections));
            continue;
        }
        QByteArray client = clientKey(socket->peerAddress());
        if (m_budget.openConnection(client) != LimitRefusal::None) {
            refuseConnection(
                socket, 429, u"Too many connections from this client"_qs,
                u"this client has %1 connections open, the most one client may "
                "have: send on those, or close some"_qs.arg(m_limits.maxConnectionsPerClient));
            continue;
        }
        new HttpConnection(socket, this, std::move(client));
    }
}

// ---------------------------------------------------------------------------------------------

const llhttp_settings_t &HttpConnection::settings()
{
    static const llhttp_settings_t s = [] {
        llhttp_settings_t s;
        llhttp_settings_init(&s);
        s.on_message_begin = &HttpConnection::onMessageBegin;
        s.on_url = &HttpConnection::onUrl;
        s.on_header_field = &HttpConnection::onHeaderField;
        s.on_header_value = &HttpConnection::onHeaderValue;
        s.on_headers_complete = &HttpConnection::onHeadersComplete;
        s.on_body = &HttpConnection::onBody;
        s.on_message_complete = &HttpConnection::onMessageComplete;
        return s;
    }();
    return s;
}

HttpConnection::HttpConnection(QTcpSocket *socket, HttpServer *server, QByteArray client)
    : QObject(server), m_socket(socket), m_server(server), m_client(std::move(client)),
      m_pace(server->m_limits.minUploadBytesPerSecond, server->m_limits.uploadWindowMs),
      m_drainPace(server->m_limits.minDrainBytesPerSecond, server->m_limits.idleTimeoutMs)
{
    ++m_server->m_connections;
    socket->setParent(this);
    // Bounded read buffer: while a request is being answered we stop reading, and the kernel's
    // window pushes back on a client that keeps sending.
    socket->setReadBufferSize(server->m_limits.readBufferBytes);
    llhttp_init(&m_parser, HTTP_REQUEST, &settings());
    m_parser.data = this;
    m_timer.setSingleShot(true);
    connect(&m_timer, &QTimer::timeout, this, &HttpConnection::onTimeout);
    connect(socket, &QTcpSocket::readyRead, this, &HttpConnection::processInput);
    connect(socket, &QTcpSocket::bytesWritten, this, &HttpConnection::onBytesWritten);
    connect(socket, &QTcpSocket::disconnected, this, &QObject::deleteLater);
    connect(socket, &QTcpSocket::errorOccurred, this, [this](QAbstractSocket::SocketError error) {
        // A wait of 0 ms that found nothing (readArrived) reports a timeout: no fault.
        if (error != QAbstractSocket::RemoteHostClosedError &&
            error != QAbstractSocket::SocketTimeoutError)
            close();
    });
    m_timer.start(m_server->m_limits.idleTimeoutMs);
    if (socket->bytesAvailable() > 0)
        QMetaObject::invokeMethod(this, &HttpConnection::processInput, Qt::QueuedConnection);
}

HttpConnection::~HttpConnection()
{
    releaseBody();
    dropPending();
    m_server->m_budget.release(m_client, m_unsent);
    m_server->m_bufferedBytes = m_server->m_budget.bufferedBytes();
    m_server->m_budget.closeConnection(m_client);
    --m_server->m_connections;
}

void HttpConnection::processInput()
{
    // What was read is parsed before more is read, one request at a time: a client pipelining
    // requests faster than they are answered finds them waiting in the kernel, not here.
    // Waiting, Draining, Closing: resumed once the current answer is written (and mostly taken
    // by the client).
    while (m_phase == Phase::Idle || m_phase == Phase::Reading) {
        const qint64 arrived = m_pendingAt < m_pending.size() ? 0 : readMore();
        const char *from = m_pending.constData() + m_pendingAt;
        const qsizetype size = m_pending.size() - m_pendingAt;
        if (size == 0)
            return;
        if (m_scanArmed && scanForObsFold(QByteArrayView(from, size)))
            m_obsFold = true; // refused when the parser completes this message's headers
        const llhttp_errno_t err = llhttp_execute(&m_parser, from, size_t(size));
        m_pace.received(arrived); // counted once, when they arrived
        if (err == HPE_OK) {
            consumePending(size);
            continue;
        }
        if (err == HPE_PAUSED) {
            consumePending(llhttp_get_error_pos(&m_parser) - from);
            holdPending(); // what follows this request waits for its answer
            llhttp_resume(&m_parser);
            dispatch();
            return;
        }
        if (m_earlyStatus)
            fail(m_earlyStatus, m_earlyDetail);
        else
            fail(400, u"malformed HTTP request: %1"_qs.arg(
                          QString::fromLatin1(llhttp_get_error_reason(&m_parser))));
        return;
    }
}

// llhttp takes a header line that begins with a space or tab (obs-fold) as more of the value
// above it — or, after an empty value, as mere whitespace: `Transfer-Encoding:\r\n chunked`
// would read as chunked. RFC 9112 §5.2 lets a server refuse it, and so we do; the fold is only
// visible in the raw bytes, so the header section is scanned here as it arrives, up to the
// blank line that ends it. True when a fold was found.
bool HttpConnection::scanForObsFold(QByteArrayView data)
{
    for (const char c : data) {
        if (m_scanAtLineStart) {
            m_scanAtLineStart = false;
            m_scanLineEmpty = true;
            if ((c == ' ' || c == '\t') && m_scanSawLine) {
                m_scanArmed = false;
                return true;
            }
        }
        if (c == '\n') {
            if (!m_scanLineEmpty)
                m_scanSawLine = true;
            else if (m_scanSawLine) { // the blank line: the header section is over
                m_scanArmed = false;
                return false;
            }
            m_scanAtLineStart = true;
        } else if (c != '\r') {
            m_scanLineEmpty = false;
        }
    }
    return false;
}

int HttpConnection::refuseEarly(int status, const QString &detail)
{
    m_earlyStatus = status;
    m_earlyDetail = detail;
    return -1;
}

int HttpConnection::onMessageBegin(llhttp_t *p)
{
    auto *c = static_cast<HttpConnection *>(p->data);
    c->m_request = HttpRequest{};
    c->m_request.peer = c->m_socket->peerAddress();
    c->m_request.receivedAtUs = monotonicUs();
    c->m_field.clear();
    c->m_value.clear();
    c->m_inValue = false;
    c->m_headerBytes = 0;
    c->m_headerLines = 0;
    c->m_hostLines = 0;
    c->m_unnamedField = false;
    c->m_messageDone = false;
    c->m_phase = Phase::Reading;
    c->m_requestStartMs = monotonicUs() / 1000;
    c->m_pace.start(c->m_requestStartMs);
    c->m_timer.start(c->readingTimerMs());
    return 0;
}

bool HttpConnection::countHeaderBytes(size_t len)
{
    m_headerBytes += qint64(len);
    if (m_headerBytes > m_server->m_limits.maxHeaderBytes) {
        refuseEarly(431, u"the request's headers are too large or too many"_qs);
        return false;
    }
    return true;
}

void addField(HeaderList &headers, const QByteArray &name, const QByteArray &value)
{
    auto existing = std::find_if(headers.begin(), headers.end(), [&](const auto &h) {
        return h.first.compare(name, Qt::CaseInsensitive) == 0;
    });
    if (existing == headers.end())
        headers.append({name, value});
    else if (existing->second.isEmpty())
        existing->second = value;
    else if (!value.isEmpty())
        existing->second += (name.compare("Cookie", Qt::CaseInsensitive) == 0 ? "; " : ", ") + value;
}

// One field line read (see addField).
void HttpConnection::addHeader()
{
    ++m_headerLines;
    if (m_field.compare("Host", Qt::CaseInsensitive) == 0)
        ++m_hostLines;
    // Refused with the header section: stored, it would be replayed as an invalid line.
    if (m_field.isEmpty())
        m_unnamedField = true;
    addField(m_request.headers, m_field, m_value.trimmed());
    m_field.clear();
    m_value.clear();
    m_inValue = false;
}

int HttpConnection::onUrl(llhttp_t *p, const char *at, size_t len)
{
    auto *c = static_cast<HttpConnection *>(p->data);
    if (!c->countHeaderBytes(len))
        return -1;
    c->m_request.target.append(at, qsizetype(len));
    return 0;
}

int HttpConnection::onHeaderField(llhttp_t *p, const char *at, size_t len)
{
    auto *c = static_cast<HttpConnection *>(p->data);
    if (!c->countHeaderBytes(len))
        return -1;
    if (p->flags & F_TRAILING)
        return 0; // a trailer of a chunked body: read (and counted), never a header
    if (c->m_inValue) {
        c->addHeader();
        if (c->m_headerLines >= c->m_server->m_limits.maxHeaders)
            return c->refuseEarly(431, u"the request's headers are too large or too many"_qs);
    }
    c->m_field.append(at, qsizetype(len));
    return 0;
}

int HttpConnection::onHeaderValue(llhttp_t *p, const char *at, size_t len)
{
    auto *c = static_cast<HttpConnection *>(p->data);
    if (!c->countHeaderBytes(len))
        return -1;
    if (p->flags & F_TRAILING)
        return 0;
    c->m_inValue = true;
    c->m_value.append(at, qsizetype(len));
    return 0;
}

int HttpConnection::onHeadersComplete(llhttp_t *p)
{
    auto *c = static_cast<HttpConnection *>(p->data);
    HttpRequest &r = c->m_request;
    if (c->m_inValue || !c->m_field.isEmpty())
        c->addHeader(); // and the field/value state is clear for the trailers, if any
    if (c->m_headerLines > c->m_server->m_limits.maxHeaders)
        return c->refuseEarly(431, u"the request's headers are too large or too many"_qs);
    if (c->m_obsFold)
        return c->refuseEarly(400, u"a header line begins with whitespace (obsolete line folding): "
                                   "send each field on one line"_qs);
    if (c->m_unnamedField)
        return c->refuseEarly(400, u"a header field has no name"_qs);
    if (const int refused = c->checkFraming(p))
        return refused;
    r.method = llhttp_method_name(llhttp_method_t(p->method));
    const qsizetype q = r.target.indexOf('?');
    r.path = QByteArray::fromPercentEncoding(q < 0 ? r.target : r.target.left(q));
    r.query = q < 0 ? QByteArray() : r.target.mid(q + 1);

    const HttpLimits &limits = c->m_server->m_limits;
    c->m_maxBody = limits.maxBodyFor ? limits.maxBodyFor(r.path) : limits.defaultMaxBody;
    if ((p->flags & F_CONTENT_LENGTH) && p->content_length > quint64(c->m_maxBody))
        return c->refuseEarly(
            413, u"the body is larger than this endpoint accepts (%1 bytes)"_qs.arg(c->m_maxBody));
    // A body of known length gets its first share of the budget now: refused, it is refused
    // before the client sends it (before 100 Continue).
    const bool sized = p->flags & F_CONTENT_LENGTH;
    c->m_bodyLimit = sized ? qint64(p->content_length) : c->m_maxBody;
    if (sized && p->content_length > 0 && !c->growBody(1))
        return -1;
    const QByteArray expect = r.header("Expect");
    if (!expect.isEmpty()) {
        if (expect.compare("100-continue", Qt::CaseInsensitive) != 0)
            return c->refuseEarly(417, u"only 'Expect: 100-continue' is supported"_qs);
        if (p->http_minor >= 1)
            c->m_socket->write("HTTP/1.1 100 Continue\r\n\r\n");
    }
    return 0;
}

// Host and Transfer-Encoding as RFC 9112 §3.2 and §6 want them; 0 when the message may go on.
int HttpConnection::checkFraming(const llhttp_t *p)
{
    const bool http11 = p->http_major == 1 && p->http_minor >= 1;
    if (m_hostLines > 1)
        return refuseEarly(400, u"more than one Host header"_qs);
    if (http11 && m_hostLines == 0)
        return refuseEarly(400, u"an HTTP/1.1 request must carry a Host header"_qs);
    if (!m_request.hasHeader("Transfer-Encoding"))
        return 0;
    if (!http11) // RFC 9112 §6.1: the framing of such a message cannot be trusted
        return refuseEarly(400, u"Transfer-Encoding in an HTTP/1.0 request"_qs);
    QByteArrayList codings;
    for (const QByteArray &coding : m_request.header("Transfer-Encoding").split(','))
        if (const QByteArray c = coding.trimmed().toLower(); !c.isEmpty())
            codings.append(c);
    // Without a final chunked the body's length is unknown: 400, and the connection closes.
    if (codings.isEmpty() || codings.last() != "chunked" || codings.count("chunked") > 1)
        return refuseEarly(400, u"the Transfer-Encoding must end with chunked, once"_qs);
    // gzip, deflate, …: nothing here decodes them, and the body must not be taken as plain.
    if (codings.size() > 1)
        return refuseEarly(
            501,
            u"transfer coding '%1' is not supported: send the body chunked or with a Content-Length"_qs
                .arg(QString::fromLatin1(codings.first())));
    return 0;
}

int HttpConnection::onBody(llhttp_t *p, const char *at, size_t len)
{
    auto *c = static_cast<HttpConnection *>(p->data);
    // Chunked bodies are counted as they arrive.
    const qint64 needed = c->m_request.body.size() + qint64(len);
    if (needed > c->m_maxBody)
        return c->refuseEarly(
            413, u"the body is larger than this endpoint accepts (%1 bytes)"_qs.arg(c->m_maxBody));
    if (needed > c->m_reserved && !c->growBody(needed))
        return -1;
    c->m_request.body.append(at, qsizetype(len));
    return 0;
}

int HttpConnection::onMessageComplete(llhttp_t *p)
{
    auto *c = static_cast<HttpConnection *>(p->data);
    c->m_keepAlive = llhttp_should_keep_alive(p);
    c->m_messageDone = true;
    // The next message's header section is scanned from its first byte (see scanForObsFold).
    c->m_scanArmed = true;
    c->m_scanAtLineStart = true;
    c->m_scanSawLine = false;
    c->m_obsFold = false;
    return HPE_PAUSED; // one request at a time: parsing resumes after its answer is written
}

bool HttpConnection::growBody(qint64 needed)
{
    // Grown in bounded steps, never doubled: a buffer holds at most one step more than its body,
    // and the budget counts what is allocated, not what arrived.
    constexpr qint64 kStep = 64 * 1024;
    const qint64 capacity = nextBodyCapacity(needed, m_reserved, kStep, m_bodyLimit);
    switch (m_server->m_budget.reserve(m_client, capacity - m_reserved)) {
    case LimitRefusal::Server:
        refuseEarly(503, u"the receiver holds as many request bytes as it may (%1 bytes): "
                         "send it again later"_qs.arg(m_server->m_limits.maxBufferedBytes));
        return false;
    case LimitRefusal::Client:
        refuseEarly(429, u"this client's requests hold as many bytes as one client may (%1 "
                         "bytes): send it again once they are answered"_qs.arg(
                             m_server->m_limits.maxBufferedBytesPerClient));
        return false;
    case LimitRefusal::None:
        break;
    }
    m_server->m_bufferedBytes = m_server->m_budget.bufferedBytes();
    m_reserved = capacity;
    m_request.body.reserve(capacity);
    return true;
}

qint64 HttpConnection::readMore()
{
    dropPending();
    const qint64 available =
        std::min(m_socket->bytesAvailable(), m_server->m_limits.readBufferBytes);
    if (available <= 0)
        return 0;
    m_pending = m_socket->read(available);
    return m_pending.size();
}

void HttpConnection::holdPending()
{
    if (m_pending.isEmpty() || m_pendingHeld)
        return;
    m_pendingHeld = m_pending.size();
    m_server->m_budget.hold(m_client, m_pendingHeld);
    m_server->m_bufferedBytes = m_server->m_budget.bufferedBytes();
}

void HttpConnection::consumePending(qint64 bytes)
{
    m_pendingAt += bytes;
    if (m_pendingAt >= m_pending.size())
        dropPending();
}

void HttpConnection::dropPending()
{
    if (m_pendingHeld) {
        m_server->m_budget.release(m_client, m_pendingHeld);
        m_server->m_bufferedBytes = m_server->m_budget.bufferedBytes();
        m_pendingHeld = 0;
    }
    m_pending.clear();
    m_pendingAt = 0;
}

void HttpConnection::countUnsent()
{
    const qint64 unsent = m_socket->bytesToWrite();
    if (unsent > m_unsent)
        m_server->m_budget.hold(m_client, unsent - m_unsent);
    else
        m_server->m_budget.release(m_client, m_unsent - unsent);
    m_unsent = unsent;
    m_server->m_bufferedBytes = m_server->m_budget.bufferedBytes();
}

qint64 HttpConnection::takenByClient() const
{
    int queued = 0; // sent or not, not yet acknowledged
    if (::ioctl(int(m_socket->socketDescriptor()), SIOCOUTQ, &queued) != 0)
        queued = 0;
    return m_written - queued;
}

void HttpConnection::countTaken()
{
    const qint64 taken = takenByClient();
    m_drainPace.received(std::max<qint64>(0, taken - m_taken));
    m_taken = std::max(m_taken, taken);
}

bool HttpConnection::mustDrain() const
{
    // Past the budget (the server's or its client's share), a connection takes no new request
    // until its client has taken every answer it has: what it holds then is its last read.
    const HttpLimits &limits = m_server->m_limits;
    const ConnectionBudget &budget = m_server->m_budget;
    return m_unsent > limits.maxUnsentBytes ||
           (m_unsent > 0 && (budget.bufferedBytes() > limits.maxBufferedBytes ||
                             budget.bufferedBytes(m_client) > limits.maxBufferedBytesPerClient));
}

void HttpConnection::releaseBody()
{
    if (!m_reserved)
        return;
    m_server->m_budget.release(m_client, m_reserved);
    m_server->m_bufferedBytes = m_server->m_budget.bufferedBytes();
    m_reserved = 0;
}

void HttpConnection::stop()
{
    // Waiting or Draining: its answer closes it. Reading: answered 503 once it has arrived, and
    // so is a request already here on an idle one; an idle one with nothing is closed.
    if (m_phase == Phase::Idle && !readArrived())
        close();
}

bool HttpConnection::readArrived()
{
    if (m_socket->bytesAvailable() == 0)
        m_socket->waitForReadyRead(0); // what the kernel holds, without blocking
    if (m_phase != Phase::Idle)
        return true; // its readyRead ran processInput: a request arrives (its own timer runs)
    if (m_socket->bytesAvailable() == 0 && m_pendingAt == m_pending.size())
        return false;
    processInput();
    return true;
}

void HttpConnection::dispatch()
{
    if (!m_messageDone)
        return;
    m_messageDone = false;
    if (m_server->m_stopping) {
        // Not handed to the engine: nothing is claimed, so the sender's retry is a first delivery
        // for whichever receiver takes it.
        HttpResponse r = HttpResponse::problem(
            503, u"Receiver stopping"_qs,
            u"this receiver is shutting down and did not start the delivery; send it again"_qs);
        r.setHeader("Retry-After", "1");
        r.setHeader("Idempotency-Outcome", "rejected");
        writeResponse(r, true, m_request.method == "HEAD");
        if (m_server->m_onReject) // the delivery log's line for it
            m_server->m_onReject(m_request, 503, u"receiver stopping: not started"_qs);
        return;
    }
    m_phase = Phase::Waiting;
    m_timer.stop();
    const quint64 sequence = ++m_sequence;
    m_head = m_request.method == "HEAD";
    m_server->m_handler(std::move(m_request), Responder(this, sequence));
}

void HttpConnection::answer(quint64 sequence, const HttpResponse &response)
{
    if (sequence != m_sequence || m_phase != Phase::Waiting)
        return; // an answer for an earlier request, or a second answer
    releaseBody();
    writeResponse(response, !m_keepAlive || m_server->m_stopping, m_head);
    if (m_phase == Phase::Closing)
        return;
    // A client that sends requests but does not read the answers must not make us hold them
    // all: its next request is read once what waits for it is back under the bound, and it must
    // take them at a minimum rate meanwhile.
    if (mustDrain()) {
        m_phase = Phase::Draining;
        m_drainPace.start(monotonicUs() / 1000);
        m_taken = takenByClient();
        m_timer.start(m_server->m_limits.idleTimeoutMs);
        return;
    }
    m_timer.start(m_server->m_limits.idleTimeoutMs);
    m_phase = Phase::Idle;
    // Resume with pipelined bytes already read, outside of the caller's stack.
    QMetaObject::invokeMethod(this, &HttpConnection::processInput, Qt::QueuedConnection);
}

void HttpConnection::onBytesWritten(qint64 bytes)
{
    m_written += bytes;
    countUnsent();
    if (m_phase != Phase::Draining)
        return;
    // Written is not idle, but a byte now and then is no progress: the pace decides when the
    // timer runs out (onTimeout), and the idle time starts again once it is back under.
    countTaken();
    if (mustDrain())
        return;
    m_timer.start(m_server->m_limits.idleTimeoutMs);
    m_phase = Phase::Idle;
    QMetaObject::invokeMethod(this, &HttpConnection::processInput, Qt::QueuedConnection);
}

void HttpConnection::fail(int status, const QString &detail)
{
    HttpResponse r = HttpResponse::problem(status, QString::fromLatin1(reasonPhrase(status)), detail);
    r.setHeader("Idempotency-Outcome", "rejected");
    if (status == 429 || status == 503) // the budget's: nothing was started, so send it again
        r.setHeader("Retry-After", "1");
    writeResponse(r, true, m_request.method == "HEAD");
    if (m_server->m_onReject)
        m_server->m_onReject(m_request, status, detail);
    // What it buffered of a refused request leaves the budget now, not when the client closes.
    releaseBody();
    m_request.body = QByteArray();
}

void HttpConnection::writeResponse(const HttpResponse &given, bool closeAfter, bool head)
{
    // Whatever the answer's source (a stored result: a shared store may hold any bytes), what
    // goes out is one answer: a final status, and fields that cannot end early. A field that is
    // not valid is dropped, not the answer: it is the record's status and body that tell the
    // sender its delivery was taken, and refusing it (502) would have the sender retry a
    // completed event until it gives up on the endpoint.
    const bool finalStatus = given.status >= 200 && given.status <= 599;
    const HttpResponse response =
        finalStatus ? given
                    : HttpResponse::problem(
                          502, u"Bad Gateway"_qs,
                          u"the stored answer has no valid HTTP status: see the receiver's log"_qs);
    if (!finalStatus)
        qWarning("idemdesk: an answer's status %d is not a final HTTP status: 502 sent instead",
                 given.status);
    QByteArray out;
    out.reserve(256 + response.body.size());
    out += "HTTP/1.1 " + QByteArray::number(response.status) + ' ' + reasonPhrase(response.status)
           + "\r\nDate: " + httpDate() + "\r\n";
    for (const auto &[name, value] : response.headers) {
        if (name.compare("Content-Length", Qt::CaseInsensitive) == 0
            || name.compare("Connection", Qt::CaseInsensitive) == 0
            || name.compare("Transfer-Encoding", Qt::CaseInsensitive) == 0)
            continue;
        if (!isFieldName(name) || !isFieldValue(value)) {
            qWarning("idemdesk: an answer's header field is not valid HTTP and was dropped: %s",
                     qUtf8Printable(escapeControls(QString::fromLatin1(name + ": " + value))));
            continue;
        }
        out += name + ": " + value + "\r\n";
    }
    // An answer to HEAD is a GET's without its content: the same Content-Length (RFC 9110 9.3.2,
    // 8.6), and no body, whatever the handler put there. A 204 or 304 has neither (RFC 9110
    // §8.6, §15.3.5, §15.4.5: a stored one is replayed the same way).
    const bool noContent = response.status == 204 || response.status == 304;
    if (!noContent)
        out += "Content-Length: " + QByteArray::number(response.body.size()) + "\r\n";
    if (closeAfter)
        out += "Connection: close\r\n";
    out += "\r\n";
    if (!head && !noContent)
        out += response.body;
    m_socket->write(out);
    // Written now, not when the loop next sees the socket writable: the write notifier QTcpSocket
    // enables is disabled again within this turn, so epoll is not told (EpollDispatcher).
    m_socket->flush();
    countUnsent();
    if (closeAfter)
        close();
}

void HttpConnection::onTimeout()
{
    // An "idle" connection whose request is already here (the thread was busy when the timer
    // ran out) is not idle: read it instead of closing it unanswered.
    if (m_phase == Phase::Idle) {
        m_timer.start(m_server->m_limits.idleTimeoutMs); // before reading: the request's own wins
        if (readArrived())
            return;
    }
    if (m_phase == Phase::Draining)
        countTaken();
    if (m_phase == Phase::Reading) {
        onReadingTimeout();
    } else if (m_phase == Phase::Draining && m_drainPace.enabled() &&
               !m_drainPace.tooSlow(monotonicUs() / 1000)) {
        // It takes them fast enough (or the timer ran early): on to its window's end.
        const qint64 left = m_drainPace.windowEndMs() - monotonicUs() / 1000;
        m_timer.start(int(std::max<qint64>(1, left)));
    } else if (m_phase == Phase::Draining || m_phase == Phase::Closing) {
        // The client took too little of its answers for the idle time: drop them with it.
        m_socket->abort();
        deleteLater();
    } else {
        close();
    }
}

int HttpConnection::readingTimerMs() const
{
    qint64 due = m_requestStartMs + m_server->m_limits.requestTimeoutMs;
    if (m_pace.enabled())
        due = std::min(due, m_pace.windowEndMs());
    return int(std::max<qint64>(1, due - monotonicUs() / 1000));
}

void HttpConnection::onReadingTimeout()
{
    // What the kernel holds for it arrived in time: a busy thread is not a slow client.
    if (m_socket->bytesAvailable() == 0)
        m_socket->waitForReadyRead(0);
    if (m_phase != Phase::Reading)
        return; // read whole meanwhile (or refused)
    const HttpLimits &limits = m_server->m_limits;
    const qint64 now = monotonicUs() / 1000;
    if (now - m_requestStartMs >= limits.requestTimeoutMs)
        return fail(408,
                    u"the request did not arrive within %1 ms"_qs.arg(limits.requestTimeoutMs));
    if (m_pace.tooSlow(now))
        return fail(408, u"the request arrived slower than %1 bytes per second"_qs.arg(
                             limits.minUploadBytesPerSecond));
    m_timer.start(readingTimerMs());
}

void HttpConnection::close()
{
    m_phase = Phase::Closing;
    dropPending();
    m_socket->disconnectFromHost(); // flushes what was written, then emits disconnected
    if (m_socket->state() == QAbstractSocket::UnconnectedState)
        deleteLater();
    else
        m_timer.start(m_server->m_limits.idleTimeoutMs); // a flush the client never takes ends here
}

} // namespace idem
