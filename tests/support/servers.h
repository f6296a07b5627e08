#pragma once

#include <QProcess>
#include <QString>

#include <memory>

// Real store servers a test owns (to stop and start them), on free loopback ports.
namespace idem::test {

quint16 freePort();

class RedisServer
{
public:
    explicit RedisServer(QString dir); // AOF with appendfsync always: acknowledged writes survive
    ~RedisServer();
    bool start(const QStringList &extraArgs = {}); // e.g. {"--replicaof", host, port}
    void stop(bool kill = false);
    QString url() const;
    quint16 port() const { return m_port; }
    qint64 pid() const { return m_process ? m_process->processId() : 0; }

private:
    QString m_dir;
    quint16 m_port;
    std::unique_ptr<QProcess> m_process;
};

// A PostgreSQL cluster of its own (initdb into a temp folder; run as the postgres user when
// the tests run as root, since PostgreSQL refuses root).
class PgCluster
{
public:
    explicit PgCluster(QString dir);
    ~PgCluster();
    bool init();
    bool start();
    bool stop();
    QString url() const;
    QString lastError() const { return m_error; }
    // One statement through psql; its output, unaligned, without headers (empty on an error).
    QString sql(const QString &statement);

private:
    bool run(const QString &tool, const QStringList &args, QString *output = nullptr);
    QString m_dir;
    QString m_bin;
    quint16 m_port;
    bool m_running = false;
    QString m_error;
};

} // namespace idem::test
