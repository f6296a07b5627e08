#include "faults/faultstore.h"

#include "store/rediscluster.h"

#include <QDateTime>
#include <QDir>
#include <QFile>
#include <QProcess>
#include <QUrl>

#include <csignal>

namespace idem::test {

namespace {

// The parent of a process, from /proc/PID/stat ("pid (comm) state ppid ..."); 0 when unknown.
qint64 parentOf(qint64 pid)
{
    QFile stat(QStringLiteral("/proc/%1/stat").arg(pid));
    if (!stat.open(QIODevice::ReadOnly))
        return 0;
    const QByteArray line = stat.readAll();
    const QList<QByteArray> fields = line.mid(line.lastIndexOf(')') + 2).split(' ');
    return fields.value(1).toLongLong();
}

} // namespace

std::unique_ptr<FaultStore> FaultStore::start(Kind kind, const QString &dir, QString &error)
{
    std::unique_ptr<FaultStore> store(new FaultStore(kind));
    store->m_dir = dir;
    switch (kind) {
    case Kind::Sqlite:
        store->m_directUrl =
            QStringLiteral("sqlite:") + QDir(dir).filePath(QStringLiteral("faults.db"));
        return store;
    case Kind::Redis:
        store->m_redis = std::make_unique<RedisServer>(dir);
        if (!store->m_redis->start()) {
            error = QStringLiteral("redis-server did not start");
            return nullptr;
        }
        store->m_directUrl = store->m_redis->url();
        store->m_serverPort = store->m_redis->port();
        break;
    case Kind::Cluster: {
        const QString url = qEnvironmentVariable("IDEM_TEST_REDIS_CLUSTER_URL");
        if (url.isEmpty()) {
            error =
                QStringLiteral("IDEM_TEST_REDIS_CLUSTER_URL is not set: run through ./dev test");
            return nullptr;
        }
        // Keys of this run only; and every write waited for by a replica, so that a failover
        // (a master paused past the cluster's node timeout) loses nothing.
        store->m_directUrl =
            url + QStringLiteral("?prefix=faults%1:&wait_replicas=1&wait_timeout_ms=500")
                      .arg(QDateTime::currentMSecsSinceEpoch(), 0, 36);
        return store;
    }
    case Kind::Postgres:
        store->m_dir = QDir(dir).filePath(QStringLiteral("pg"));
        store->m_pg = std::make_unique<PgCluster>(store->m_dir);
        if (!store->m_pg->init() || !store->m_pg->start()) {
            error = store->m_pg->lastError();
            return nullptr;
        }
        store->m_directUrl = store->m_pg->url();
        store->m_serverPort = quint16(QUrl(store->m_directUrl).port());
        break;
    }
    for (auto &proxy : store->m_proxies)
        proxy = std::make_unique<FaultProxy>(store->m_serverPort);
    return store;
}

FaultStore::~FaultStore()
{
    if (canPause())
        resume(); // a run that failed half-way may leave it stopped; stopped, it cannot be shut
                  // down
}

QString FaultStore::name() const
{
    switch (m_kind) {
    case Kind::Sqlite:
        return QStringLiteral("sqlite");
    case Kind::Redis:
        return QStringLiteral("redis");
    case Kind::Postgres:
        return QStringLiteral("postgres");
    case Kind::Cluster:
        return QStringLiteral("cluster");
    }
    return {};
}

QString FaultStore::deskUrl(int slot) const
{
    if (!m_proxies[0])
        return m_directUrl;
    QUrl url(m_directUrl);
    url.setPort(m_proxies.at(size_t(slot))->port());
    return url.toString();
}

void FaultStore::pause()
{
    signalServer(SIGSTOP);
}

void FaultStore::resume()
{
    signalServer(SIGCONT);
}

qint64 FaultStore::serverProcess() const
{
    if (m_redis)
        return m_redis->pid();
    if (m_kind == Kind::Cluster) {
        // The master of slot 0 now (after a failover, another than before).
        auto url = StoreUrl::parse(m_directUrl);
        QList<redis::ClusterNode> seeds;
        for (const auto &[host, port] : url->clusterSeeds)
            seeds.append({host.toUtf8(), port});
        redis::ClusterLinks links(seeds, 1000, 1000, {});
        if (!links.refresh() || !links.map().master(0))
            return 0;
        QProcess cli;
        cli.start(QStringLiteral("redis-cli"),
                  {QStringLiteral("-p"), QString::number(links.map().master(0)->port),
                   QStringLiteral("INFO"), QStringLiteral("server")});
        cli.waitForFinished(5000);
        const QByteArray info = cli.readAllStandardOutput();
        const qsizetype at = info.indexOf("process_id:");
        return at < 0 ? 0 : info.mid(at + 11).split('\r').first().toLongLong();
    }
    QFile pidFile(QDir(m_dir).filePath(QStringLiteral("postmaster.pid")));
    return pidFile.open(QIODevice::ReadOnly) ? pidFile.readLine().trimmed().toLongLong() : 0;
}

void FaultStore::signalServer(int signal)
{
    if (m_kind == Kind::Cluster && signal == SIGCONT) {
        if (m_paused > 0)
            ::kill(pid_t(std::exchange(m_paused, 0)), SIGCONT);
        return;
    }
    const qint64 server = serverProcess();
    if (m_kind == Kind::Cluster)
        m_paused = server;
    if (server <= 0)
        return;
    ::kill(pid_t(server), signal); // first, so it starts no backend we would miss
    if (!m_pg)
        return;
    const QStringList entries =
        QDir(QStringLiteral("/proc")).entryList(QDir::Dirs | QDir::NoDotAndDotDot);
    for (const QString &entry :
         entries) // PostgreSQL's backends and helpers: the postmaster's children
        if (const qint64 pid = entry.toLongLong(); pid > 0 && parentOf(pid) == server)
            ::kill(pid_t(pid), signal);
}

} // namespace idem::test
