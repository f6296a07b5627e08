#pragma once

#include "store/storeurl.h"
#include "util/result.h"

#include <QByteArray>
#include <QByteArrayView>
#include <QElapsedTimer>
#include <QHash>
#include <QList>
#include <QSet>
#include <QString>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

struct redisContext;
struct redisReply;

namespace idem::redis {

// Redis Cluster routing over hiredis 0.14 (which has no cluster client): key → slot, slot →
// master, and the redirects a node answers. Ours, per the cluster spec
// (https://redis.io/docs/reference/cluster-spec/).

constexpr int kSlots = 16384;
constexpr int kMaxRedirects = 5; // MOVED/ASK followed per command before giving up (503)

// CRC16-CCITT (XMODEM): polynomial 0x1021, initial 0, no reflection — Redis's crc16.c.
quint16 crc16(QByteArrayView data);
// The key's slot: CRC16 of the hash tag — the bytes between the first '{' and the first '}'
// after it, when there are any — else of the whole key; modulo 16384.
int keySlot(QByteArrayView key);

struct ClusterNode
{
    QByteArray host;
    int port = 0;
    QByteArray address() const { return host + ':' + QByteArray::number(port); }
    friend bool operator==(const ClusterNode &, const ClusterNode &) = default;
};

// "MOVED 3999 127.0.0.1:6381" / "ASK 3999 127.0.0.1:6381", as a node answers a command on a slot
// it does not serve. Neither ran the command, so following it is always safe.
struct Redirect
{
    bool ask = false; // ASK: this one command, once, preceded by ASKING; MOVED: the slot's new home
    int slot = 0;
    ClusterNode node;
};
std::optional<Redirect> redirectFrom(QByteArrayView error);
// An error reply saying the node ran nothing: a redirect, CLUSTERDOWN, TRYAGAIN, NOSCRIPT, BUSY,
// LOADING, READONLY, MASTERDOWN. Such a node was not written to (wait_replicas asks it nothing).
bool ranNothing(const redisReply *reply);

// Which slot a command touches: EVAL/EVALSHA route by KEYS[1], or — with no keys declared — by
// their first argument (every script of ours takes the key prefix first); other commands by
// their first argument. -1 for commands on no key (PING, TIME, WAIT, SCRIPT, CONFIG, …).
int commandSlot(const QList<QByteArray> &args);

// Slot → master, as CLUSTER SLOTS tells it. A slot nobody serves (a failed master not yet
// replaced) has no master: commands on it are refused, never sent elsewhere.
class SlotMap
{
public:
    static Result<SlotMap> fromClusterSlots(const redisReply *reply);
    std::optional<ClusterNode> master(int slot) const;
    QList<ClusterNode> masters() const;
    QList<ClusterNode> replicas() const { return m_replicas; } // as CLUSTER SLOTS named them
    void setMaster(int slot, const ClusterNode &node); // a MOVED answer
    int uncovered() const;                             // slots without a master

private:
    std::vector<qint16> m_owner = std::vector<qint16>(kSlots, -1); // index into m_nodes
    QList<ClusterNode> m_nodes;
    QList<ClusterNode> m_replicas;
};

// What one node says of itself in CLUSTER NODES (its `myself` line): its id and the slots it is
// importing ("[slot-<-from-id]") or migrating ("[slot->-to-id]"). Only the node itself shows
// them, and a replica that takes over does not inherit them.
struct SlotMoves
{
    QByteArray id;
    QHash<int, QByteArray> importing; // slot → the id of the node it comes from
    QHash<int, QByteArray> migrating; // slot → the id of the node it goes to
    // From the other lines of the same answer: every master it lists (its id and address) but
    // those it holds failed (FAIL) or not yet joined: a master owning no slot yet, as after
    // `--cluster add-node`, is not in CLUSTER SLOTS but may import one.
    QList<QPair<QByteArray, ClusterNode>> masters;
    static std::optional<SlotMoves> fromClusterNodes(QByteArrayView text);
};

// The nodes (masters and replicas) the latest slot map read in this process for the cluster
// these seeds name, and the setter refresh() calls: a new ClusterLinks falls back on them when
// no seed answers. Thread-safe.
QList<ClusterNode> knownNodes(const QList<ClusterNode> &seeds);
void learnNodes(const QList<ClusterNode> &seeds, const QList<ClusterNode> &nodes);

// Blocking connections to a cluster's masters, for one RedisStore (one thread; NOT
// thread-safe). Connects lazily to the master of each slot asked for (a link the node closed
// while idle is replaced before use); re-reads the slot map (from any node it knows, seeds
// first, nodes that failed lately last) when it is stale: after a MOVED, a CLUSTERDOWN, a lost
// connection or a slot without master. A slot that some master is importing while its owner is
// not migrating it there (the owner failed over during a reshard: its replica never had the
// MIGRATING flag nor the moved records) is refused until it is settled. A node that failed
// (process-wide, for 10 s or until it answers) is not asked for the moves: requests for other
// masters' slots never wait on a hung one. While a master's moves are missing from the last read
// (not asked, or no answer in 1 s), a slot whose owner is not the one of the last read every
// master answered (process-wide) is refused too: it may be half-moved to that master. Errors are
// values: ErrorCode::Unavailable (503) when nothing ran, InDoubt for a write whose answer was lost
// — never retried here. Contexts handed out stay valid only until the next call that may read the
// map (link(), current(), command(), refresh(), linkTo()): hold an address, not a context, across
// those.
class ClusterLinks
{
public:
    using Setup = std::function<Result<void>(redisContext *)>; // AUTH on each new connection
    ClusterLinks(QList<ClusterNode> seeds, int connectTimeoutMs, int commandTimeoutMs, Setup setup);
    ~ClusterLinks();
    ClusterLinks(const ClusterLinks &) = delete;
    ClusterLinks &operator=(const ClusterLinks &) = delete;

