#pragma once

#include "config/config.h"
#include "engine/engine.h"
#include "http/httpserver.h"

#include <QAbstractEventDispatcher>
#include <QObject>
#include <QThread>

#include <memory>

namespace idem {

// The embedded receiver: an HttpServer and an IdempotencyEngine on a thread of their own, so
// neither the GUI thread nor the caller ever waits on a store or the network.
class Receiver final : public QObject
{
    Q_OBJECT
public:
    Receiver(Config config, std::shared_ptr<StorePool> pool, HttpLimits limits = {},
             QObject *parent = nullptr);
    ~Receiver() override; // stops the thread; in-flight answers are dropped: drain() first

    // Starts listening; returns the bound address (port 0 picks a free one).
    Result<ListenAddress> start(const ListenAddress &address);
    // A planned stop: no more deliveries (HttpServer::stopAccepting: keep-alive connections
    // included), then the caller's thread runs its events until those in flight have finished
    // or graceMs has passed. Returns how many are still in flight (0: all finished).
    qint64 drain(qint64 graceMs);
    // drain()'s grace for a config: the longest lease plus 2 s (processing, then its finish
    // retried within the lease), at least 5 s.
    static qint64 drainGraceMs(const Config &config);
    // The engine lives on the receiver thread: connect to its signals with a context object.
    IdempotencyEngine *engine() const { return m_engine; }
    // The receiver thread's event loop: its awake() signal, emitted on that thread, marks a turn
    // (serve wakes its log writer once a turn, not once a delivery).
    QAbstractEventDispatcher *loop() const { return m_thread.eventDispatcher(); }
    const std::shared_ptr<StorePool> &pool() const { return m_pool; }
    ListenAddress address() const { return m_address; }
    // Open connections, from any thread (tests wait on it).
    int connectionCount() const;
    // Request bytes its connections buffer now (HttpLimits::maxBufferedBytes), from any thread.
    qint64 bufferedBytes() const;

private:
    std::shared_ptr<StorePool> m_pool;
    QThread m_thread;
    IdempotencyEngine *m_engine = nullptr;
    HttpServer *m_server = nullptr;
    ListenAddress m_address;
};

// Body limit per path, from the endpoints' max_body_bytes; max_connections, no more than the
// open-file limit allows (connectionsTheFileLimitAllows); the connection settings the config
// sets (the others stay `base`'s). The request buffer budget holds the largest body at least,
// and a client's share of it is a quarter, or that body if larger.
HttpLimits limitsFor(const Config &config, HttpLimits base = {});

// Each connection may hold two descriptors (its own and, while it forwards, the downstream's).
// Past the process's open-file limit accept() fails with EMFILE, which QTcpServer takes for a
// passing error and retries at once — the listening socket stays readable: a busy loop, and no
// answer to anyone. So no more connections than the limit allows, less a reserve for stores,
// files and the log; the rest get 503 like any connection past max_connections.
int connectionsTheFileLimitAllows();

} // namespace idem
