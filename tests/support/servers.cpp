#include "support/servers.h"

#include <QDir>
#include <QTcpServer>
#include <QTcpSocket>
#include <QThread>

#include <csignal>
#include <pwd.h>
#include <unistd.h>

namespace idem::test {

quint16 freePort()
{
    QTcpServer probe;
    probe.listen(QHostAddress::LocalHost, 0);
    return probe.serverPort();
}

namespace {
bool waitForPort(quint16 port, int timeoutMs)
{
    for (int waited = 0; waited < timeoutMs; waited += 50) {
        QTcpSocket s;
        s.connectToHost(QHostAddress::LocalHost, port);
        if (s.waitForConnected(200))
            return true;
        QThread::msleep(50);
    }
    return false;
}
} // namespace

RedisServer::RedisServer(QString dir) : m_dir(std::move(dir)), m_port(freePort()) {}

RedisServer::~RedisServer()
{
    stop(true);
}

bool RedisServer::start(const QStringList &extraArgs)
{
    m_process = std::make_unique<QProcess>();
    m_process->setProcessChannelMode(QProcess::MergedChannels);
    m_process->start(QStringLiteral("redis-server"),
                     QStringList{QStringLiteral("--port"), QString::number(m_port), QStringLiteral("--bind"),
                      QStringLiteral("127.0.0.1"), QStringLiteral("--dir"), m_dir,
                      QStringLiteral("--save"), QString(), QStringLiteral("--appendonly"),
                      QStringLiteral("yes"), QStringLiteral("--appendfsync"), QStringLiteral("always"),
                      QStringLiteral("--loglevel"), QStringLiteral("warning")} + extraArgs);
    return m_process->waitForStarted(5000) && waitForPort(m_port, 10000);
}

void RedisServer::stop(bool kill)
{
    if (!m_process || m_process->state() == QProcess::NotRunning)
        return;
    ::kill(pid_t(m_process->processId()), kill ? SIGKILL : SIGTERM);
    m_process->waitForFinished(10000);
}

QString RedisServer::url() const
{
    return QStringLiteral("redis://127.0.0.1:%1/0").arg(m_port);
}

PgCluster::PgCluster(QString dir) : m_dir(std::move(dir)), m_port(freePort())
{
    m_bin = qEnvironmentVariable("IDEM_TEST_PG_BIN");
    if (m_bin.isEmpty()) {
        const QStringList versions = QDir(QStringLiteral("/usr/lib/postgresql")).entryList(QDir::Dirs | QDir::NoDotAndDotDot, QDir::Name);
        if (!versions.isEmpty())
            m_bin = QStringLiteral("/usr/lib/postgresql/%1/bin").arg(versions.last());
    }
}

PgCluster::~PgCluster()
{
    if (m_running)
        stop();
}

bool PgCluster::run(const QString &tool, const QStringList &args, QString *output)
{
    QProcess p;
    p.setProcessChannelMode(QProcess::MergedChannels);
    const QString program = m_bin + QLatin1Char('/') + tool;
    if (::geteuid() == 0)
        p.start(QStringLiteral("runuser"), QStringList{QStringLiteral("-u"), QStringLiteral("postgres"), QStringLiteral("--"), program} + args);
    else
        p.start(program, args);
    if (!p.waitForFinished(120000) || p.exitCode() != 0) {
        m_error = QString::fromLocal8Bit(p.readAll());
        return false;
    }
    if (output)
        *output = QString::fromLocal8Bit(p.readAll()).trimmed();
    return true;
}

QString PgCluster::sql(const QString &statement)
{
    QString out;
    if (!run(QStringLiteral("psql"),
             {QStringLiteral("-h"), QStringLiteral("127.0.0.1"), QStringLiteral("-p"),
              QString::number(m_port), QStringLiteral("-U"), QStringLiteral("idem"),
              QStringLiteral("-d"), QStringLiteral("postgres"), QStringLiteral("-Atqc"), statement},
             &out))
        return {};
    return out;
}

bool PgCluster::init()
{
    QDir().mkpath(m_dir);
    if (::geteuid() == 0) {
        if (passwd *pg = ::getpwnam("postgres")) {
            [[maybe_unused]] int rc = ::chown(QFile::encodeName(m_dir).constData(), pg->pw_uid, pg->pw_gid);
            QFile::setPermissions(QFileInfo(m_dir).absolutePath(), QFile::permissions(QFileInfo(m_dir).absolutePath()) | QFileDevice::ExeOther | QFileDevice::ReadOther);
        }
    }
    return run(QStringLiteral("initdb"), {QStringLiteral("-D"), m_dir, QStringLiteral("-U"), QStringLiteral("idem"),
                                          QStringLiteral("--auth=trust"), QStringLiteral("-E"), QStringLiteral("UTF8")});
}

bool PgCluster::start()
{
    m_running = run(QStringLiteral("pg_ctl"),
                    {QStringLiteral("-D"), m_dir, QStringLiteral("-l"), m_dir + QStringLiteral("/server.log"), QStringLiteral("-w"),
                     QStringLiteral("-o"), QStringLiteral("-p %1 -k %2 -c listen_addresses=127.0.0.1").arg(m_port).arg(m_dir),
                     QStringLiteral("start")});
    return m_running;
}

bool PgCluster::stop()
{
    m_running = false;
    return run(QStringLiteral("pg_ctl"), {QStringLiteral("-D"), m_dir, QStringLiteral("-m"), QStringLiteral("fast"), QStringLiteral("-w"), QStringLiteral("stop")});
}

QString PgCluster::url() const
{
    return QStringLiteral("postgresql://idem@127.0.0.1:%1/postgres").arg(m_port);
}

} // namespace idem::test
