#include "support/faultproxy.h"

#include <QElapsedTimer>
#include <QTcpServer>
#include <QTcpSocket>
#include <QTimer>

#include <deque>
#include <memory>
#include <vector>

#include <sys/socket.h>

namespace idem::test {

namespace {

// One direction of a proxied connection: what arrived from `from` and has not yet left for `to`.
struct Pipe
{
    struct Chunk
    {
        qint64 arrivedMs;
        QByteArray bytes;
    };
    QTcpSocket *from = nullptr;
    QTcpSocket *to = nullptr;
    std::deque<Chunk> pending;
    bool fromClosed = false; // passed on to `to` once the pending bytes left
};

// Closes with a reset: SO_LINGER 0 makes close() send RST instead of FIN.
void resetSocket(QTcpSocket *socket)
{
    if (socket->socketDescriptor() >= 0) {
        const linger reset{1, 0};
        ::setsockopt(int(socket->socketDescriptor()), SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
    }
    socket->abort();
}

bool isClosed(const QTcpSocket *socket)
{
    return socket->state() == QAbstractSocket::UnconnectedState;
}

} // namespace

// Lives on the proxy's thread; every member runs there. Links are only destroyed by sweep(),
// queued, never inside one of their own sockets' signals.
class ProxyRelay final : public QObject
{
public:
    ProxyRelay(quint16 upstreamPort, std::atomic<int> &accepted, std::atomic<int> &reset)
        : m_server(this), m_tick(this), m_upstreamPort(upstreamPort), m_accepted(accepted),
          m_reset(reset)
    {
        m_clock.start();
        m_tick.setInterval(5); // the resolution of Delay
        connect(&m_tick, &QTimer::timeout, this, [this] { pumpAll(); });
        connect(&m_server, &QTcpServer::newConnection, this, [this] { acceptPending(); });
    }

    ~ProxyRelay() override
    {
        for (auto &link : m_links)
            close(*link, /*reset=*/true);
    }

    quint16 listen()
    {
        m_server.listen(QHostAddress::LocalHost, 0);
        return m_server.serverPort();
    }

    void setMode(FaultProxy::Mode mode, int delayMs)
    {
        m_mode = mode;
        m_delayMs = delayMs;
        if (mode == FaultProxy::Mode::Reset) {
            for (auto &link : m_links)
                close(*link, /*reset=*/true);
            m_links.clear();
        }
        pumpAll(); // the end of a blackhole lets go what it held
    }

private:
    struct Link
    {
        QTcpSocket *client = nullptr;
        QTcpSocket *upstream = nullptr;
        Pipe up;   // client → upstream
        Pipe down; // upstream → client
    };

    void acceptPending()
    {
        while (QTcpSocket *client = m_server.nextPendingConnection()) {
            ++m_accepted;
            if (m_mode == FaultProxy::Mode::Reset) {
                ++m_reset;
                resetSocket(client);
                client->deleteLater();
                continue;
            }
            auto link = std::make_unique<Link>();
            link->client = client;
            link->upstream = new QTcpSocket(this);
            link->up = {client, link->upstream, {}, false};
            link->down = {link->upstream, client, {}, false};
            watch(link->up);
            watch(link->down);
            connect(link->upstream, &QTcpSocket::connected, this,
                    [this, l = link.get()] { pump(l->up); });
            link->upstream->connectToHost(QHostAddress::LocalHost, m_upstreamPort);
            m_links.push_back(std::move(link));
        }
    }

    void watch(Pipe &pipe)
    {
        connect(pipe.from, &QTcpSocket::readyRead, this, [this, &pipe] {
            pipe.pending.push_back({m_clock.elapsed(), pipe.from->readAll()});
            pump(pipe);
        });
        // A peer's close, or a connection to the upstream that failed: the other side is closed
        // too, after what was sent before it.
        auto closed = [this, &pipe] {
            if (pipe.fromClosed || !isClosed(pipe.from))
                return;
            if (pipe.from->bytesAvailable())
                pipe.pending.push_back({m_clock.elapsed(), pipe.from->readAll()});
            pipe.fromClosed = true;
            pump(pipe);
            scheduleSweep();
        };
        connect(pipe.from, &QTcpSocket::disconnected, this, closed);
        connect(pipe.from, &QTcpSocket::errorOccurred, this, closed);
    }

