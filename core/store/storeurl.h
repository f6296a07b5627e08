#pragma once

#include "util/result.h"

#include <QList>
#include <QPair>
#include <QString>

namespace idem {

// A parsed store URL (docs/stores.md#store-urls): sqlite:PATH, redis://[user:pass@]host:port[/db],
// redis-cluster://[user:pass@]host:port[,host:port…][?options] (seed nodes of a Redis Cluster),
// postgresql://user[:pass]@host:port/dbname[?sslmode=…&sslrootcert=…&sslcert=…&sslkey=…].
struct StoreUrl
{
    enum class Kind { Sqlite, Redis, Postgres };
    Kind kind = Kind::Sqlite;
    QString original;
    QString path; // sqlite
    QString host;
    int port = 0;
    QString user;
    QString password;
    QString database; // postgres dbname; redis db number as text
    QString prefix;   // redis key prefix (?prefix=...), default "idem:"
    bool synchronousFull = false; // sqlite:PATH?synchronous=full
    int waitReplicas = 0;         // redis ?wait_replicas=N: WAIT after each claim and finish
    int waitTimeoutMs = 100;      // redis ?wait_timeout_ms=M
    // redis-cluster://, or a redis:// that turned out to point at a cluster node: the cluster's
    // nodes to ask for its slot map first (host, port is the first of them).
    bool cluster = false;
    QList<QPair<QString, int>> clusterSeeds;
    // postgres: libpq's TLS settings from the query (sslmode, sslrootcert, sslcert, sslkey),
    // passed on as they are; libpq's defaults apply to the ones not given.
    QList<QPair<QString, QString>> postgresTls;

    // Errors quote the URL without its user information (util/format.h displayUrl).
    static Result<StoreUrl> parse(const QString &text);
    static QString defaultSqlitePath();
    // The URL with its password masked, for logs, the status bar and `stats`.
    QString display() const;
};

} // namespace idem
