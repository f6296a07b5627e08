#include "http/blockingclient.h"

#include <QDeadlineTimer>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace idem {

namespace {
// A signal (SIGALRM, SIGCHLD, SIGWINCH on a terminal resize) interrupts blocking calls with
// EINTR; that is neither a timeout nor a closed peer. These wrappers resume the call, poll with
// what is left of its time.
int pollFor(int fd, short events, int timeoutMs)
{
    QDeadlineTimer deadline(timeoutMs);
    for (;;) {
        pollfd p{fd, events, 0};
        const int n = ::poll(&p, 1, int(deadline.remainingTime()));
        if (n >= 0 || errno != EINTR)
            return n;
    }
}

ssize_t recvSome(int fd, char *into, size_t size)
{
    for (;;) {
        const ssize_t n = ::recv(fd, into, size, 0);
        if (n >= 0 || errno != EINTR)
            return n;
    }
}

// connect() within timeoutMs: started without blocking, then the socket becomes writable when
// it is done (an interrupted wait resumes), and SO_ERROR tells how it ended. A SYN the server's
// kernel dropped is sent again only after a second or more: without a deadline connect() waits
// for minutes.
bool connectWithin(int fd, const sockaddr_in &addr, int timeoutMs, int &error)
{
    const int flags = ::fcntl(fd, F_GETFL);
    ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    bool connected = ::connect(fd, reinterpret_cast<const sockaddr *>(&addr), sizeof addr) == 0;
    error = connected ? 0 : errno;
    if (!connected && (error == EINPROGRESS || error == EINTR)) {
        if (pollFor(fd, POLLOUT, timeoutMs) <= 0) {
            error = ETIMEDOUT;
        } else {
            socklen_t size = sizeof error;
            if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) != 0)
                error = errno;
            connected = error == 0;
        }
    }
    ::fcntl(fd, F_SETFL, flags);
    return connected;
}
} // namespace

RawConnection::RawConnection(quint16 port, int timeoutMs, const QByteArray &ipv4,
                             const QByteArray &sourceIpv4)
    : m_timeoutMs(timeoutMs)
{
    m_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    sockaddr_in source{};
    source.sin_family = AF_INET;
    if (::inet_pton(AF_INET, ipv4.constData(), &addr.sin_addr) != 1 ||
        (!sourceIpv4.isEmpty() &&
         (::inet_pton(AF_INET, sourceIpv4.constData(), &source.sin_addr) != 1 ||
          ::bind(m_fd, reinterpret_cast<const sockaddr *>(&source), sizeof source) != 0))) {
        m_connectErrno = errno;
        ::close(m_fd);
        m_fd = -1;
        return;
    }
    if (!connectWithin(m_fd, addr, m_timeoutMs, m_connectErrno)) {
        ::close(m_fd);
        m_fd = -1;
        return;
    }
    int one = 1;
    ::setsockopt(m_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

quint16 RawConnection::localPort() const
{
    sockaddr_in addr{};
    socklen_t size = sizeof addr;
    if (m_fd < 0 || ::getsockname(m_fd, reinterpret_cast<sockaddr *>(&addr), &size) != 0)
        return 0;
    return ntohs(addr.sin_port);
}

RawConnection::~RawConnection()
{
    close();
}

void RawConnection::close()
{
    if (m_fd >= 0)
        ::close(m_fd);
    m_fd = -1;
}

void RawConnection::abort()
{
    if (m_fd >= 0) {
        linger reset{1, 0};
        ::setsockopt(m_fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
    }
    close();
}

bool RawConnection::send(QByteArrayView bytes)
{
    qsizetype sent = 0;
    while (m_fd >= 0 && sent < bytes.size()) {
        const ssize_t n = ::send(m_fd, bytes.data() + sent, size_t(bytes.size() - sent), MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return false;
        sent += n;
    }
    return m_fd >= 0;
}

bool RawConnection::readMore()
{
    if (pollFor(m_fd, POLLIN, m_timeoutMs) <= 0)
        return false;
    char chunk[65536];
    const ssize_t n = recvSome(m_fd, chunk, sizeof chunk);
    if (n <= 0)
        return false;
    m_buffer.append(chunk, n);
    return true;
}

ClientResponse RawConnection::readResponse(bool toHead)
{
    ClientResponse r;
    if (m_fd < 0) {
        r.error =
            u"not connected: %1"_qs.arg(QString::fromLocal8Bit(std::strerror(m_connectErrno)));
        return r;
    }
    for (;;) {
        qsizetype end = m_buffer.indexOf("\r\n\r\n");
        if (end >= 0) {
            const QList<QByteArray> lines = m_buffer.left(end).split('\n');
            const QList<QByteArray> statusLine = lines.first().trimmed().split(' ');
            const int status = statusLine.size() > 1 ? statusLine.at(1).toInt() : 0;
            HeaderList headers;
            for (qsizetype i = 1; i < lines.size(); ++i) {
                const qsizetype colon = lines.at(i).indexOf(':');
                if (colon > 0)
                    headers.append({lines.at(i).left(colon).trimmed(), lines.at(i).mid(colon + 1).trimmed()});
            }
            if (status == 100) { // interim answer: skip it
                m_buffer.remove(0, end + 4);
                continue;
            }
            const qsizetype length =
                toHead ? 0 : headerValue(headers, "Content-Length").toLongLong();
            while (m_buffer.size() < end + 4 + length)
                if (!readMore()) {
                    r.error = QStringLiteral("body cut short");
                    return r;
                }
            r.status = status;
            r.headers = headers;
            r.body = m_buffer.mid(end + 4, length);
            m_buffer.remove(0, end + 4 + length);
            return r;
        }
        if (!readMore()) {
            r.error = QStringLiteral("no answer");
            return r;
        }
    }
}

QByteArray RawConnection::readBytes(qsizetype count)
{
    while (m_fd >= 0 && m_buffer.size() < count)
        if (!readMore())
            break;
    const QByteArray bytes = m_buffer.left(count);
    m_buffer.remove(0, bytes.size());
    return bytes;
}

bool RawConnection::waitClosed(int timeoutMs)
{
    for (;;) {
        if (pollFor(m_fd, POLLIN, timeoutMs) <= 0)
            return false;
        char chunk[4096];
        const ssize_t n = recvSome(m_fd, chunk, sizeof chunk);
        if (n <= 0)
            return true;
        m_buffer.append(chunk, n);
    }
}

QByteArray buildPost(const QByteArray &path, const QByteArray &body, const HeaderList &headers,
                     bool close)
{
    QByteArray out = "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
    for (const auto &[n, v] : headers)
        out += n + ": " + v + "\r\n";
    // The caller's Content-Type when it gives one (a form, a provider's own), else JSON.
    if (headerValue(headers, "Content-Type").isNull())
        out += "Content-Type: application/json\r\n";
    out += "Content-Length: " + QByteArray::number(body.size()) + "\r\n";
    if (close)
        out += "Connection: close\r\n";
    out += "\r\n" + body;
    return out;
}

ClientResponse post(quint16 port, const QByteArray &path, const QByteArray &body,
                    const HeaderList &headers)
{
    RawConnection c(port);
    if (!c.isOpen()) {
        ClientResponse r;
        r.error = QStringLiteral("cannot connect");
        return r;
    }
    c.send(buildPost(path, body, headers));
    return c.readResponse();
}

} // namespace idem
