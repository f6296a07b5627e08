#include "faults/faultstore.h"

#include <QDir>
#include <QFile>
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
    QFile pidFile(QDir(m_dir).filePath(QStringLiteral("postmaster.pid")));
    return pidFile.open(QIODevice::ReadOnly) ? pidFile.readLine().trimmed().toLongLong() : 0;
}

void FaultStore::signalServer(int signal)
{
    const qint64 server = serverProcess();
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
