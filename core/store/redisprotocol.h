#pragma once

#include "store/idempotencystore.h"

#include <QByteArray>
#include <QHash>
#include <QList>

#include <map>
#include <vector>

struct redisReply;
struct redisContext;

namespace idem::redis {

// The Lua scripts of resources/redis, each with common.lua prepended, and their SHA1 (what
// SCRIPT LOAD answers and EVALSHA takes).
struct Script
{
    QByteArray source;
    QByteArray sha;
};
Result<QHash<QByteArray, Script>>
scripts(); // by name: claim, finish, operator, import, migrate, migrate3, tombstone, unindex

// The key layout (described at the top of resources/redis/common.lua): a record's own keys
// carry its hash tag, the indexes are the desk's.
QByteArray recordKey(const QByteArray &prefix, const QString &key); // P{key}:r
QByteArray tokenKey(const QByteArray &prefix,
                    const QString &key); // P{key}:t (layout v2; migrated away)
QByteArray endpointIndex(const QByteArray &prefix, const QString &endpoint); // P i:k:<ep>
// P i:es:<ep>:<state>, for processing, failed and reset (completed has none)
QByteArray endpointStateIndex(const QByteArray &prefix, const QString &endpoint, KeyState state);
QByteArray endpointsSet(const QByteArray &prefix); // P i:eps
QString endpointOf(const QString &key);           // "<endpoint>:<id>"

// What follows EVALSHA <sha> for claim.lua, finish.lua and operator.lua (numkeys, KEYS, ARGV),
// and what their answers mean. Shared by the blocking RedisStore and the receiver thread's
// RedisLane, so that both speak the same protocol.
QList<QByteArray> claimArgs(const QByteArray &prefix, const ClaimRequest &request);
Result<ClaimResult> claimResult(const redisReply *reply, const ClaimRequest &request);
QList<QByteArray> finishArgs(const QByteArray &prefix, const FinishRequest &request);
QList<QByteArray> operatorArgs(const QByteArray &prefix, const QString &key, OperatorAction action,
                               bool force, const QString &detail);

// A transition the indexes must follow: the key now in `to` (none: deleted), no longer in
// `from` (a bit per KeyState), with `updatedMs` as its score and, when known, its new expiry.
struct IndexMove
{
    QString key;
    QString endpoint;
    std::optional<KeyState> to;
    unsigned from = 0;
    qint64 updatedMs = 0;
    qint64 expiresAtMs = 0; // 0: unchanged
};
constexpr unsigned kAllStates = 0xf;
constexpr unsigned bit(KeyState s)
{
    return 1u << unsigned(s);
}

// What a claim's answer means for the indexes (nothing for a replay or a mismatch).
std::optional<IndexMove> indexMoveOf(const ClaimRequest &request, const ClaimResult &result);
// A finish's verdict; on accept, `move` (if given) gets the index move.
Result<FinishVerdict> finishVerdict(const redisReply *reply, const FinishRequest &request,
                                    IndexMove *move = nullptr);
Result<OperatorVerdict> operatorVerdict(const redisReply *reply, const QString &key,
                                        IndexMove *move = nullptr);
// import.lua (`keys import`): a record from another store, its expiry and lease from now on.
QList<QByteArray> importArgs(const QByteArray &prefix, const KeyRecord &record, qint64 ttlMs,
                             qint64 leaseMs);
Result<ImportVerdict> importVerdict(const redisReply *reply, const KeyRecord &record,
                                    IndexMove *move = nullptr);

// The index writes of many transitions, coalesced per key (the last move wins, the states it
// left add up) and grouped into one ZADD / ZREM per index: what the desk sends after the
// scripts, once per event-loop turn. Order-free within a batch, so it can be pipelined.
class IndexBatch
{
public:
    void add(const IndexMove &move);
    bool isEmpty() const { return m_moves.empty(); }
    qsizetype size() const { return qsizetype(m_moves.size()); }
    QList<QList<QByteArray>> commands(const QByteArray &prefix) const;
    void clear() { m_moves.clear(); }

private:
    std::map<QString, IndexMove> m_moves;
};

// A command's arguments as hiredis takes them: pointers into `args`, which it holds (a shared
// copy), so that a list built in the call, `Argv a({"SCAN", cursor, ...})`, outlives the command.
// (Holding pointers alone, that list was freed before redisCommandArgv read it: a use after free
// on every purge's SCAN, found by ASan.)
struct Argv
{
    explicit Argv(const QList<QByteArray> &args);
    int count() const { return int(argv.size()); }
    QList<QByteArray> held;
    std::vector<const char *> argv;
    std::vector<size_t> lengths;
};

QByteArray text(const redisReply *reply);
// Something to read on a link with no command outstanding — the server closed it (a restart,
// CLIENT KILL, its timeout) or wrote an error before closing: it cannot serve the next command.
bool linkClosed(const redisContext *c);
// A record from its hash's fields (m h q s e, by HGETALL or HMGET); `key` is the desk's key.
KeyRecord recordFrom(const QString &key, const QHash<QByteArray, QByteArray> &fields);
// The meta line (field m) into its columns (state token attempts created updated lease_until
// expires_at res_status provider endpoint fingerprint); false, and nothing added, if it is not one.
bool metaFrom(const QByteArray &m, QHash<QByteArray, QByteArray> &into);
// A record's fields (m h q s e) as the columns of layout v2 (req_head req_body res_status
// res_headers res_body error history and the meta's); empty if it has no meta.
QHash<QByteArray, QByteArray> columnsFrom(const QHash<QByteArray, QByteArray> &record);
} // namespace idem::redis
