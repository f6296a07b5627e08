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

// Redis (hiredis 0.14). Each transition is one Lua script from resources/redis on the record's
// own keys (layout: the top of common.lua), loaded once per connection (SCRIPT LOAD) and run
// with EVALSHA; on NOSCRIPT it is loaded again — safe, since NOSCRIPT means it did not run. A
// broken connection during a write is InDoubt: it is never retried here. Records expire
// natively (PEXPIREAT). The sorted-set indexes that serve the dashboard without KEYS are a
// derived view written after the scripts (redis::IndexBatch); listing re-reads the records and
// repairs what it finds stale, purge drops the entries of expired records and re-indexes a
// slice of the records each time. NOT thread-safe (one per worker).
// On a Redis Cluster (redis-cluster://, or a redis:// node that answers CLUSTER INFO) every
// command goes to the master of its key's slot (store/rediscluster.h): a record's script to its
// slot, each index and the log to theirs; pipelines are split per master; SCAN runs on every
// master. A batch's scripts are then no longer one transaction (its records are in many slots).
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
    Result<QStringList> keyNames(const KeyQuery &filter) override;
    bool deliveriesIndexedByKey() const override { return false; } // one stream, read newest first
    Result<StateCounts> countKeys(const QString &endpoint) override;
    Result<OperatorVerdict> applyOperator(const QString &key, OperatorAction action, bool force,
                                          const QString &detail) override;
    Result<qint64> purgeExpired() override;
    Result<ImportVerdict> importRecord(const KeyRecord &record, qint64 ttlMs,
                                       qint64 leaseMs) override;
    Result<QString> serverVersion() override;
    // To layout v3 from v2 (each record by migrate3.lua, its indexes rebuilt) and from v1 (P
    // k:<key>, one token counter P tokens, P i:all, P i:e:*; first to v2 by migrate.lua). v1 is
    // recognised by P tokens or P i:all, v2 by records without the field m; "P layout" 3 says it is
    // done.
    Result<qint64> migrateLayout(bool confirmed = false) override;
    Result<qint64> migrateV1();               // P k:<key> to layout v2 (migrate.lua)
    Result<qint64> migrateV2(bool confirmed); // layout v2 to v3 (migrate3.lua), its indexes too
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
    // Ready when it answers and holds no records of layout v1 (idemdesk migrate converts them)
    // nor of layout v2, nor of a layout newer than this build's ("P layout" above 3).
    Result<void> ready() override;

private:
    using Reply = std::unique_ptr<redisReply, void (*)(void *)>;
    RedisStore(redisContext *context, StoreUrl url, RedisOptions options);
    static Result<std::unique_ptr<RedisStore>> connectCluster(const StoreUrl &url,
                                                              const RedisOptions &options);
    Result<Reply> command(const QList<QByteArray> &args, bool writes);
    Result<std::vector<Reply>> clusterPipeline(const QList<QList<QByteArray>> &commands, bool writes);
    // The nodes SCAN walks, by address: the single Redis (""), or every master of the cluster.
    Result<QList<QPair<QByteArray, redisContext *>>> scanNodes();
    // One SCAN step on a node from `cursor`: the next cursor and the names found.
    Result<QPair<QByteArray, QList<QByteArray>>>
    scanStep(redisContext *node, const QByteArray &cursor, const QByteArray &match);
    // Many commands in one write; every answer, in order (an error answer is an answer).
    Result<std::vector<Reply>> pipeline(const QList<QList<QByteArray>> &commands, bool writes);
    // The index writes of transitions that happened: failures are left to the repairs.
    void writeIndexes(const redis::IndexBatch &batch);
    Result<qint64> repairSlice();
    // Every key matching `match` (a SCAN glob), a SCAN page at a time; on a cluster, every
    // master's.
    Result<void> scanAll(const QByteArray &match,
                         const std::function<Result<void>(const QList<QByteArray> &)> &each);
    Result<QStringList> endpoints(); // the endpoints that have keys (P i:eps)
    Result<Reply> script(const char *name, const QList<QByteArray> &args, bool writes);
    Result<void> loadScripts();
    // Up to `limit` expired entries of each endpoint's i:k made tombstones and unindexed.
    Result<qint64> purgeSlice(qint64 now, const QStringList &endpoints, qint64 limit);
    // What a listing or a count starts with: the store's clock, the endpoints asked for
    // (`endpoint`, or all of them) and a purge slice of `purgeLimit` on each (none if 0).
    struct Scope
    {
        qint64 now;
        QStringList endpoints;
    };
    Result<Scope> scope(const QString &endpoint, qint64 purgeLimit);
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
    QHash<QByteArray, QByteArray> m_repairCursors; // where each node's next repair slice SCANs from
    StoreUrl m_url;
    RedisOptions m_options;
    QByteArray m_prefix;
    QHash<QByteArray, QByteArray> m_sha; // script name → SHA1
};

} // namespace idem