    // Sends on what is due under the current mode; a close follows the bytes sent before it.
    void pump(Pipe &pipe)
    {
        if (m_mode == FaultProxy::Mode::Blackhole || m_mode == FaultProxy::Mode::Reset)
            return;
        const bool connected = pipe.to->state() == QAbstractSocket::ConnectedState;
        if (!connected && !pipe.fromClosed && !isClosed(pipe.to))
            return; // the upstream is still connecting
        const int delay = m_mode == FaultProxy::Mode::Delay ? m_delayMs : 0;
        const qint64 now = m_clock.elapsed();
        while (!pipe.pending.empty() && pipe.pending.front().arrivedMs + delay <= now) {
            if (connected)
                pipe.to->write(pipe.pending.front().bytes);
            pipe.pending.pop_front();
        }
        if (!pipe.pending.empty()) {
            if (!m_tick.isActive())
                m_tick.start();
            return;
        }
        if (pipe.fromClosed && !isClosed(pipe.to))
            pipe.to->disconnectFromHost(); // after what is still in its write buffer
    }

    void pumpAll()
    {
        bool waiting = false;
        for (auto &link : m_links) {
            pump(link->up);
            pump(link->down);
            waiting = waiting || !link->up.pending.empty() || !link->down.pending.empty();
        }
        if (!waiting || m_mode == FaultProxy::Mode::Blackhole)
            m_tick.stop();
        scheduleSweep();
    }

    void scheduleSweep()
    {
        if (m_sweepQueued)
            return;
        m_sweepQueued = true;
        QMetaObject::invokeMethod(
            this, [this] { sweep(); }, Qt::QueuedConnection);
    }

    // Drops the links both of whose sides are closed.
    void sweep()
    {
        m_sweepQueued = false;
        std::erase_if(m_links, [this](const std::unique_ptr<Link> &link) {
            if (!isClosed(link->client) || !isClosed(link->upstream))
                return false;
            close(*link, /*reset=*/false);
            return true;
        });
    }

    void close(Link &link, bool reset)
    {
        for (QTcpSocket *socket : {link.client, link.upstream}) {
            disconnect(socket, nullptr, this, nullptr);
            if (reset && !isClosed(socket)) {
                ++m_reset;
                resetSocket(socket);
            }
            socket->deleteLater();
        }
    }

    QTcpServer m_server;
    QTimer m_tick;
    QElapsedTimer m_clock;
    quint16 m_upstreamPort;
    std::atomic<int> &m_accepted;
    std::atomic<int> &m_reset;
    FaultProxy::Mode m_mode = FaultProxy::Mode::Pass;
    int m_delayMs = 0;
    bool m_sweepQueued = false;
    std::vector<std::unique_ptr<Link>> m_links;
};

FaultProxy::FaultProxy(quint16 upstreamPort)
{
    m_relay = new ProxyRelay(upstreamPort, m_accepted, m_reset);
    m_relay->moveToThread(&m_thread);
    m_thread.setObjectName(QStringLiteral("fault proxy"));
    m_thread.start();
    QMetaObject::invokeMethod(
        m_relay, [this] { m_port = m_relay->listen(); }, Qt::BlockingQueuedConnection);
}

FaultProxy::~FaultProxy()
{
    QMetaObject::invokeMethod(
        m_relay, [this] { delete m_relay; }, Qt::BlockingQueuedConnection);
    m_thread.quit();
    m_thread.wait();
}

void FaultProxy::setMode(Mode mode, int delayMs)
{
    QMetaObject::invokeMethod(
        m_relay, [this, mode, delayMs] { m_relay->setMode(mode, delayMs); },
        Qt::BlockingQueuedConnection);
}

const char *toString(FaultProxy::Mode mode)
{
    switch (mode) {
    case FaultProxy::Mode::Pass:
        return "pass";
    case FaultProxy::Mode::Delay:
        return "delay";
    case FaultProxy::Mode::Blackhole:
        return "blackhole";
    case FaultProxy::Mode::Reset:
        return "reset";
    }
    return "?";
}

} // namespace idem::test