    // Reads CLUSTER SLOTS from the first node that answers it within 1 s, then each master's own
    // CLUSTER NODES line (pipelined, each answer waited for up to 1 s) for the slots half-moved
    // without their owner's migration. A master that does not answer, or failed lately, keeps what
    // it said last (any ClusterLinks of the process); that alone does not make the map stale, but
    // refuses the slots whose owner changed since the last read all masters answered.
    Result<void> refresh();
    // The slot moves are read again at least this often while the links are used, all settled
    // or not: what a failover and a failback mid-reshard did shows within it.
    static constexpr qint64 kMovesRereadMs = 1000;
    // The connection to the slot's master (connected on first use); refreshes a stale map first.
    // A half-moved slot (see above) is Unavailable; while there is one (or one refused for a
    // missing answer), the state is re-read at most once a second on use, so the slot is served
    // again once it is settled (and every master answered).
    Result<redisContext *> link(int slot);
    // The connection used last (for commands on no key: WAIT after a write, SCRIPT LOAD after a
    // NOSCRIPT), else any master's.
    Result<redisContext *> current();
    // Runs one command on the master of its slot, following MOVED (the map is updated and
    // re-read) and ASK (ASKING, then the command once on the target), at most kMaxRedirects.
    // An error reply other than a redirect comes back as the reply (the caller judges it);
    // CLUSTERDOWN and TRYAGAIN are Unavailable.
    using Reply = std::unique_ptr<redisReply, void (*)(void *)>;
    Result<Reply> command(const QList<QByteArray> &args, bool writes);
    // The connection to one node (a master from map()), connected on first use.
    Result<redisContext *> linkTo(const ClusterNode &node) { return connectTo(node); }
    // The masters a claim's or finish's own writes went to (WAIT goes to each), marked from
    // startMarking() until setMarkingWrites(false); other writes (the delivery log, the index, a
    // purge) are never marked. Unavailable when the link of one was dropped meanwhile: a WAIT on a
    // new link would wait for nothing. A write whose answer ran nothing (ranNothing()) is not
    // marked: the node that redirected it was not written to.
    void markWritten(redisContext *context);
    Result<QList<redisContext *>> takeWritten();
    // Marking on, from nothing marked and nothing lost: what earlier writes left goes.
    void startMarking();
    void setMarkingWrites(bool on) { m_markingWrites = on; }
    // A lost connection: drop it, mark its node failed, re-read the map before the next command.
    void broken(redisContext *context);
    // An answer came on this connection: its node is not failing (see above).
    void answered(const redisContext *context);
    void markStale() { m_stale = true; }
    // How many connections were dropped so far: a caller holding contexts across link() calls
    // (a pipeline being routed) checks it did not change — a refresh may drop any connection.
    quint64 dropped() const { return m_dropped; }
    const SlotMap &map() const { return m_map; }
    // Slot → the master importing it, for the half-moved slots the last refresh() found.
    const QHash<int, ClusterNode> &unsettled() const { return m_unsettled; }
    QList<ClusterNode> seeds() const { return m_seeds; }

private:
    Result<redisContext *> connectTo(const ClusterNode &node);
    QByteArray addressOf(const redisContext *context) const;
    // Frees the connection; `failed`: its node did not answer (marked, see above).
    void drop(redisContext *context, bool failed);
    void readMoves();
    // How long a map read (CLUSTER SLOTS, each master's CLUSTER NODES) waits for an answer.
    static constexpr int kMapReadTimeoutMs = 1000;
    // A half-moved slot so for this long is worth an operator's `redis-cli --cluster fix`.
    static constexpr qint64 kSettleHintMs = 5000;
    std::optional<Error> unsettledError(int slot);

    QList<ClusterNode> m_seeds;
    int m_connectTimeoutMs;
    int m_commandTimeoutMs;
    Setup m_setup;
    SlotMap m_map;
    bool m_stale = true;
    QHash<QByteArray, redisContext *> m_links; // by address
    redisContext *m_current = nullptr;
    QList<redisContext *> m_written;
    bool m_writtenLost = false; // a link in m_written was dropped
    bool m_markingWrites = false;         // on only around a claim's or finish's own writes
    QHash<QByteArray, SlotMoves> m_moves; // by master address: what each said of itself last
    QHash<int, ClusterNode> m_unsettled;  // slot → the master importing it
    QSet<int> m_unconfirmed; // slots whose owner changed while a master's moves went unread
    QString m_unread;        // those masters, for the error
    QHash<int, QElapsedTimer> m_unsettledSince; // since when, by the same importer
    QElapsedTimer m_movesRead;            // since the moves were read
    quint64 m_dropped = 0;                // connections dropped (broken())
};

} // namespace idem::redis
