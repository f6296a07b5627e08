#include "http/forwardclient.h"
#include "http/httptypes.h"

#include <QObject>
#include <QPointer>
#include <QSslSocket>
#include <QTcpSocket>
#include <QTimer>

#include <llhttp.h>

#include <algorithm>
#include <limits>

namespace idem {

namespace {

// The status line and header section of an answer; past it the answer is refused as broken.
constexpr qint64 kMaxHeaderBytes = 64 * 1024; // status lines and fields, interim answers' too
constexpr int kMaxHeaderFields = 256; // distinct or not: each is looked up among those before it
constexpr int kMaxInterimAnswers = 8; // 100 Continue, 103 Early Hints: one or two in practice

QString causeOf(QAbstractSocket::SocketError error)
{
    using E = QAbstractSocket::SocketError;
    switch (error) {
    case E::ConnectionRefusedError:
        return u"connection refused"_qs;
    case E::HostNotFoundError:
        return u"host not found"_qs;
    case E::SocketTimeoutError:
        return u"connection timed out"_qs;
    case E::NetworkError:
        return u"network unreachable"_qs;
    case E::SslHandshakeFailedError:
    case E::SslInternalError:
    case E::SslInvalidUserDataError:
        return u"TLS handshake failed"_qs;
    default:
        return u"connection failed"_qs;
    }
}

// One request on one connection. Deletes itself once `done` has been called.
class ForwardCall final : public QObject
{
public:
    ForwardCall(ForwardRequest request, std::function<void(ForwardOutcome)> done, QObject *parent);
    void start();

private:
    using Kind = ForwardOutcome::Kind;
    QByteArray requestBytes() const;
    void onReadyRead();
    void onClosed();
    void onSocketError(QAbstractSocket::SocketError error);
    void feed(const QByteArray &data);
    void finish(Kind kind, const QString &error = {});

    static const llhttp_settings_t &settings();
    static int onMessageBegin(llhttp_t *p);
    static int onStatus(llhttp_t *p, const char *at, size_t len);
    static int onStatusComplete(llhttp_t *p);
    static int onHeaderField(llhttp_t *p, const char *at, size_t len);
    static int onHeaderValue(llhttp_t *p, const char *at, size_t len);
    static int onHeadersComplete(llhttp_t *p);
    static int onBody(llhttp_t *p, const char *at, size_t len);
    static int onMessageComplete(llhttp_t *p);
    bool countHeaderBytes(size_t len);
    bool addHeader();
    int refuse(Kind kind, const QString &why);

