#pragma once

#include "store/idempotencystore.h"
#include "store/redisprotocol.h"
#include "store/storeurl.h"

#include <QHash>
#include <QPair>

#include <functional>

#include <vector>

#include <memory>

struct redisContext;
struct redisReply;

namespace idem {

namespace redis {
class ClusterLinks;
}

struct RedisOptions
{
    int connectTimeoutMs = 2000;
    int commandTimeoutMs = 3000;  // every call; a timeout is an error (503), never a retry
    qint64 logMaxLength = 100000; // the delivery log stream is capped (MAXLEN ~)
};

// Redis (hiredis 0.14). Each transition is one Lua script from resources/redis on the record and
// its bucket's indexes (layout v4: the top of common.lua; redis::Layout), loaded once per
// connection (SCRIPT LOAD) and run with EVALSHA; on NOSCRIPT it is loaded again — safe, since
// NOSCRIPT means it did not run. A broken connection during a write is InDoubt: it is never
// retried here. Records expire natively (PEXPIREAT); their index entries are written in the same
// script as the record, so listings, counts, export and purge find every live record whatever
// failed in between. NOT thread-safe (one per worker).
// On a Redis Cluster (redis-cluster://, or a redis:// node that answers CLUSTER INFO) every
// command goes to the master of its key's slot (store/rediscluster.h): a record's script to its
// bucket's slot, the log to its own; pipelines are split per master; SCAN runs on every master.
// A batch's scripts are then no longer one transaction (its records are in many buckets).
class RedisStore final : public IdempotencyStore
{
public:
    static Result<std::unique_ptr<RedisStore>> connect(const StoreUrl &url,
                                                       const RedisOptions &options = {});
    ~RedisStore() override;
    bool isCluster() const { return m_cluster != nullptr; }

