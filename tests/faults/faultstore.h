#pragma once

#include "support/faultproxy.h"
#include "support/servers.h"

#include <QString>

#include <array>
#include <memory>

namespace idem::test {

// The store one run of the fault suite shares between its two desks, owned by the test so it
// can be paused: a SQLite file, a Redis server, or a PostgreSQL cluster. Redis and PostgreSQL
// sit behind one FaultProxy per desk slot, so a fault can cut one desk off or both. The Redis
// Cluster is ./dev's (IDEM_TEST_REDIS_CLUSTER_URL), reached directly (CLUSTER SLOTS names the
// nodes' own addresses, so no proxy can stand between): its fault is one master paused.
class FaultStore
{
public:
    enum class Kind { Sqlite, Redis, Postgres, Cluster };

    // Starts the server in `dir`; null with `error` set when it did not start.
    static std::unique_ptr<FaultStore> start(Kind kind, const QString &dir, QString &error);
    ~FaultStore();

    Kind kind() const { return m_kind; }
    QString name() const;
    // The URL the desk in `slot` (0 or 1) uses: through that slot's proxy where there is one.
    QString deskUrl(int slot) const;
    // The URL that reaches the store directly, for reading it after the run.
    QString directUrl() const { return m_directUrl; }

    bool hasProxies() const { return m_proxies[0] != nullptr; }
    bool hasServer() const { return m_kind != Kind::Sqlite; } // a clock of its own
    FaultProxy &proxy(int slot) { return *m_proxies.at(size_t(slot)); }
    // SIGSTOP / SIGCONT of every process of the server (PostgreSQL: the postmaster and each
    // backend); a SQLite store has none.
    bool canPause() const { return m_kind != Kind::Sqlite; }
    void pause();
    void resume();

private:
    explicit FaultStore(Kind kind) : m_kind(kind) {}
    qint64 serverProcess() const; // Redis's, or PostgreSQL's postmaster
    void signalServer(int signal);

    Kind m_kind;
    QString m_dir;
    QString m_directUrl;
    quint16 m_serverPort = 0;
    qint64 m_paused = 0; // the cluster master pause() stopped: resume() continues that one
    std::unique_ptr<RedisServer> m_redis;
    std::unique_ptr<PgCluster> m_pg;
    std::array<std::unique_ptr<FaultProxy>, 2> m_proxies;
};

} // namespace idem::test
