#include "receiver/receiver.h"

#include "http/epolldispatcher.h"

#include <QCoreApplication>
#include <QElapsedTimer>
#include <QEventLoop>
#include <QHostInfo>
#include <QTimer>

#include <sys/resource.h>

#include <algorithm>
#include <limits>

namespace idem {

int connectionsTheFileLimitAllows()
{
    rlimit limit{};
    if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY)
        return std::numeric_limits<int>::max();
    const qint64 files = qint64(limit.rlim_cur);
    const qint64 reserve = std::min<qint64>(128, files / 4); // stores, files, the log, a 503
    return int(std::clamp<qint64>((files - reserve) / 2, 1, std::numeric_limits<int>::max()));
}

HttpLimits limitsFor(const Config &config, HttpLimits base)
{
    QHash<QByteArray, qint64> perPath;
    for (const auto &e : config.endpoints)
        perPath.insert("/hooks/" + e.name.toUtf8(), e.settings.maxBodyBytes);
    const qint64 fallback = config.defaults.maxBodyBytes;
    base.defaultMaxBody = fallback;
    base.maxConnections = std::min(config.maxConnections, connectionsTheFileLimitAllows());
    base.maxBodyFor = [perPath, fallback](const QByteArray &path) {
        return perPath.value(path, fallback);
    };
    const ConnectionSettings &c = config.connections;
    if (c.maxConnectionsPerClient)
        base.maxConnectionsPerClient = int(*c.maxConnectionsPerClient);
    if (c.maxBufferedRequestBytes)
        base.maxBufferedBytes = *c.maxBufferedRequestBytes;
    if (c.minUploadBytesPerSecond)
        base.minUploadBytesPerSecond = *c.minUploadBytesPerSecond;
    if (c.idleTimeoutSeconds)
        base.idleTimeoutMs = int(*c.idleTimeoutSeconds * 1000);
    if (c.requestTimeoutSeconds)
        base.requestTimeoutMs = int(*c.requestTimeoutSeconds * 1000);
    // Every body an endpoint accepts fits: in the whole budget, and in one client's share,
    // which is otherwise a quarter of it.
    const qint64 largest = largestBody(config);
    base.maxBufferedBytes = std::max(base.maxBufferedBytes, largest);
    base.maxBufferedBytesPerClient = std::max(base.maxBufferedBytes / 4, largest);
    return base;
}

Receiver::Receiver(Config config, std::shared_ptr<StorePool> pool, HttpLimits limits,
                   QObject *parent)
    : QObject(parent), m_pool(std::move(pool))
{
    m_thread.setObjectName(u"receiver"_qs);
    m_thread.setEventDispatcher(new EpollDispatcher); // idle connections cost nothing per wakeup
    const QString instance = QHostInfo::localHostName() + u"/"_qs
                             + QString::number(QCoreApplication::applicationPid());
    limits = limitsFor(config, std::move(limits));
    if (limits.maxConnections < config.maxConnections)
        qWarning("max_connections %d lowered to %d: the open-file limit (ulimit -n) allows no more",
                 config.maxConnections, limits.maxConnections);
    m_engine = new IdempotencyEngine(std::move(config), m_pool, instance);
    IdempotencyEngine *engine = m_engine;
    m_server = new HttpServer(std::move(limits), [engine](HttpRequest request, Responder responder) {
        engine->handle(std::move(request), std::move(responder));
    });
    m_server->setRejectObserver([engine](const HttpRequest &partial, int status, const QString &detail) {
        engine->recordRejection(partial, status, detail);
    });
    m_engine->moveToThread(&m_thread);
    m_server->moveToThread(&m_thread);
    m_thread.start();
}

Receiver::~Receiver()
{
    QMetaObject::invokeMethod(
        m_server,
        [this] {
            m_engine->drainLog();
            delete m_server;
            delete m_engine;
        },
        Qt::BlockingQueuedConnection);
    m_thread.quit();
    m_thread.wait();
}

int Receiver::connectionCount() const
{
    return m_server->connectionCount();
}

qint64 Receiver::bufferedBytes() const
{
    return m_server->bufferedBytes();
}

Result<ListenAddress> Receiver::start(const ListenAddress &address)
{
    QString error;
    ListenAddress bound = address;
    QMetaObject::invokeMethod(
        m_server,
        [&] {
            if (m_server->listen(address.host, address.port))
                bound.port = m_server->port();
            else
                error = m_server->errorString();
        },
        Qt::BlockingQueuedConnection);
    if (!error.isEmpty())
        return makeError(ErrorCode::Unavailable,
                         u"cannot listen on %1: %2"_qs.arg(address.toString(), error));
    m_address = bound;
    return bound;
}

qint64 Receiver::drain(qint64 graceMs)
{
    QMetaObject::invokeMethod(m_server, [this] { m_server->stopAccepting(); },
                              Qt::BlockingQueuedConnection);
    QElapsedTimer waited;
    waited.start();
    QEventLoop loop;
    QTimer poll;
    connect(&poll, &QTimer::timeout, &loop, [&] {
        if (m_engine->inFlight() == 0 || waited.elapsed() >= graceMs)
            loop.quit();
    });
    poll.start(10);
    if (m_engine->inFlight() > 0)
        loop.exec();
    return m_engine->inFlight();
}

qint64 Receiver::drainGraceMs(const Config &config)
{
    qint64 graceMs = 5000;
    for (const auto &e : config.endpoints)
        graceMs = std::max(graceMs, e.settings.leaseSeconds * 1000 + 2000);
    return graceMs;
}

} // namespace idem