    Result<ClaimResult> claim(const ClaimRequest &request) override;
    Result<FinishVerdict> finish(const FinishRequest &request) override;
    Result<QList<ClaimResult>> claimBatch(const QList<ClaimRequest> &requests) override;
    Result<QList<FinishVerdict>> finishBatch(const QList<FinishRequest> &requests) override;
    Result<std::optional<KeyRecord>> key(const QString &key) override;
    Result<QList<KeyRecord>> listKeys(const KeyQuery &query) override;
    // Type and content both read the records, newest first, a round trip for a few hundred:
    // neither has an index (docs/stores.md#search).
    Result<KeyPage> findKeys(const KeyQuery &query) override;
    Result<QStringList> keyNames(const KeyQuery &filter) override;
    bool deliveriesIndexedByKey() const override { return false; } // one stream, read newest first
    Result<StateCounts> countKeys(const QString &endpoint) override;
    Result<OperatorVerdict> applyOperator(const QString &key, OperatorAction action, bool force,
                                          const QString &detail) override;
    Result<qint64> purgeExpired() override;
    Result<ImportVerdict> importRecord(const KeyRecord &record, qint64 ttlMs,
                                       qint64 leaseMs) override;
    Result<QString> serverVersion() override;
    // To layout v4 from v3 (each record moved into its bucket with its index entries by
    // migrate4.lua), from v2 (first to v3 in place by v3/migrate3.lua) and from v1 (P k:<key>,
    // one token counter P tokens, P i:all, P i:e:*; first to v2 by v3/migrate.lua). One desk
    // migrates (it holds "P migrating"); the others wait until "P layout" says 4, which the
    // migration writes last (an empty store is simply marked).
    Result<qint64> migrateLayout(bool confirmed = false) override;
    Result<qint64> clockMs() override;
    Result<qint64> timeMs(const redisReply *time) const; // an answer to TIME, in ms
    Result<QStringList> durabilityWarnings() override;
    Result<void> appendDeliveries(const QList<DeliveryEvent> &events) override;
    Result<QList<DeliveryEvent>> deliveries(const DeliveryQuery &query) override;
    Result<void> ping() override;
    // A single Redis that closed the link while it sat idle (a restart, CLIENT KILL, its
    // timeout): the pool connects again rather than answer 503 (a cluster's links see to their
    // own, ClusterLinks).
    bool connectionDropped() override;
    // Ready when it answers and its layout is this build's ("P layout" 4): not an earlier one
    // (idemdesk migrate converts it) nor a newer one.
    Result<void> ready() override;

private:
    using Reply = std::unique_ptr<redisReply, void (*)(void *)>;
    RedisStore(redisContext *context, StoreUrl url, RedisOptions options);
    static Result<std::unique_ptr<RedisStore>> connectCluster(const StoreUrl &url,
                                                              const RedisOptions &options);
    Result<Reply> command(const QList<QByteArray> &args, bool writes);
    Result<std::vector<Reply>> clusterPipeline(const QList<QList<QByteArray>> &commands,
                                               bool writes);
    // One SCAN step on a node from `cursor`: the next cursor and the names found.
    Result<QPair<QByteArray, QList<QByteArray>>>
    scanStep(redisContext *node, const QByteArray &cursor, const QByteArray &match);
    // Many commands in one write; every answer, in order (an error answer is an answer).
    Result<std::vector<Reply>> pipeline(const QList<QList<QByteArray>> &commands, bool writes);
    Result<qint64> migrateV1();               // P k:<key> to layout v2 (v3/migrate.lua)
    Result<qint64> migrateV3(bool confirmed); // layouts v3 and v2 to v4 (migrate4.lua, v3/drop.lua)
    // One page of migrateV3's keys moved: how many, and those that changed while being moved.
    struct Moved
    {
        qint64 moved = 0;
        QStringList changed;
    };
    Result<Moved> moveV3(const QStringList &keys);
    // "P migrating" is held this long, renewed with each SCAN page of a migration (scanAll).
    static constexpr qint64 kMigrationLockMs = 60'000;
    // Renews "P migrating" while it still holds this desk's value (lock.lua); Conflict when
    // another desk took it over, after this one paused past its lifetime: it must stop writing.
    Result<void> renewMigrationLock();
    // Refused (Conflict) unless `confirmed` when a delivery was logged lately: a desk of the
    // previous version may still be writing records this one would not see. `what` names them.
    Result<void> refuseIfWritten(bool confirmed, const QString &what);
    // Every key matching `match` (a SCAN glob), a SCAN page at a time; on a cluster, every
    // master's. During a migration, the lock is renewed before each page is handed to `each`.
    Result<void> scanAll(const QByteArray &match,
                         const std::function<Result<void>(const QList<QByteArray> &)> &each);
    Result<QStringList> endpoints(); // the endpoints that have keys (every bucket's eps)
    // A batch's shared content (redis::sharedKey): written (or kept longer) by shared.lua; read.
    Result<void> writeShared(const QList<SharedContent> &shared);
    Result<std::optional<QByteArray>> readShared(const QByteArray &ref);
    Result<Reply> script(const char *name, const QList<QByteArray> &args, bool writes);
    Result<void> loadScripts();
    // Drops the state index entries behind the store's clock, of every bucket of `endpoints`.
    Result<void> sweepStateIndexes(const QStringList &endpoints);
    // Up to `limit` expired keys of each bucket of each endpoint made tombstones and unindexed.
    Result<qint64> purgeSlice(qint64 now, const QStringList &endpoints, qint64 limit);
    // What a listing or a count starts with: the store's clock and the endpoints asked for
    // (`endpoint`, or all of them).
    struct Scope
    {
        qint64 now;
        QStringList endpoints;
    };
    Result<Scope> scope(const QString &endpoint);
    // Many runs of one script, pipelined (NOSCRIPT answered by running it loaded); the answers,
    // in order, or an error (of kind onError) if any was one.
    Result<std::vector<Reply>> scriptsPipelined(const char *name,
                                                const QList<QList<QByteArray>> &argsList,
                                                ErrorCode onError = ErrorCode::Unavailable);
    // One script per request, all in one MULTI/EXEC: atomic together (on a cluster: pipelined,
    // each atomic alone). The answers, in order.
    struct ScriptAnswers
    {
        std::vector<Reply> held;
        std::vector<const redisReply *> at;
    };
    Result<ScriptAnswers> scriptsInTransaction(const char *name, const QList<QList<QByteArray>> &argsList);
    // With ?wait_replicas=N: WAIT for N replicas to have the writes so far; refused if fewer did.
    Result<void> waitForReplicas();
    Error failure(const QString &what, bool writes) const;

    redisContext *m_context; // single Redis; null on a cluster
    std::unique_ptr<redis::ClusterLinks> m_cluster;
    StoreUrl m_url;
    RedisOptions m_options;
    QByteArray m_prefix;
    redis::Layout m_layout; // one bucket on a single Redis, kClusterBuckets on a cluster
    QHash<QByteArray, QByteArray> m_sha; // script name → SHA1
    QByteArray m_migrationLock;          // this desk's value in "P migrating" while it migrates
};

} // namespace idem
