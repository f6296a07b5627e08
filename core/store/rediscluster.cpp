#include "store/rediscluster.h"
#include "store/redisprotocol.h"

#include <hiredis.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <mutex>

namespace idem::redis {

namespace {

// Every node the latest slot map of this process named (masters and replicas), by cluster (its
// seeds, as the store URL gives them). A ClusterLinks made anew — a pool worker's, after any
// failed call — asks them too: with the seeds alone it stayed unavailable for good once every
// seed was gone (failed over and killed, or a plain redis:// URL's one node) on a healthy cluster.
struct KnownNodes
{
    std::mutex mutex;
    QHash<QByteArray, QList<ClusterNode>> byCluster;
};
// Never destroyed: a pool thread may still refresh while the process exits.
KnownNodes &known()
{
    static auto *nodes = new KnownNodes;
    return *nodes;
}

QByteArray clusterId(const QList<ClusterNode> &seeds)
{
    QByteArrayList addresses;
    for (const ClusterNode &seed : seeds)
        addresses.append(seed.address());
    std::sort(addresses.begin(), addresses.end());
    return addresses.join(',');
}

} // namespace

QList<ClusterNode> knownNodes(const QList<ClusterNode> &seeds)
{
    std::lock_guard lock(known().mutex);
    return known().byCluster.value(clusterId(seeds));
}

void learnNodes(const QList<ClusterNode> &seeds, const QList<ClusterNode> &nodes)
{
    if (nodes.isEmpty()) // a node reset or not in a cluster: it names none, which says nothing
        return;
    std::lock_guard lock(known().mutex);
    known().byCluster.insert(clusterId(seeds), nodes);
}

namespace {

// Nodes that failed lately (no connection, no answer in time), by address, for the whole process
// (each pool worker has its own ClusterLinks): the moves read does not ask them and the map is
// asked of them last, so one hung master does not stall the requests for other masters' slots —
// each worker asking it in turn, its failure making the map stale, the next read asking it again.
// Its own slots' requests are still sent to it (bounded by their own timeouts); an answer from it
// ends the mark.
constexpr qint64 kQuietMs = 10'000;

struct FailedNodes
{
    std::mutex mutex;
    QHash<QByteArray, qint64> since; // address → when it last failed (or was last probed)
    std::atomic<int> count{0};       // since.size(): an answer costs no lock while none failed
};
// Never destroyed, as known().
FailedNodes &failed()
{
    static auto *nodes = new FailedNodes;
    return *nodes;
}

qint64 nowMs()
{
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

void markFailed(const QByteArray &address)
{
    if (address.isEmpty())
        return;
    std::lock_guard lock(failed().mutex);
    failed().since.insert(address, nowMs());
    failed().count = int(failed().since.size());
}

void markAnswered(const QByteArray &address)
{
    if (failed().count.load(std::memory_order_relaxed) == 0 || address.isEmpty())
        return;
    std::lock_guard lock(failed().mutex);
    failed().since.remove(address);
    failed().count = int(failed().since.size());
}

// Failed within kQuietMs.
bool failedLately(const QByteArray &address)
{
    if (failed().count.load(std::memory_order_relaxed) == 0)
        return false;
    std::lock_guard lock(failed().mutex);
    const auto it = failed().since.constFind(address);
    return it != failed().since.cend() && nowMs() - *it < kQuietMs;
}

// Whether to ask a node its moves now: yes unless it failed lately; once kQuietMs passed, one
// worker of the process asks it again (the mark renewed meanwhile, so the others do not).
bool mayProbe(const QByteArray &address)
{
    if (failed().count.load(std::memory_order_relaxed) == 0)
        return true;
    std::lock_guard lock(failed().mutex);
    const auto it = failed().since.find(address);
    if (it == failed().since.end())
        return true;
    const qint64 now = nowMs();
    if (now - *it < kQuietMs)
        return false;
    *it = now;
    return true;
}

// What each master of a cluster said of its slot moves last (any ClusterLinks of this process:
// a new one starts with them, as with the marks above), and the slot map of the last moves read
// every master answered. Where a master's answer is missing from a read, a slot whose owner is not
// the one of that map may be half-moved without our knowing (that master imports it, the owner
// failed over): it is refused until a read is complete again.
struct MovesOfCluster
{
    QHash<QByteArray, QPair<qint64, SlotMoves>> byMaster; // address → (when asked, its moves)
    std::shared_ptr<const SlotMap> settled; // else the first map read (see readMoves())
};
struct KnownMoves
{
    std::mutex mutex;
    QHash<QByteArray, MovesOfCluster> byCluster;
};
// Never destroyed, as known().
KnownMoves &knownMoves()
{
    static auto *moves = new KnownMoves;
    return *moves;
}

constexpr std::array<quint16, 256> crcTable()
{
    std::array<quint16, 256> table{};
    for (int i = 0; i < 256; ++i) {
        quint16 crc = quint16(i << 8);
        for (int bit = 0; bit < 8; ++bit)
            crc = (crc & 0x8000) ? quint16((crc << 1) ^ 0x1021) : quint16(crc << 1);
        table[size_t(i)] = crc;
    }
    return table;
}
constexpr std::array<quint16, 256> kCrcTable = crcTable();

QByteArray textOf(const redisReply *r)
{
    return r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS ||
                 r->type == REDIS_REPLY_ERROR)
               ? QByteArray(r->str, qsizetype(r->len))
               : QByteArray();
}

timeval timeout(int ms)
{
    return {ms / 1000, (ms % 1000) * 1000};
}

Error unavailable(const QString &why)
{
    return makeError(ErrorCode::Unavailable, why);
}

} // namespace

quint16 crc16(QByteArrayView data)
{
    quint16 crc = 0;
    for (char c : data)
        crc = quint16((crc << 8) ^ kCrcTable[size_t(((crc >> 8) ^ quint8(c)) & 0xff)]);
    return crc;
}

int keySlot(QByteArrayView key)
{
    const qsizetype open = key.indexOf('{');
    if (open >= 0) {
        const qsizetype close = key.sliced(open + 1).indexOf('}');
        if (close > 0) // "{}" hashes the whole key
            return crc16(key.sliced(open + 1, close)) & (kSlots - 1);
    }
    return crc16(key) & (kSlots - 1);
}

std::optional<Redirect> redirectFrom(QByteArrayView error)
{
    Redirect r;
    if (error.startsWith("MOVED "))
        error = error.sliced(6);
    else if (error.startsWith("ASK ")) {
        r.ask = true;
        error = error.sliced(4);
    } else
        return std::nullopt;
    const qsizetype space = error.indexOf(' ');
    const qsizetype colon = error.lastIndexOf(':');
    if (space <= 0 || colon <= space + 1)
        return std::nullopt;
    bool slotOk = false, portOk = false;
    r.slot = error.first(space).toInt(&slotOk);
    r.node.host = error.sliced(space + 1, colon - space - 1).toByteArray();
    r.node.port = error.sliced(colon + 1).toInt(&portOk);
    if (!slotOk || !portOk || r.slot < 0 || r.slot >= kSlots || r.node.port <= 0 ||
        r.node.port > 65535)
        return std::nullopt;
    return r;
}

bool ranNothing(const redisReply *reply)
{
    if (reply->type != REDIS_REPLY_ERROR)
        return false;
    const QByteArrayView error(reply->str, qsizetype(reply->len));
    for (const char *prefix : {"MOVED ", "ASK ", "CLUSTERDOWN", "TRYAGAIN", "NOSCRIPT", "BUSY ",
                               "LOADING", "READONLY", "MASTERDOWN"})
        if (error.startsWith(prefix))
            return true;
    return false;
}

int commandSlot(const QList<QByteArray> &args)
{
    if (args.size() < 2)
        return -1;
    const QByteArray name = args.first().toUpper();
    if (name == "EVAL" || name == "EVALSHA") {
        if (args.size() < 4)
            return -1;
        return keySlot(args.at(3)); // KEYS[1], or the first argument when no key is declared
    }
    static const QByteArray keyless[] = {
        "PING", "TIME",  "WAIT", "SCRIPT", "CONFIG", "AUTH",    "SELECT",   "CLUSTER",
        "INFO", "MULTI", "EXEC", "ASKING", "DBSIZE", "FLUSHDB", "FLUSHALL", "SCAN"};
    for (const QByteArray &k : keyless)
        if (name == k)
            return -1;
    return keySlot(args.at(1));
}

std::optional<SlotMoves> SlotMoves::fromClusterNodes(QByteArrayView text)
{
    // <id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong> <epoch> <link> <slot>…, one
    // node a line.
    std::optional<SlotMoves> mine;
    QList<QPair<QByteArray, ClusterNode>> masters;
    for (const QByteArray &line : text.toByteArray().split('\n')) {
        const QList<QByteArray> fields = line.trimmed().split(' ');
        if (fields.size() < 8)
            continue;
        const QList<QByteArray> flags = fields.at(2).split(',');
        const QByteArray address = fields.at(1).split('@').first();
        const qsizetype colon = address.lastIndexOf(':');
        bool portOk = false;
        const ClusterNode node{address.first(std::max<qsizetype>(colon, 0)),
                               colon > 0 ? address.sliced(colon + 1).toInt(&portOk) : 0};
        if (flags.contains("master") && portOk && node.port > 0 && !flags.contains("fail") &&
            !flags.contains("noaddr") && !flags.contains("handshake"))
            masters.append({fields.at(0), node});
        if (!flags.contains("myself"))
            continue;
        SlotMoves &moves = mine.emplace();
        moves.id = fields.at(0);
        for (qsizetype i = 8; i < fields.size(); ++i) {
            const QByteArray &f = fields.at(i);
            if (f.size() < 5 || !f.startsWith('[') || !f.endsWith(']'))
                continue; // a slot or a range it serves
            const QByteArray inner = f.sliced(1, f.size() - 2);
            const bool importing = inner.contains("-<-");
            const qsizetype arrow = inner.indexOf(importing ? "-<-" : "->-");
            bool ok = false;
            const int slot = arrow > 0 ? inner.first(arrow).toInt(&ok) : -1;
            if (!ok || slot < 0 || slot >= kSlots)
                continue;
            (importing ? moves.importing : moves.migrating).insert(slot, inner.sliced(arrow + 3));
        }
    }
    if (mine)
        mine->masters = masters;
    return mine;
}

Result<SlotMap> SlotMap::fromClusterSlots(const redisReply *reply)
{
    if (!reply || reply->type != REDIS_REPLY_ARRAY)
        return unavailable(u"unexpected answer to CLUSTER SLOTS"_qs);
    SlotMap map;
    for (size_t i = 0; i < reply->elements; ++i) {
        // [start, end, [host, port, id, …] (the master), [replica]…]
        const redisReply *range = reply->element[i];
        if (range->type != REDIS_REPLY_ARRAY || range->elements < 3 ||
            range->element[0]->type != REDIS_REPLY_INTEGER ||
            range->element[1]->type != REDIS_REPLY_INTEGER ||
            range->element[2]->type != REDIS_REPLY_ARRAY || range->element[2]->elements < 2 ||
            range->element[2]->element[1]->type != REDIS_REPLY_INTEGER)
            return unavailable(u"unexpected answer to CLUSTER SLOTS"_qs);
        const long long start = range->element[0]->integer, end = range->element[1]->integer;
        if (start < 0 || end >= kSlots || start > end)
            return unavailable(u"CLUSTER SLOTS names slots out of range"_qs);
        const ClusterNode node{textOf(range->element[2]->element[0]),
                               int(range->element[2]->element[1]->integer)};
        if (node.host.isEmpty() || node.port <= 0) // "?" / unknown endpoint: no usable master
            continue;
        for (long long slot = start; slot <= end; ++slot)
            map.setMaster(int(slot), node);
        for (size_t r = 3; r < range->elements; ++r) {
            const redisReply *replica = range->element[r];
            if (replica->type != REDIS_REPLY_ARRAY || replica->elements < 2 ||
                replica->element[1]->type != REDIS_REPLY_INTEGER)
                continue;
            const ClusterNode n{textOf(replica->element[0]), int(replica->element[1]->integer)};
            if (!n.host.isEmpty() && n.port > 0 && !map.m_replicas.contains(n))
                map.m_replicas.append(n);
        }
    }
    return map;
}

std::optional<ClusterNode> SlotMap::master(int slot) const
{
    if (slot < 0 || slot >= kSlots || m_owner[size_t(slot)] < 0)
        return std::nullopt;
    return m_nodes.at(m_owner[size_t(slot)]);
}

QList<ClusterNode> SlotMap::masters() const
{
    QList<ClusterNode> used;
    for (qint16 owner : m_owner)
        if (owner >= 0 && !used.contains(m_nodes.at(owner)))
            used.append(m_nodes.at(owner));
    return used;
}

void SlotMap::setMaster(int slot, const ClusterNode &node)
{
    qsizetype index = m_nodes.indexOf(node);
    if (index < 0) {
        m_nodes.append(node);
        index = m_nodes.size() - 1;
    }
    m_owner[size_t(slot)] = qint16(index);
}

int SlotMap::uncovered() const
{
    return int(std::count(m_owner.begin(), m_owner.end(), qint16(-1)));
}

ClusterLinks::ClusterLinks(QList<ClusterNode> seeds, int connectTimeoutMs, int commandTimeoutMs,
                           Setup setup)
    : m_seeds(std::move(seeds)), m_connectTimeoutMs(connectTimeoutMs),
      m_commandTimeoutMs(commandTimeoutMs), m_setup(std::move(setup))
{}

ClusterLinks::~ClusterLinks()
{
    for (redisContext *c : std::as_const(m_links))
        redisFree(c);
}

Result<redisContext *> ClusterLinks::connectTo(const ClusterNode &node)
{
    if (redisContext *c = m_links.value(node.address())) {
        if (!linkClosed(c))
            return c;
        // Closed while idle (the node restarted, CLIENT KILL): a new connection now, rather than
        // a 503 for the command written to the old one.
        drop(c, false);
    }
    const timeval connectTimeout{m_connectTimeoutMs / 1000, (m_connectTimeoutMs % 1000) * 1000};
    redisContext *c = redisConnectWithTimeout(node.host.constData(), node.port, connectTimeout);
    if (!c)
        return unavailable(u"out of memory"_qs);
    if (c->err) {
        const QString why = u"cannot connect to cluster node %1: %2"_qs.arg(
            QString::fromUtf8(node.address()), QString::fromUtf8(c->errstr));
        redisFree(c);
        markFailed(node.address());
        return unavailable(why);
    }
    const timeval commandTimeout{m_commandTimeoutMs / 1000, (m_commandTimeoutMs % 1000) * 1000};
    redisSetTimeout(c, commandTimeout);
    redis::guardReader(c->reader);
    if (m_setup) {
        if (auto r = m_setup(c); !r) {
            redisFree(c);
            return r.error();
        }
    }
    m_links.insert(node.address(), c);
    return c;
}

void ClusterLinks::markWritten(redisContext *context)
{
    if (m_markingWrites && !m_written.contains(context))
        m_written.append(context);
}

void ClusterLinks::startMarking()
{
    m_written.clear();
    m_writtenLost = false;
    m_markingWrites = true;
}

Result<QList<redisContext *>> ClusterLinks::takeWritten()
{
    if (std::exchange(m_writtenLost, false)) {
        m_written.clear();
        return unavailable(u"a master written to was disconnected before its replicas could be "
                           u"asked (wait_replicas)"_qs);
    }
    return std::exchange(m_written, {});
}

QByteArray ClusterLinks::addressOf(const redisContext *context) const
{
    for (auto it = m_links.cbegin(); it != m_links.cend(); ++it)
        if (it.value() == context)
            return it.key();
    return {};
}

void ClusterLinks::answered(const redisContext *context)
{
    markAnswered(addressOf(context));
}

void ClusterLinks::drop(redisContext *context, bool failed)
{
    const QByteArray address = addressOf(context);
    m_links.remove(address);
    if (m_written.removeAll(context) > 0)
        m_writtenLost = true;
    if (m_current == context)
        m_current = nullptr;
    redisFree(context);
    ++m_dropped;
    if (failed)
        markFailed(address);
}

void ClusterLinks::broken(redisContext *context)
{
    drop(context, true);
    m_stale = true; // a master gone is what a failover looks like: ask who serves its slots now
}

Result<void> ClusterLinks::refresh()
{
    // The nodes we know (the last map's masters, every node a map of this process named for
    // these seeds) and the seeds: any one that answers will do.
    // Nodes that failed lately are asked last: a hung master would keep us its whole timeout.
    QList<ClusterNode> candidates = m_map.masters();
    for (const QList<ClusterNode> &more : {knownNodes(m_seeds), m_seeds})
        for (const ClusterNode &node : more)
            if (!candidates.contains(node))
                candidates.append(node);
    std::stable_partition(candidates.begin(), candidates.end(),
                          [](const ClusterNode &n) { return !failedLately(n.address()); });
    QStringList failures;
    for (const ClusterNode &node : std::as_const(candidates)) {
        auto c = connectTo(node);
        if (!c) {
            failures << c.error().message;
            continue;
        }
        // Its answer waited for at most kMapReadTimeoutMs, as the moves': a node not yet known to
        // hang would keep every request that reads the map for its whole command timeout.
        redisSetTimeout(*c, timeout(std::min(m_commandTimeoutMs, kMapReadTimeoutMs)));
        auto *raw = static_cast<redisReply *>(redisCommand(*c, "CLUSTER SLOTS"));
        if (raw)
            redisSetTimeout(*c, timeout(m_commandTimeoutMs));
        if (!raw) {
            failures << u"%1: %2"_qs.arg(QString::fromUtf8(node.address()),
                                         QString::fromUtf8((*c)->errstr));
            broken(*c);
            continue;
        }
        Reply reply(raw, freeReplyObject);
        markAnswered(node.address());
        if (reply->type == REDIS_REPLY_ERROR) {
            failures << u"%1: %2"_qs.arg(QString::fromUtf8(node.address()),
                                         QString::fromUtf8(textOf(reply.get())));
            continue;
        }
        auto map = SlotMap::fromClusterSlots(reply.get());
        if (!map) {
            failures << map.error().message;
            continue;
        }
        m_map = std::move(*map);
        m_stale = false;
        learnNodes(m_seeds, m_map.masters() + m_map.replicas());
        readMoves();
        return {};
    }
    return unavailable(u"no cluster node told the slot map (%1)"_qs.arg(failures.join(u"; "_qs)));
}

void ClusterLinks::readMoves()
{
    // CLUSTER SLOTS says who owns a slot, not whether it is being moved: only each master's own
    // line of CLUSTER NODES does. Asked of every master before any answer is read, each answer
    // waited for at most kMapReadTimeoutMs. A master that failed lately is not asked, and one that
    // does not answer now is dropped and marked so (not the map made stale: its own slots'
    // requests find out whether it is gone): what it said last stands meanwhile — where it owns
    // a slot another master imports, that slot stays refused.
    // The masters owning slots, then any other master their answers list (one that owns none
    // yet, as after `--cluster add-node`, may import a slot all the same).
    QList<ClusterNode> masters = m_map.masters();
    const qint64 askedAt = nowMs();
    // Masters whose moves this read lacks. One that owns slots and does not answer counts so even
    // when the cluster holds it failed (FAIL): a paused process or VM is flagged so as a dead one
    // is, and comes back with its IMPORTING state and the moved records (taken for known down, a
    // completed key ran again). So a master down for good with no replica to take over refuses
    // every later owner change until the operator forgets it (`redis-cli --cluster forget`, or
    // `--cluster fix`).
    QStringList unread;
    QHash<QByteArray, SlotMoves> answers;
    const auto ask = [&](const QList<ClusterNode> &nodes) {
        QList<QPair<ClusterNode, redisContext *>> asked;
        for (const ClusterNode &node : nodes) {
            auto c = mayProbe(node.address()) ? connectTo(node) : Result<redisContext *>(nullptr);
            if (!c || !*c) {
                unread << QString::fromUtf8(node.address());
                continue;
            }
            redisAppendCommand(*c, "CLUSTER NODES");
            int done = 0;
            while (!done && redisBufferWrite(*c, &done) == REDIS_OK) {
            }
            asked.append({node, *c});
        }
        for (const auto &[node, c] : std::as_const(asked)) {
            void *raw = nullptr;
            redisSetTimeout(c, timeout(std::min(m_commandTimeoutMs, kMapReadTimeoutMs)));
            if (redisGetReply(c, &raw) != REDIS_OK || !raw) {
                drop(c, true);
                unread << QString::fromUtf8(node.address());
                continue;
            }
            redisSetTimeout(c, timeout(m_commandTimeoutMs));
            markAnswered(node.address());
            Reply reply(static_cast<redisReply *>(raw), freeReplyObject);
            const auto moves = reply->type == REDIS_REPLY_STRING
                                   ? SlotMoves::fromClusterNodes(textOf(reply.get()))
                                   : std::nullopt;
            if (moves)
                answers.insert(node.address(), *moves);
            else
                unread << QString::fromUtf8(node.address());
        }
    };
    ask(masters);
    // Told apart by id: CLUSTER SLOTS may name a master by its hostname where CLUSTER NODES has
    // its IP (cluster-preferred-endpoint-type hostname).
    QSet<QByteArray> answeredIds;
    for (const SlotMoves &moves : std::as_const(answers))
        answeredIds.insert(moves.id);
    QList<ClusterNode> slotless;
    for (const SlotMoves &moves : std::as_const(answers))
        for (const auto &[id, m] : moves.masters)
            if (!answeredIds.contains(id) && !masters.contains(m) && !slotless.contains(m))
                slotless << m;
    if (!slotless.isEmpty()) {
        ask(slotless);
        masters += slotless;
    }
    std::shared_ptr<const SlotMap> settled;
    {
        std::lock_guard lock(knownMoves().mutex);
        MovesOfCluster &cluster = knownMoves().byCluster[clusterId(m_seeds)];
        for (auto it = answers.cbegin(); it != answers.cend(); ++it) {
            auto &last = cluster.byMaster[it.key()];
            if (last.first <= askedAt) // not over a later read's (another worker's)
                last = {askedAt, it.value()};
        }
        if (unread.isEmpty()) {
            for (auto it = cluster.byMaster.begin(); it != cluster.byMaster.end();) {
                if (std::any_of(masters.begin(), masters.end(),
                                [&](const ClusterNode &m) { return m.address() == it.key(); }))
                    ++it;
                else
                    it = cluster.byMaster.erase(it);
            }
            cluster.settled = std::make_shared<const SlotMap>(m_map);
        } else if (!cluster.settled) {
            // No read of this process was complete yet: the first map stands for one (a desk
            // started while a master does not answer is not refused everything meanwhile).
            cluster.settled = std::make_shared<const SlotMap>(m_map);
        }
        m_moves.clear();
        for (auto it = cluster.byMaster.cbegin(); it != cluster.byMaster.cend(); ++it)
            m_moves.insert(it.key(), it.value().second);
        settled = cluster.settled;
    }
    // A slot some master imports is settled while its owner migrates it to that master (ASK
    // sends each key the owner no longer holds there). Otherwise — the owner failed over
    // mid-reshard, or did not answer yet — its records may be on the importing master, and the
    // owner would take a completed key for a new one.
    const QHash<int, ClusterNode> before = std::exchange(m_unsettled, {});
    for (const ClusterNode &node : masters) {
        const auto moves = m_moves.constFind(node.address());
        if (moves == m_moves.cend())
            continue;
        for (auto in = moves->importing.cbegin(); in != moves->importing.cend(); ++in) {
            const int slot = in.key();
            const auto owner = m_map.master(slot);
            if (owner && *owner == node)
                continue;
            // No owner in this map (read from the importing node, which still names the old
            // owner, a replica now): as unsettled, not a mere failover in progress.
            const auto ownerMoves = owner ? m_moves.constFind(owner->address()) : m_moves.cend();
            if (ownerMoves != m_moves.cend() && ownerMoves->migrating.value(slot) == moves->id)
                continue;
            m_unsettled.insert(slot, node);
        }
    }
    // A master's answer missing (hung for a moment, failed lately): what it said last may be from
    // before a reshard began, or nothing (a new ClusterLinks). A slot whose owner changed since the
    // last complete read (a MOVED, a failover) is then not taken as settled: the owner may lack
    // the records that master imported. Refused until a read has every master's answer.
    m_unconfirmed.clear();
    m_unread = unread.join(u", "_qs);
    if (!unread.isEmpty()) {
        for (int slot = 0; slot < kSlots; ++slot) {
            const auto owner = m_map.master(slot);
            if (owner && !(settled->master(slot) == owner))
                m_unconfirmed.insert(slot);
        }
    }
    // Since when each is so (the same importer on every read since): a reshard sets a slot
    // IMPORTING on its target a moment before MIGRATING on its owner, so only a state that
    // lasts is worth an operator's `--cluster fix`.
    for (auto it = m_unsettledSince.begin(); it != m_unsettledSince.end();) {
        if (m_unsettled.contains(it.key()) && before.value(it.key()) == m_unsettled.value(it.key()))
            ++it;
        else
            it = m_unsettledSince.erase(it);
    }
    for (auto it = m_unsettled.cbegin(); it != m_unsettled.cend(); ++it)
        if (!m_unsettledSince.contains(it.key()))
            m_unsettledSince[it.key()].start();
    m_movesRead.start();
}

std::optional<Error> ClusterLinks::unsettledError(int slot)
{
    if (m_movesRead.isValid() && m_movesRead.elapsed() >= kMovesRereadMs) {
        if (!m_unsettled.isEmpty() || !m_unconfirmed.isEmpty())
            (void)refresh(); // settled meanwhile? (unanswered: what we know stands)
        else if (m_written.isEmpty())
            // Read again even when all looked settled: a slot's owner failing over and back
            // mid-reshard sends no MOVED to a desk that sent nothing to its slots meanwhile, and
            // the owner is back at its address without the MIGRATING flag or the moved records.
            // Not between a claim's write and its WAIT: a link dropped there refuses the claim.
            readMoves();
    }
    if (m_unsettled.isEmpty() && m_unconfirmed.isEmpty())
        return std::nullopt;
    const auto owner = m_map.master(slot);
    const auto importer = m_unsettled.constFind(slot);
    if (importer == m_unsettled.cend()) {
        if (!m_unconfirmed.contains(slot))
            return std::nullopt;
        return unavailable(
            u"slot %1 changed owner (now %2) while %3 did not tell its slot moves (no answer in "
            u"time, or failed lately): it may import the slot's records; nothing is decided on it "
            u"until every master answers"_qs.arg(slot)
                .arg(owner ? QString::fromUtf8(owner->address()) : u"(none)"_qs, m_unread));
    }
    QString why =
        u"slot %1 is half-moved: %2 imports it but its owner %3 does not migrate it there (a "
        u"reshard about to move it, or the owner failed over mid-reshard and lacks the records "
        u"moved away); nothing is decided on it until that is settled"_qs.arg(slot)
            .arg(QString::fromUtf8(importer->address()),
                 owner ? QString::fromUtf8(owner->address()) : u"(none)"_qs);
    const auto since = m_unsettledSince.constFind(slot);
    const qint64 lastedMs = since == m_unsettledSince.cend() ? 0 : since->elapsed();
    if (lastedMs >= kSettleHintMs)
        why += u"; so for %1 s: unless a reshard is running, check it with `redis-cli --cluster "
               u"check` and settle it with `redis-cli --cluster fix`"_qs.arg(lastedMs / 1000);
    return unavailable(why);
}

Result<redisContext *> ClusterLinks::link(int slot)
{
    if (m_stale) {
        if (auto r = refresh(); !r)
            return r.error();
    }
    if (auto refused = unsettledError(slot))
        return *refused;
    auto master = m_map.master(slot);
    if (!master) {
        // Its master failed and no replica took over yet: refused (nothing is sent anywhere else);
        // the map is read again on the next call.
        m_stale = true;
        return unavailable(u"slot %1 has no master (failover in progress?)"_qs.arg(slot));
    }
    auto c = connectTo(*master);
    if (!c) {
        m_stale = true;
        return c.error();
    }
    m_current = *c;
    return c;
}

Result<redisContext *> ClusterLinks::current()
{
    if (m_current && linkClosed(m_current))
        drop(m_current, false); // as connectTo(): replaced below rather than a 503
    if (m_current)
        return m_current;
    if (m_stale) {
        if (auto r = refresh(); !r)
            return r.error();
    }
    const auto masters = m_map.masters();
    if (masters.isEmpty())
        return unavailable(u"the cluster serves no slot"_qs);
    auto c = connectTo(masters.first());
    if (!c) {
        m_stale = true;
        return c.error();
    }
    m_current = *c;
    return c;
}

Result<ClusterLinks::Reply> ClusterLinks::command(const QList<QByteArray> &args, bool writes)
{
    std::vector<const char *> argv;
    std::vector<size_t> lengths;
    for (const QByteArray &a : args) {
        argv.push_back(a.constData());
        lengths.push_back(size_t(a.size()));
    }
    const int slot = commandSlot(args);
    auto context = slot >= 0 ? link(slot) : current();
    bool asking = false;
    for (int redirects = 0;; ++redirects) {
        if (!context)
            return context.error();
        redisContext *c = *context;
        if (asking) {
            // ASKING and the command in one write: the target serves this one command on a slot it
            // is importing.
            redisAppendCommand(c, "ASKING");
            redisAppendCommandArgv(c, int(argv.size()), argv.data(), lengths.data());
            void *ok = nullptr;
            if (redisGetReply(c, &ok) == REDIS_OK && ok)
                freeReplyObject(ok);
        } else {
            redisAppendCommandArgv(c, int(argv.size()), argv.data(), lengths.data());
        }
        void *raw = nullptr;
        if (redisGetReply(c, &raw) != REDIS_OK || !raw) {
            // No answer: a write may or may not have been applied — in doubt, never re-sent.
            const QString why = QString::fromUtf8(c->errstr);
            broken(c);
            return makeError(writes ? ErrorCode::InDoubt : ErrorCode::Unavailable, why);
        }
        Reply reply(static_cast<redisReply *>(raw), freeReplyObject);
        answered(c);
        // Marked only when it may have run here: after a MOVED the old master (a replica now, after
        // a failover) was waited on and refused the WAIT, so a claim written was refused (503) and
        // then answered 409, a lease nobody runs; after an ASK the old owner's replicas were too.
        if (writes && !ranNothing(reply.get()))
            markWritten(c);
        if (reply->type != REDIS_REPLY_ERROR)
            return reply;
        const QByteArray error = textOf(reply.get());
        if (error.startsWith("CLUSTERDOWN") || error.startsWith("TRYAGAIN")) {
            // Not run: the cluster cannot serve the slot now (a failover, a migration).
            m_stale = true;
            return unavailable(QString::fromUtf8(error));
        }
        const auto redirect = redirectFrom(error);
        if (!redirect)
            return reply; // the command's own error
        // Redirected: the node did not run the command, so sending it on is safe.
        if (redirects >= kMaxRedirects)
            return unavailable(
                u"more than %1 cluster redirects for slot %2 (last: %3)"_qs.arg(kMaxRedirects)
                    .arg(redirect->slot)
                    .arg(QString::fromUtf8(error)));
        asking = redirect->ask;
        if (!redirect->ask) {
            // The slot moved (a reshard ended, a failover): the map and the masters' moves are read
            // again before following — after a failover mid-reshard the new owner lacks the slot's
            // moved records, and running the command there would decide on nothing.
            if (auto r = refresh(); !r)
                return r.error(); // nothing ran
            if (auto refused = unsettledError(redirect->slot))
                return *refused;
            if (!(m_map.master(redirect->slot) == redirect->node)) {
                // The node that told the map has not heard yet: read again before the next command.
                m_map.setMaster(redirect->slot, redirect->node);
                m_stale = true;
            }
        }
        context = connectTo(redirect->node);
        if (context)
            m_current = *context;
    }
}

} // namespace idem::redis