    ForwardRequest m_request;
    std::function<void(ForwardOutcome)> m_done;
    QTcpSocket *m_socket = nullptr;
    QTimer m_deadline;
    llhttp_t m_parser;
    ForwardOutcome m_outcome;
    QByteArray m_field;
    QByteArray m_value;
    bool m_inValue = false;
    qint64 m_headerBytes = 0;
    int m_fields = 0;                // of the answer being read
    int m_interim = 0;               // 1xx answers read
    bool m_connected = false;        // the connection (and TLS handshake) stood
    bool m_finalStatus = false;      // a final answer's status line was read
    bool m_complete = false;         // a whole final answer was read
    bool m_finished = false;         // `done` was called
    Kind m_refusal = Kind::Answered; // set by a callback that stops the parser
    QString m_refusalText;
};

ForwardCall::ForwardCall(ForwardRequest request, std::function<void(ForwardOutcome)> done,
                         QObject *parent)
    : QObject(parent), m_request(std::move(request)), m_done(std::move(done))
{
    llhttp_init(&m_parser, HTTP_RESPONSE, &settings());
    m_parser.data = this;
    m_deadline.setSingleShot(true);
    connect(&m_deadline, &QTimer::timeout, this, [this] {
        finish(Kind::TimedOut, u"no whole answer within %1 ms"_qs.arg(m_request.deadlineMs));
    });
}

void ForwardCall::start()
{
    m_deadline.start(
        int(std::clamp<qint64>(m_request.deadlineMs, 0, std::numeric_limits<int>::max())));
    const QUrl &url = m_request.url;
    const QString host = url.host(QUrl::FullyEncoded);
    const bool https = url.scheme().compare(u"https"_qs, Qt::CaseInsensitive) == 0;
    const quint16 port = quint16(url.port(https ? 443 : 80));
    if (https) {
        if (!QSslSocket::supportsSsl()) {
            QTimer::singleShot(0, this, [this] {
                finish(Kind::Unreachable, u"TLS is not available (no OpenSSL backend)"_qs);
            });
            return;
        }
        auto *socket = new QSslSocket(this);
        m_socket = socket;
        // Certificates are verified as usual (VerifyPeer against the host name): an sslErrors
        // not ignored ends the handshake with an error, reported as unreachable.
        connect(socket, &QSslSocket::encrypted, this, [this] {
            m_connected = true;
            m_socket->write(requestBytes());
        });
    } else {
        m_socket = new QTcpSocket(this);
        connect(m_socket, &QTcpSocket::connected, this, [this] {
            m_connected = true;
            m_socket->write(requestBytes());
        });
    }
    connect(m_socket, &QTcpSocket::readyRead, this, &ForwardCall::onReadyRead);
    connect(m_socket, &QTcpSocket::disconnected, this, &ForwardCall::onClosed);
    connect(m_socket, &QTcpSocket::errorOccurred, this, &ForwardCall::onSocketError);
    if (https)
        static_cast<QSslSocket *>(m_socket)->connectToHostEncrypted(host, port);
    else
        m_socket->connectToHost(host, port);
}

QByteArray ForwardCall::requestBytes() const
{
    const QUrl &url = m_request.url;
    QByteArray target =
        url.toEncoded(QUrl::RemoveScheme | QUrl::RemoveAuthority | QUrl::RemoveFragment);
    if (!target.startsWith('/'))
        target.prepend('/');
    QByteArray host = url.host(QUrl::FullyEncoded).toLatin1();
    if (host.contains(':'))
        host = '[' + host + ']'; // an IPv6 literal
    const bool https = url.scheme().compare(u"https"_qs, Qt::CaseInsensitive) == 0;
    if (url.port() != -1 && url.port() != (https ? 443 : 80))
        host += ':' + QByteArray::number(url.port());

    QByteArray out = "POST " + target + " HTTP/1.1\r\nHost: " + host + "\r\n";
    for (const auto &[name, value] : m_request.headers) {
        // The receiver's parser lets no invalid field through; this keeps it so for every caller.
        if (!isFieldName(name) || !isFieldValue(value))
            continue;
        out += name + ": " + value + "\r\n";
    }
    out += "Content-Length: " + QByteArray::number(m_request.body.size()) +
           "\r\nConnection: close\r\n\r\n";
    return out + m_request.body;
}

void ForwardCall::onReadyRead()
{
    if (!m_finished)
        feed(m_socket->readAll());
}

// The downstream closed: what it sent before is read, and an answer framed by the close ends.
void ForwardCall::onClosed()
{
    if (m_finished)
        return;
    feed(m_socket->readAll());
    if (m_finished)
        return;
    if (!m_connected)
        return finish(Kind::Unreachable, m_socket->errorString());
    llhttp_finish(&m_parser); // calls onMessageComplete for a body read up to the close
    if (m_complete)
        return finish(Kind::Answered);
    if (m_refusal != Kind::Answered)
        return finish(m_refusal, m_refusalText);
    finish(Kind::BrokenAnswer, m_outcome.status == 0
                                   ? u"the connection closed before an answer"_qs
                                   : u"the connection closed before the answer was complete"_qs);
}

void ForwardCall::onSocketError(QAbstractSocket::SocketError error)
{
    if (m_finished)
        return;
    if (error == QAbstractSocket::RemoteHostClosedError)
        return onClosed();
    if (!m_connected)
        return finish(Kind::Unreachable, m_socket->errorString());
    onReadyRead(); // a whole answer may have arrived before a reset
    if (!m_finished)
        finish(Kind::BrokenAnswer,
               u"the connection broke before the answer was complete: %1"_qs.arg(
                   m_socket->errorString()));
}

void ForwardCall::feed(const QByteArray &data)
{
    if (data.isEmpty() || m_complete)
        return;
    const llhttp_errno_t err = llhttp_execute(&m_parser, data.constData(), size_t(data.size()));
    if (m_complete)
        return finish(Kind::Answered); // whatever follows the answer is not read
    if (err == HPE_OK)
        return;
    if (m_refusal != Kind::Answered)
        return finish(m_refusal, m_refusalText);
    if (err == HPE_PAUSED_UPGRADE)
        return finish(Kind::BrokenAnswer,
                      u"the answer switches protocols, which was not asked for"_qs);
    finish(Kind::BrokenAnswer, u"malformed HTTP answer: %1"_qs.arg(
                                   QString::fromLatin1(llhttp_get_error_reason(&m_parser))));
}

void ForwardCall::finish(Kind kind, const QString &error)
{
    if (m_finished)
        return;
    m_finished = true;
    m_deadline.stop();
    QString cause;
    if (kind == Kind::Unreachable)
        cause = m_socket ? causeOf(m_socket->error()) : u"TLS not available"_qs;
    if (m_socket) {
        m_socket->disconnect(this);
        m_socket->abort();
    }
    ForwardOutcome outcome = std::move(m_outcome);
    outcome.kind = kind;
    outcome.connected = m_connected;
    outcome.finalStatusRead = m_finalStatus;
    if (kind != Kind::Answered) {
        outcome.error = error;
        outcome.body.clear();
    }
    outcome.cause = cause;
    auto done = std::move(m_done);
    deleteLater();
    done(std::move(outcome));
}

// ---------------------------------------------------------------------------------------------

const llhttp_settings_t &ForwardCall::settings()
{
    static const llhttp_settings_t s = [] {
        llhttp_settings_t s;
        llhttp_settings_init(&s);
        s.on_message_begin = &ForwardCall::onMessageBegin;
        s.on_status = &ForwardCall::onStatus;
        s.on_status_complete = &ForwardCall::onStatusComplete;
        s.on_header_field = &ForwardCall::onHeaderField;
        s.on_header_value = &ForwardCall::onHeaderValue;
        s.on_headers_complete = &ForwardCall::onHeadersComplete;
        s.on_body = &ForwardCall::onBody;
        s.on_message_complete = &ForwardCall::onMessageComplete;
        return s;
    }();
    return s;
}

// Also after an interim (1xx) answer: the final one starts afresh.
int ForwardCall::onMessageBegin(llhttp_t *p)
{
    auto *c = static_cast<ForwardCall *>(p->data);
    c->m_outcome = ForwardOutcome{};
    c->m_field.clear();
    c->m_value.clear();
    c->m_inValue = false;
    c->m_fields = 0;
    return 0;
}

// The status line's text counts with the header section (an endless one is cut there too).
int ForwardCall::onStatus(llhttp_t *p, const char *, size_t len)
{
    return static_cast<ForwardCall *>(p->data)->countHeaderBytes(len) ? 0 : -1;
}

int ForwardCall::onStatusComplete(llhttp_t *p)
{
    if (p->status_code >= 200 || p->status_code < 100)
        static_cast<ForwardCall *>(p->data)->m_finalStatus = true;
    return 0;
}

// Stops the parser: the answer is refused as `kind`, for `why`.
int ForwardCall::refuse(Kind kind, const QString &why)
{
    m_refusal = kind;
    m_refusalText = why;
    return -1;
}

bool ForwardCall::countHeaderBytes(size_t len)
{
    m_headerBytes += qint64(len);
    if (m_headerBytes <= kMaxHeaderBytes)
        return true;
    refuse(Kind::BrokenAnswer,
           u"the answer's header section is over %1 bytes"_qs.arg(kMaxHeaderBytes));
    return false;
}

// Each field once, as the receiver keeps a request's: a repeated field's values are joined.
// False (the answer refused) for a field with no name, which would be stored and replayed as
// an invalid line, and past kMaxHeaderFields.
bool ForwardCall::addHeader()
{
    if (m_field.isEmpty()) {
        refuse(Kind::BrokenAnswer, u"a header field has no name"_qs);
        return false;
    }
    if (++m_fields > kMaxHeaderFields) {
        refuse(Kind::BrokenAnswer,
               u"the answer has more than %1 header fields"_qs.arg(kMaxHeaderFields));
        return false;
    }
    addField(m_outcome.headers, m_field, m_value.trimmed());
    m_field.clear();
    m_value.clear();
    m_inValue = false;
    return true;
}

int ForwardCall::onHeaderField(llhttp_t *p, const char *at, size_t len)
{
    auto *c = static_cast<ForwardCall *>(p->data);
    if (!c->countHeaderBytes(len))
        return -1;
    if (p->flags & F_TRAILING)
        return 0; // a trailer of a chunked body: dropped, never a header
    if (c->m_inValue && !c->addHeader())
        return -1;
    c->m_field.append(at, qsizetype(len));
    return 0;
}

int ForwardCall::onHeaderValue(llhttp_t *p, const char *at, size_t len)
{
    auto *c = static_cast<ForwardCall *>(p->data);
    if (!c->countHeaderBytes(len))
        return -1;
    if (p->flags & F_TRAILING)
        return 0;
    c->m_inValue = true;
    c->m_value.append(at, qsizetype(len));
    return 0;
}

int ForwardCall::onHeadersComplete(llhttp_t *p)
{
    auto *c = static_cast<ForwardCall *>(p->data);
    if ((c->m_inValue || !c->m_field.isEmpty()) && !c->addHeader())
        return -1;
    c->m_outcome.status = p->status_code;
    if (p->status_code < 200 && ++c->m_interim > kMaxInterimAnswers)
        return c->refuse(Kind::BrokenAnswer,
                         u"more than %1 interim (1xx) answers"_qs.arg(kMaxInterimAnswers));
    // A transfer coding other than chunked (gzip, …) would be stored still coded, its header gone.
    for (const QByteArray &coding :
         headerValue(c->m_outcome.headers, "Transfer-Encoding").split(','))
        if (const QByteArray name = coding.trimmed();
            !name.isEmpty() && name.compare("chunked", Qt::CaseInsensitive) != 0)
            return c->refuse(Kind::BrokenAnswer,
                             u"the answer's transfer coding '%1' is not supported"_qs.arg(
                                 QString::fromLatin1(name)));
    // 204 and 304 end at their header section whatever Content-Length says (RFC 9112 §6.3): 1
    // tells llhttp there is no body.
    if (p->status_code == 204 || p->status_code == 304)
        return 1;
    // A declared length past the bound is refused before any of the body is read.
    if ((p->flags & F_CONTENT_LENGTH) && p->content_length > quint64(c->m_request.maxResponseBytes))
        return c->refuse(Kind::TooLarge,
                         u"the answer's Content-Length is %1 bytes"_qs.arg(p->content_length));
    return 0;
}

int ForwardCall::onBody(llhttp_t *p, const char *at, size_t len)
{
    auto *c = static_cast<ForwardCall *>(p->data);
    if (c->m_outcome.body.size() + qint64(len) > c->m_request.maxResponseBytes)
        return c->refuse(Kind::TooLarge, u"the answer's body is over %1 bytes"_qs.arg(
                                             c->m_request.maxResponseBytes));
    c->m_outcome.body.append(at, qsizetype(len));
    return 0;
}

int ForwardCall::onMessageComplete(llhttp_t *p)
{
    auto *c = static_cast<ForwardCall *>(p->data);
    // 100 Continue, 103 Early Hints: interim, the final answer follows on the same connection.
    if (p->status_code >= 100 && p->status_code < 200 && p->status_code != 101)
        return 0;
    if (p->status_code == 101)
        return c->refuse(Kind::BrokenAnswer,
                         u"the answer switches protocols, which was not asked for"_qs);
    c->m_complete = true;
    return HPE_PAUSED;
}

} // namespace

void forwardRequest(ForwardRequest request, QObject *context,
                    std::function<void(ForwardOutcome)> done)
{
    auto *call = new ForwardCall(std::move(request), std::move(done), context);
    call->start();
}

} // namespace idem
