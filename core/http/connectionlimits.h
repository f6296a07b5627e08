#pragma once

#include <QByteArray>
#include <QHash>
#include <QHostAddress>

// What a listener's connections may hold of the process, apart from the event loop that serves
// them: plain counts and arithmetic, no sockets, no clock of their own (times are passed in), so
// they carry over to another loop. Not thread-safe: each belongs to one server, on its thread.
namespace idem {

// The client a connection counts against: its IPv4 address (an IPv4-mapped IPv6 one too), or the
// /64 an IPv6 address is in, since one host is commonly given a whole /64.
QByteArray clientKey(const QHostAddress &peer);

// The listen backlog to ask for: the system's maximum (/proc/sys/net/core/somaxconn, else
// SOMAXCONN). Past the backlog the kernel drops a connecting client's SYN, and the client sends
// it again only a second later: a burst of connections larger than the backlog stalls senders.
int listenBacklog();

// Which limit refused: the whole server's (503: it is full for everyone) or the client's own
// share of it (429: this client holds too much).
enum class LimitRefusal { None, Server, Client };

// The bytes a server's connections buffer (request bodies, request bytes read ahead, answers not
// yet taken), together and per client, and how many connections each client keeps open. The
// server asks before it opens a connection or buffers more of a request body, and gives back what
// it let go; nothing is taken when it is refused.
class ConnectionBudget final
{
public:
    struct Limits
    {
        qint64 maxBufferedBytes = 64 * 1024 * 1024;
        // One client's share of maxBufferedBytes, so that one client cannot take it all.
        qint64 maxBufferedBytesPerClient = 16 * 1024 * 1024;
        int maxConnectionsPerClient = 256;
    };
    explicit ConnectionBudget(Limits limits) : m_limits(limits) {}

    // One more connection of `client`: Client when it has maxConnectionsPerClient already.
    LimitRefusal openConnection(const QByteArray &client);
    void closeConnection(const QByteArray &client);
    // `bytes` more buffered for one of `client`'s requests.
    LimitRefusal reserve(const QByteArray &client, qint64 bytes);
    // `bytes` the server holds for `client` already (request bytes read ahead, answers written but
    // not yet taken), counted whatever the limits: past them, reserve() refuses the next bodies
    // until they are given back. What each connection may hold so is bounded by the server.
    void hold(const QByteArray &client, qint64 bytes);
    void release(const QByteArray &client, qint64 bytes);

    qint64 bufferedBytes() const { return m_bytes; }
    qint64 bufferedBytes(const QByteArray &client) const { return m_clients.value(client).bytes; }
    int connections(const QByteArray &client) const { return m_clients.value(client).connections; }
    int clients() const { return int(m_clients.size()); }
    const Limits &limits() const { return m_limits; }

private:
    struct Usage
    {
        int connections = 0;
        qint64 bytes = 0;
    };
    void forgetIfUnused(QHash<QByteArray, Usage>::iterator it);

    Limits m_limits;
    qint64 m_bytes = 0;
    QHash<QByteArray, Usage> m_clients; // only clients with a connection or bytes
};

// The slowest a request may arrive: from its first byte, each window of `windowMs` must bring at
// least minBytesPerSecond × the window's length, or the request is too slow (408). A request that
// is whole before a window ends is never checked. A minimum of 0 turns it off.
class UploadPace final
{
public:
    UploadPace(qint64 minBytesPerSecond, qint64 windowMs)
        : m_minBytesPerSecond(minBytesPerSecond), m_windowMs(windowMs)
    {}

    void start(qint64 nowMs);
    void received(qint64 bytes) { m_bytes += bytes; }
    // When the current window ends.
    qint64 windowEndMs() const { return m_windowStartMs + m_windowMs; }
    // Once its window has ended: whether it brought less than its due; the next window starts
    // now. Before: false.
    bool tooSlow(qint64 nowMs);
    bool enabled() const { return m_minBytesPerSecond > 0 && m_windowMs > 0; }

private:
    qint64 m_minBytesPerSecond;
    qint64 m_windowMs;
    qint64 m_windowStartMs = 0;
    qint64 m_bytes = 0;
};

// The capacity to give a body of `needed` bytes that has `capacity` now: grown in steps of
// `step`, never past `limit` (its Content-Length, or the endpoint's maximum), never doubled:
// a body buffer holds at most `step` more than it needs.
qint64 nextBodyCapacity(qint64 needed, qint64 capacity, qint64 step, qint64 limit);

} // namespace idem
