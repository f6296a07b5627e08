#include "http/connectionlimits.h"

#include <QFile>

#include <sys/socket.h>

#include <algorithm>

namespace idem {

QByteArray clientKey(const QHostAddress &peer)
{
    bool v4 = false;
    const quint32 ipv4 = peer.toIPv4Address(&v4);
    if (v4) {
        const char bytes[] = {char(ipv4 >> 24), char(ipv4 >> 16), char(ipv4 >> 8), char(ipv4)};
        return QByteArray(bytes, 4);
    }
    const Q_IPV6ADDR ipv6 = peer.toIPv6Address();
    return QByteArray(reinterpret_cast<const char *>(ipv6.c), 8); // the /64
}

int listenBacklog()
{
    QFile file(QStringLiteral("/proc/sys/net/core/somaxconn"));
    if (file.open(QIODevice::ReadOnly)) {
        bool ok = false;
        const int value = file.readAll().trimmed().toInt(&ok);
        if (ok && value > 0)
            return value;
    }
    return SOMAXCONN;
}

LimitRefusal ConnectionBudget::openConnection(const QByteArray &client)
{
    Usage &usage = m_clients[client];
    if (usage.connections >= m_limits.maxConnectionsPerClient) {
        forgetIfUnused(m_clients.find(client));
        return LimitRefusal::Client;
    }
    ++usage.connections;
    return LimitRefusal::None;
}

void ConnectionBudget::closeConnection(const QByteArray &client)
{
    auto it = m_clients.find(client);
    if (it == m_clients.end())
        return;
    it->connections = std::max(0, it->connections - 1);
    forgetIfUnused(it);
}

LimitRefusal ConnectionBudget::reserve(const QByteArray &client, qint64 bytes)
{
    if (bytes <= 0)
        return LimitRefusal::None;
    auto it = m_clients.find(client);
    const qint64 held = it == m_clients.end() ? 0 : it->bytes;
    // The client's share first: a client over its own share is told so (429), whether or not
    // the server as a whole is full.
    if (held + bytes > m_limits.maxBufferedBytesPerClient)
        return LimitRefusal::Client;
    if (m_bytes + bytes > m_limits.maxBufferedBytes)
        return LimitRefusal::Server;
    if (it == m_clients.end())
        it = m_clients.insert(client, Usage{});
    it->bytes += bytes;
    m_bytes += bytes;
    return LimitRefusal::None;
}

void ConnectionBudget::hold(const QByteArray &client, qint64 bytes)
{
    if (bytes <= 0)
        return;
    m_clients[client].bytes += bytes;
    m_bytes += bytes;
}

void ConnectionBudget::release(const QByteArray &client, qint64 bytes)
{
    auto it = m_clients.find(client);
    if (bytes <= 0 || it == m_clients.end())
        return;
    bytes = std::min(bytes, it->bytes);
    it->bytes -= bytes;
    m_bytes -= bytes;
    forgetIfUnused(it);
}

void ConnectionBudget::forgetIfUnused(QHash<QByteArray, Usage>::iterator it)
{
    if (it != m_clients.end() && it->connections == 0 && it->bytes == 0)
        m_clients.erase(it);
}

void UploadPace::start(qint64 nowMs)
{
    m_windowStartMs = nowMs;
    m_bytes = 0;
}

bool UploadPace::tooSlow(qint64 nowMs)
{
    const qint64 elapsedMs = nowMs - m_windowStartMs;
    if (!enabled() || elapsedMs < m_windowMs)
        return false;
    // Due for the time that actually passed: a late check asks no more of the client per second.
    const bool slow = m_bytes < m_minBytesPerSecond * elapsedMs / 1000;
    start(nowMs);
    return slow;
}

qint64 nextBodyCapacity(qint64 needed, qint64 capacity, qint64 step, qint64 limit)
{
    if (needed <= capacity)
        return capacity;
    return std::min(limit, std::max(needed, capacity + step));
}

} // namespace idem
