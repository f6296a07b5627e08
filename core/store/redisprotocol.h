#pragma once

#include "store/idempotencystore.h"

#include <QByteArray>
#include <QHash>
#include <QList>

#include <vector>

struct redisReply;
struct redisContext;
struct redisReader;

namespace idem::redis {

// The Lua scripts of resources/redis, each with its common.lua prepended (v3/common.lua for the
// migrations from older layouts, named "v3/…"), and their SHA1 (what SCRIPT LOAD answers and
// EVALSHA takes).
struct Script
{
    QByteArray source;
    QByteArray sha;
};
// By name: claim, finish, operator, import, tombstone, shared, migrate4, v3/migrate, v3/migrate3,
// v3/drop.
Result<QHash<QByteArray, Script>> scripts();

// The key layout (layout v4, described at the top of resources/redis/common.lua): keys live in
// buckets, each with a hash tag of its own, so that a record and its index entries share a
// cluster slot and every transition writes both in one script. A single Redis has one bucket, a
// cluster kClusterBuckets: bucket i's tag is the first "b<i>-<n>" (n = 0, 1, …) whose slot lies
// in the i-th of as many equal ranges of the 16384 slots, so that a cluster whose masters own
// ranges of slots gets an equal share of the buckets. A key's bucket: CRC16 of the key, modulo
// their number. Immutable; copies are cheap to read from any thread.
class Layout
{
public:
    static constexpr int kClusterBuckets = 64;
    Layout(QByteArray prefix, int buckets);

    const QByteArray &prefix() const { return m_prefix; }
    int buckets() const { return int(m_tags.size()); }
    int bucketOf(const QString &key) const;
    QByteArray record(const QString &key) const;                // P{tag}:r:<key>
    QByteArray keys(int bucket, const QString &endpoint) const; // P{tag}:k:<ep>
    QByteArray stateIndex(int bucket, const QString &endpoint,
                          KeyState state) const; // P{tag}:s:<ep>:<state>
    QByteArray endpoints(int bucket) const;      // P{tag}:eps
    // What every transition script takes after the record: the bucket's k, then its state
    // indexes of processing, failed and reset, for `endpoint`.
    QList<QByteArray> indexes(int bucket, const QString &endpoint) const;
    QByteArray layoutKey() const { return m_prefix + "layout"; } // "4"
    // How many buckets the desk that laid the store out used: a cluster's keys copied to a
    // single Redis (or back) are in buckets no desk there reads.
    QByteArray bucketsKey() const { return m_prefix + "buckets"; }
    QByteArray migratingKey() const { return m_prefix + "migrating"; }
    QByteArray logKey() const { return m_prefix + "log"; }

private:
    QByteArray m_prefix;
    QList<QByteArray> m_tags; // P{b<i>-<n>}, by bucket
};
constexpr int kLayoutVersion = 4;
QString endpointOf(const QString &key); // "<endpoint>:<id>"
// P shared:<sha256>: a batch's shared content (resources/redis/shared.lua: its request's headers,
// its result), with an expiry of its own past every record naming it; in no bucket: it is
// written before the records that name it, never with them.
QByteArray sharedKey(const QByteArray &prefix, const QByteArray &ref);
// What follows EVALSHA <sha> for shared.lua: the content written, or kept longer.
QList<QByteArray> sharedArgs(const Layout &layout, const SharedContent &shared);

// Layout v3's record (P{key}:r) and v2's token counter (P{key}:t): read by the migrations only.
QByteArray v3RecordKey(const QByteArray &prefix, const QString &key);
QByteArray tokenKey(const QByteArray &prefix, const QString &key);
// The key a layout v3 record name holds (P{<key>}:r), empty when the name is no v3 record (a
// record of the current layout can match the same SCAN pattern).
QString keyOfV3Record(const QByteArray &prefix, const QByteArray &name);

// What follows EVALSHA <sha> for claim.lua, finish.lua and operator.lua (numkeys, KEYS, ARGV),
// and what their answers mean. Shared by the blocking RedisStore and the receiver thread's
// RedisLane, so that both speak the same protocol.
// `sharedHeaders`: the record names the request's shared headers (StoredRequest::headersRef)
// instead of holding them, shared.lua having written them first.
QList<QByteArray> claimArgs(const Layout &layout, const ClaimRequest &request,
                            bool sharedHeaders = false);
Result<ClaimResult> claimResult(const redisReply *reply, const ClaimRequest &request);
// `sharedResult`: the record names the shared result (StoredResult::ref), shared.lua having
// written it first.
QList<QByteArray> finishArgs(const Layout &layout, const FinishRequest &request,
                             bool sharedResult = false);
Result<FinishVerdict> finishVerdict(const redisReply *reply);
QList<QByteArray> operatorArgs(const Layout &layout, const QString &key, OperatorAction action,
                               bool force, const QString &detail);
Result<OperatorVerdict> operatorVerdict(const redisReply *reply);
// import.lua (`keys import`): a record from another store, its expiry and lease from now on.
QList<QByteArray> importArgs(const Layout &layout, const KeyRecord &record, qint64 ttlMs,
                             qint64 leaseMs);
Result<ImportVerdict> importVerdict(const redisReply *reply);

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

// The most elements one array in a reply may announce: far above any reply the desk asks for
// (its SCAN, range and stream reads ask for 1000 at a time). hiredis allocates an array's element
// pointers from the count it reads, before any element arrives: a hostile or broken server (or
// a man in the middle) announcing `*617000000` would have the desk allocate 4.9 GB and abort.
constexpr int kMaxReplyElements = 1 << 20; // 8 MiB of pointers
// Makes `reader` (a context's, before its first command) take an array announcing more than
// kMaxReplyElements as a protocol error: the link is dropped (hiredis's error text for it is
// "Out of memory") and the command fails as on any lost link, nothing allocated for it.
void guardReader(redisReader *reader);

QByteArray text(const redisReply *reply);
// Something to read on a link with no command outstanding — the server closed it (a restart,
// CLIENT KILL, its timeout) or wrote an error before closing: it cannot serve the next command.
bool linkClosed(const redisContext *c);
// One entry of the delivery log stream, as XRANGE answers it ([id, [field, value, …]]), and its
// id; nullopt when it is not one.
std::optional<DeliveryEvent> deliveryFrom(const redisReply *entry, QByteArray *id = nullptr);
// A hash's fields and values, as HGETALL answers them (an array of pairs); empty if it is not one.
QHash<QByteArray, QByteArray> fieldsFrom(const redisReply *array);
// The body of a stored request (field q: its head line, headers, then the body).
QByteArrayView requestBody(const QByteArray &q);
// A record from its hash's fields (m h q s e t, by HGETALL or HMGET); `key` is the desk's key.
KeyRecord recordFrom(const QString &key, const QHash<QByteArray, QByteArray> &fields);
// The meta line (field m) into its columns (state token attempts created updated lease_until
// expires_at res_status provider endpoint fingerprint); false, and nothing added, if it is not one.
bool metaFrom(const QByteArray &m, QHash<QByteArray, QByteArray> &into);
// A record's fields (m h q s e t) as the columns of layout v2 (req_head req_body res_status
// res_headers res_body error history and the meta's) and its type; empty if it has no meta.
QHash<QByteArray, QByteArray> columnsFrom(const QHash<QByteArray, QByteArray> &record);
} // namespace idem::redis
