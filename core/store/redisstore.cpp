#include "store/redisstore.h"

#include "store/rediscluster.h"
#include "store/redisprotocol.h"
#include "util/format.h"

#include <QElapsedTimer>
#include <QRandomGenerator>
#include <QRegularExpression>
#include <QScopeGuard>
#include <QSet>
#include <QThread>

#include <algorithm>

#include <hiredis.h>

namespace idem {

namespace {

// KeyQuery::glob as a match of the whole key (empty: every key).
QRegularExpression keyGlob(const QString &glob)
{
    return QRegularExpression(glob.isEmpty() ? QString()
                                             : u"\\A(?:"_qs + keyGlobToRegex(glob) + u")\\z"_qs,
                              QRegularExpression::DotMatchesEverythingOption);
}

QByteArray num(qint64 v)
{
    return QByteArray::number(v);
}

// wait_replicas on a cluster waits on the masters a claim's or finish's own scripts wrote to, and
// on those alone: marked from a clean slate when it starts (a delivery log write, a purge, a link
// replaced since, left nothing that a claim then waited on or was refused for), not once its
// scripts have answered (stop()).
class MarkedWrites
{
public:
    explicit MarkedWrites(redis::ClusterLinks *cluster) : m_cluster(cluster)
    {
        if (m_cluster)
            m_cluster->startMarking();
    }
    ~MarkedWrites() { stop(); }
    MarkedWrites(const MarkedWrites &) = delete;
    MarkedWrites &operator=(const MarkedWrites &) = delete;
    void stop()
    {
        if (m_cluster)
            m_cluster->setMarkingWrites(false);
    }

private:
    redis::ClusterLinks *m_cluster;
};

// Expired keys made tombstones per bucket and endpoint and round trip, by the purge (the
// engine's, every minute, and `keys purge-expired`), a slice after another. Listings and counts
// purge nothing: they read only the entries scored above the store's clock.
constexpr qint64 kPurgeSlice = 5000;
// Keys per run of tombstone.lua: about 5 ms of Redis's time (a run of 5000 took 70 ms, every
// other client waiting).
constexpr size_t kTombstoneRun = 400;

using redis::fieldsFrom;
using redis::text;

// SCAN's MATCH takes a glob: the prefix's own glob characters are escaped.
QByteArray globEscaped(const QByteArray &text)
{
    QByteArray out;
    for (char c : text) {
        if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\')
            out += '\\';
        out += c;
    }
    return out;
}

} // namespace

// AUTH on a new connection (the one of a single Redis, each cluster node's).
Result<void> authenticate(redisContext *c, const StoreUrl &url)
{
    if (url.password.isEmpty())
        return {};
    QList<QByteArray> auth{"AUTH"};
    if (!url.user.isEmpty())
        auth << url.user.toUtf8();
    auth << url.password.toUtf8();
    redis::Argv a(auth);
    auto *raw = static_cast<redisReply *>(redisCommandArgv(c, a.count(), a.argv.data(), a.lengths.data()));
    const QString why = !raw                             ? QString::fromUtf8(c->errstr)
                        : raw->type == REDIS_REPLY_ERROR ? QString::fromUtf8(raw->str, int(raw->len))
                                                         : QString();
    if (raw)
        freeReplyObject(raw);
    if (!why.isEmpty())
        return makeError(ErrorCode::Unavailable,
                         u"Redis %1: authentication failed: %2"_qs.arg(url.display(), why));
    return {};
}

RedisStore::RedisStore(redisContext *context, StoreUrl url, RedisOptions options)
    : m_context(context), m_url(std::move(url)), m_options(options),
      m_prefix(m_url.prefix.toUtf8()),
      m_layout(m_prefix, context ? 1 : redis::Layout::kClusterBuckets)
{}

RedisStore::~RedisStore()
{
    if (m_context)
        redisFree(m_context);
}

Result<std::unique_ptr<RedisStore>> RedisStore::connect(const StoreUrl &url,
                                                        const RedisOptions &options)
{
    if (url.cluster)
        return connectCluster(url, options);
    timeval connectTimeout{options.connectTimeoutMs / 1000, (options.connectTimeoutMs % 1000) * 1000};
    redisContext *context = redisConnectWithTimeout(url.host.toUtf8().constData(), url.port, connectTimeout);
    if (!context)
        return makeError(ErrorCode::Unavailable, u"Redis %1: out of memory"_qs.arg(url.display()));
    if (context->err) {
        const QString message = QString::fromUtf8(context->errstr);
        redisFree(context);
        return makeError(ErrorCode::Unavailable,
                         u"cannot connect to Redis at %1: %2"_qs.arg(url.display(), message));
    }
    timeval commandTimeout{options.commandTimeoutMs / 1000,
                           (options.commandTimeoutMs % 1000) * 1000};
    redisSetTimeout(context, commandTimeout);
    redis::guardReader(context->reader);
    std::unique_ptr<RedisStore> store(new RedisStore(context, url, options));
    if (auto r = authenticate(context, url); !r)
        return r.error();
    // A cluster node behind a plain redis:// URL is served as a cluster (it is one of the seeds).
    if (auto info = store->command({"CLUSTER", "INFO"}, false);
        info && text(info->get()).contains("cluster_state:")) {
        if (url.database != u"0"_qs)
            return makeError(ErrorCode::Invalid,
                             u"Redis %1 is a cluster node: a Redis Cluster has database 0 only"_qs.arg(url.display()));
        StoreUrl clustered = url;
        clustered.cluster = true;
        clustered.clusterSeeds = {{url.host, url.port}};
        return connectCluster(clustered, options);
    }
    if (url.database != u"0"_qs) {
        if (auto r = store->command({"SELECT", url.database.toUtf8()}, false); !r)
            return r.error();
    }
    if (auto r = store->loadScripts(); !r)
        return r.error();
    return store;
}

Result<std::unique_ptr<RedisStore>> RedisStore::connectCluster(const StoreUrl &url,
                                                               const RedisOptions &options)
{
    QList<redis::ClusterNode> seeds;
    for (const auto &[host, port] : std::as_const(url.clusterSeeds))
        seeds.append({host.toUtf8(), port});
    auto links = std::make_unique<redis::ClusterLinks>(
        seeds, options.connectTimeoutMs, options.commandTimeoutMs,
        [url](redisContext *c) { return authenticate(c, url); });
    if (auto r = links->refresh(); !r)
        return makeError(ErrorCode::Unavailable,
                         u"Redis Cluster %1: %2"_qs.arg(url.display(), r.error().message));
    std::unique_ptr<RedisStore> store(new RedisStore(nullptr, url, options));
    store->m_cluster = std::move(links);
    // The SHA1 of each script is known here; a master that lacks one answers NOSCRIPT and is sent
    // it then (script()), so no master needs to be reachable up front.
    auto scripts = redis::scripts();
    if (!scripts)
        return scripts.error();
    for (auto it = scripts->cbegin(); it != scripts->cend(); ++it)
        store->m_sha.insert(it.key(), it->sha);
    return store;
}

Error RedisStore::failure(const QString &what, bool writes) const
{
    // Without an answer we cannot know whether a write was applied: in doubt, never retried.
    return makeError(writes ? ErrorCode::InDoubt : ErrorCode::Unavailable,
                     u"Redis %1: %2"_qs.arg(m_url.display(), what));
}

Result<RedisStore::Reply> RedisStore::command(const QList<QByteArray> &args, bool writes)
{
    if (m_cluster) {
        auto r = m_cluster->command(args, writes);
        if (!r)
            return makeError(r.error().code,
                             u"Redis %1: %2"_qs.arg(m_url.display(), r.error().message));
        if (r->get()->type == REDIS_REPLY_ERROR)
            return makeError(
                ErrorCode::Unavailable,
                u"Redis %1: %2"_qs.arg(m_url.display(),
                                       QString::fromUtf8(r->get()->str, int(r->get()->len))));
        return std::move(*r);
    }
    redis::Argv a(args);
    if (m_context->err)
        return failure(u"connection lost: %1"_qs.arg(QString::fromUtf8(m_context->errstr)), false);
    void *raw = redisCommandArgv(m_context, a.count(), a.argv.data(), a.lengths.data());
    if (!raw)
        return failure(QString::fromUtf8(m_context->errstr), writes);
    Reply reply(static_cast<redisReply *>(raw), freeReplyObject);
    if (reply->type == REDIS_REPLY_ERROR)
        return makeError(ErrorCode::Unavailable,
                         u"Redis %1: %2"_qs.arg(m_url.display(),
                                                QString::fromUtf8(reply->str, int(reply->len))));
    return reply;
}

bool RedisStore::connectionDropped()
{
    return !m_cluster && redis::linkClosed(m_context);
}

Result<void> RedisStore::loadScripts()
{
    auto scripts = redis::scripts();
    if (!scripts)
        return scripts.error();
    for (auto it = scripts->cbegin(); it != scripts->cend(); ++it) {
        auto r = command({"SCRIPT", "LOAD", it->source}, false);
        if (!r)
            return r.error();
        m_sha.insert(it.key(), text(r->get()));
    }
    return {};
}

Result<std::vector<RedisStore::Reply>>
RedisStore::pipeline(const QList<QList<QByteArray>> &commands, bool writes)
{
    if (m_cluster)
        return clusterPipeline(commands, writes);
    if (m_context->err)
        return failure(u"connection lost: %1"_qs.arg(QString::fromUtf8(m_context->errstr)), false);
    for (const auto &command : commands) {
        redis::Argv a(command);
        redisAppendCommandArgv(m_context, a.count(), a.argv.data(), a.lengths.data());
    }
    std::vector<Reply> replies;
    replies.reserve(size_t(commands.size()));
    for (qsizetype i = 0; i < commands.size(); ++i) {
        void *raw = nullptr;
        if (redisGetReply(m_context, &raw) != REDIS_OK || !raw)
            return failure(QString::fromUtf8(m_context->errstr), writes);
        replies.emplace_back(static_cast<redisReply *>(raw), freeReplyObject);
    }
    return replies;
}

Result<std::vector<RedisStore::Reply>> RedisStore::clusterPipeline(const QList<QList<QByteArray>> &commands,
                                                                    bool writes)
{
    // One pipeline per master, each command to its slot's; the answers back in the given order.
    std::vector<Reply> replies;
    replies.reserve(size_t(commands.size()));
    for (qsizetype i = 0; i < commands.size(); ++i)
        replies.emplace_back(nullptr, freeReplyObject);
    QHash<redisContext *, QList<qsizetype>> byNode;
    QList<redisContext *> order;
    for (int pass = 0;; ++pass) {
        // Routing may read the slot map again (stale, or a half-moved slot re-checked), which may
        // drop a connection taken for an earlier command: then routed again (nothing sent yet).
        const quint64 dropped = m_cluster->dropped();
        byNode.clear();
        order.clear();
        for (qsizetype i = 0; i < commands.size(); ++i) {
            // A command without a key (TIME) goes where ClusterLinks::command sends one.
            const int slot = redis::commandSlot(commands.at(i));
            auto c = slot >= 0 ? m_cluster->link(slot) : m_cluster->current();
            if (!c)
                return makeError(c.error().code,
                                 u"Redis %1: %2"_qs.arg(m_url.display(), c.error().message));
            if (!byNode.contains(*c))
                order.append(*c);
            byNode[*c].append(i);
        }
        if (m_cluster->dropped() == dropped)
            break;
        if (pass > 0)
            return makeError(
                ErrorCode::Unavailable,
                u"Redis %1: cluster connections dropped while routing the commands"_qs.arg(
                    m_url.display()));
    }
    for (redisContext *c : std::as_const(order))
        for (qsizetype i : byNode.value(c)) {
            redis::Argv a(commands.at(i));
            redisAppendCommandArgv(c, a.count(), a.argv.data(), a.lengths.data());
        }
    for (redisContext *c : std::as_const(order)) {
        for (qsizetype i : byNode.value(c)) {
            void *raw = nullptr;
            if (redisGetReply(c, &raw) != REDIS_OK || !raw) {
                const Error error = failure(QString::fromUtf8(c->errstr), writes);
                m_cluster->broken(c); // the other nodes' answers are left unread with it: all dropped
                for (redisContext *other : std::as_const(order))
                    if (other != c)
                        m_cluster->broken(other);
                return error;
            }
            replies[size_t(i)].reset(static_cast<redisReply *>(raw));
        }
        m_cluster->answered(c);
        // Written to only if one of its commands may have run there (see ClusterLinks::command).
        const QList<qsizetype> sent = byNode.value(c);
        if (writes && std::any_of(sent.begin(), sent.end(), [&](qsizetype i) {
                return !redis::ranNothing(replies[size_t(i)].get());
            }))
            m_cluster->markWritten(c);
    }
    // A slot that moved (MOVED/ASK): the node did not run the command; it goes again, alone,
    // through the redirects.
    for (qsizetype i = 0; i < commands.size(); ++i) {
        const redisReply *r = replies[size_t(i)].get();
        if (r->type != REDIS_REPLY_ERROR || !redis::redirectFrom(QByteArrayView(r->str, qsizetype(r->len))))
            continue;
        m_cluster->markStale();
        auto again = m_cluster->command(commands.at(i), writes);
        if (!again)
            return makeError(again.error().code, u"Redis %1: %2"_qs.arg(m_url.display(), again.error().message));
        replies[size_t(i)] = std::move(*again);
    }
    return replies;
}

Result<RedisStore::Reply> RedisStore::script(const char *name, const QList<QByteArray> &args,
                                             bool writes)
{
    QList<QByteArray> call{"EVALSHA", m_sha.value(name)};
    call += args;
    auto r = command(call, writes);
    if (!r && r.error().code == ErrorCode::Unavailable &&
        r.error().message.contains(u"NOSCRIPT"_qs)) {
        // The server lost its script cache (restart, SCRIPT FLUSH): the script did not run.
        if (auto loaded = loadScripts(); !loaded)
            return loaded.error();
        call[1] = m_sha.value(name);
        return command(call, writes);
    }
    return r;
}

Result<void> RedisStore::waitForReplicas()
{
    if (m_url.waitReplicas <= 0)
        return {};
    if (m_cluster) {
        // Each master the writes went to; the least acknowledged count decides.
        long long least = m_url.waitReplicas;
        auto written = m_cluster->takeWritten();
        if (!written)
            return makeError(written.error().code,
                             u"Redis %1: %2"_qs.arg(m_url.display(), written.error().message));
        for (redisContext *c : std::as_const(*written)) {
            auto *raw = static_cast<redisReply *>(
                redisCommand(c, "WAIT %d %d", m_url.waitReplicas, m_url.waitTimeoutMs));
            if (!raw) {
                const Error error = failure(QString::fromUtf8(c->errstr), false);
                m_cluster->broken(c);
                return error;
            }
            Reply reply(raw, freeReplyObject);
            least = std::min(least, reply->type == REDIS_REPLY_INTEGER ? reply->integer : -1);
        }
        if (least < m_url.waitReplicas)
            return makeError(ErrorCode::Unavailable,
                             u"Redis %1: only %2 of %3 replicas acknowledged the write within %4 ms (wait_replicas)"_qs
                                 .arg(m_url.display())
                                 .arg(least)
                                 .arg(m_url.waitReplicas)
                                 .arg(m_url.waitTimeoutMs));
        return {};
    }
    auto r = command({"WAIT", num(m_url.waitReplicas), num(m_url.waitTimeoutMs)}, false);
    if (!r)
        return r.error();
    if (r->get()->type != REDIS_REPLY_INTEGER || r->get()->integer < m_url.waitReplicas)
        return makeError(
            ErrorCode::Unavailable,
            u"Redis %1: only %2 of %3 replicas acknowledged the write within %4 ms (wait_replicas)"_qs
                .arg(m_url.display())
                .arg(r->get()->integer)
                .arg(m_url.waitReplicas)
                .arg(m_url.waitTimeoutMs));
    return {};
}

Result<ClaimResult> RedisStore::claim(const ClaimRequest &req)
{
    MarkedWrites marked(m_cluster.get());
    auto r = script("claim", redis::claimArgs(m_layout, req), true);
    marked.stop();
    if (!r)
        return answerUnwritten(req, r.error());
    auto result = redis::claimResult(r->get(), req);
    if (!result)
        return result;
    if (auto waited = waitForReplicas(); !waited)
        return waited.error(); // refused: the claim may be lost in a failover, so nothing runs
    return result;
}

Result<FinishVerdict> RedisStore::finish(const FinishRequest &req)
{
    MarkedWrites marked(m_cluster.get());
    auto r = script("finish", redis::finishArgs(m_layout, req), true);
    marked.stop();
    if (!r)
        return r.error();
    auto verdict = redis::finishVerdict(r->get());
    if (!verdict)
        return verdict;
    if (auto waited = waitForReplicas(); !waited)
        return waited.error(); // retried by the engine: the same finish answers Repeated
    return verdict;
}

Result<RedisStore::ScriptAnswers> RedisStore::scriptsInTransaction(const char *name,
                                                                   const QList<QList<QByteArray>> &argsList)
{
    if (m_cluster) {
        // The records are in many slots: no MULTI/EXEC across them. Each script is atomic on its
        // own; a failure of any fails the batch (the engine answers 503 and runs nothing; a claim
        // that did go through is a lease nobody holds, taken again when it ends): in doubt.
        auto replies = scriptsPipelined(name, argsList, ErrorCode::InDoubt);
        if (!replies)
            return replies.error();
        ScriptAnswers answers;
        for (const Reply &r : *replies)
            answers.at.push_back(r.get());
        answers.held = std::move(*replies);
        return answers;
    }
    for (int round = 0; round < 2; ++round) {
        QList<QList<QByteArray>> commands{{"MULTI"}};
        for (const auto &args : argsList)
            commands.append(QList<QByteArray>{"EVALSHA", m_sha.value(name)} + args);
        commands.append({"EXEC"});
        auto replies = pipeline(commands, true);
        if (!replies)
            return replies.error();
        Reply exec = std::move(replies->back());
        if (exec->type != REDIS_REPLY_ARRAY || exec->elements != size_t(argsList.size()))
            return makeError(
                ErrorCode::Unavailable,
                u"Redis %1: the batch's transaction was refused"_qs.arg(m_url.display()));
        // The server lost its script cache: every EVALSHA of the batch failed, none ran.
        const redisReply *first = exec->elements ? exec->element[0] : nullptr;
        if (round == 0 && first && first->type == REDIS_REPLY_ERROR &&
            QByteArray(first->str).startsWith("NOSCRIPT")) {
            if (auto loaded = loadScripts(); !loaded)
                return loaded.error();
            continue;
        }
        for (size_t i = 0; i < exec->elements; ++i)
            if (exec->element[i]->type == REDIS_REPLY_ERROR)
                return makeError(ErrorCode::InDoubt,
                                 u"Redis %1: %2"_qs.arg(m_url.display(),
                                                        QString::fromUtf8(exec->element[i]->str)));
        ScriptAnswers answers;
        for (size_t i = 0; i < exec->elements; ++i)
            answers.at.push_back(exec->element[i]);
        answers.held.push_back(std::move(exec));
        return answers;
    }
    return makeError(ErrorCode::Unavailable,
                     u"Redis %1: the scripts could not be loaded"_qs.arg(m_url.display()));
}

Result<QList<ClaimResult>> RedisStore::claimBatch(const QList<ClaimRequest> &requests)
{
    QList<QList<QByteArray>> args;
    for (const ClaimRequest &req : requests)
        args.append(redis::claimArgs(m_layout, req, true));
    MarkedWrites marked(m_cluster.get());
    // The shared content before the claims that name it: not written, no claim.
    if (auto written = writeShared(sharedContentOf(requests)); !written)
        return answerUnwritten(requests, written.error());
    auto exec = scriptsInTransaction("claim", args);
    marked.stop();
    if (!exec) // a transaction Redis refused (EXECABORT): none of them ran
        return answerUnwritten(requests, exec.error());
    QList<ClaimResult> results;
    for (qsizetype i = 0; i < requests.size(); ++i) {
        auto result = redis::claimResult(exec->at[size_t(i)], requests.at(i));
        if (!result)
            return result.error();
        results.append(std::move(*result));
    }
    if (auto waited = waitForReplicas(); !waited)
        return waited.error();
    if (auto filled = fillReplayedFailures(
            results, [this](const QByteArray &ref) { return readShared(ref); });
        !filled)
        return filled.error();
    return results;
}

Result<void> RedisStore::writeShared(const QList<SharedContent> &shared)
{
    for (const SharedContent &c : shared)
        if (auto written = script("shared", redis::sharedArgs(m_layout, c), true); !written)
            return written.error();
    return {};
}

Result<QList<FinishVerdict>> RedisStore::finishBatch(const QList<FinishRequest> &requests)
{
    QList<QList<QByteArray>> args;
    for (const FinishRequest &req : requests)
        args.append(redis::finishArgs(m_layout, req, true));
    MarkedWrites marked(m_cluster.get());
    // The shared result before the finishes that name it: not written, none finished (the
    // engine retries while the lease lasts).
    if (auto written = writeShared(sharedContentOf(requests)); !written)
        return written.error();
    auto exec = scriptsInTransaction("finish", args);
    marked.stop();
    if (!exec)
        return exec.error();
    QList<FinishVerdict> verdicts;
    for (qsizetype i = 0; i < requests.size(); ++i) {
        auto verdict = redis::finishVerdict(exec->at[size_t(i)]);
        if (!verdict)
            return verdict.error();
        verdicts.append(*verdict);
    }
    if (auto waited = waitForReplicas(); !waited)
        return waited.error();
    return verdicts;
}

Result<qint64> RedisStore::clockMs()
{
    auto r = command({"TIME"}, false);
    if (!r)
        return r.error();
    return timeMs(r->get());
}

Result<qint64> RedisStore::timeMs(const redisReply *time) const
{
    if (time->type != REDIS_REPLY_ARRAY || time->elements != 2)
        return makeError(ErrorCode::Unavailable,
                         u"Redis %1: unexpected answer to TIME"_qs.arg(m_url.display()));
    return text(time->element[0]).toLongLong() * 1000 + text(time->element[1]).toLongLong() / 1000;
}

Result<QStringList> RedisStore::durabilityWarnings()
{
    QHash<QByteArray, QByteArray> config;
    for (const char *name : {"maxmemory-policy", "appendonly", "appendfsync", "save"}) {
        auto r = command({"CONFIG", "GET", name}, false);
        if (!r) {
            // A failed connection is an error; a refusal of CONFIG (ACL, a managed service) a warning.
            if (m_cluster ? !r.error().message.contains(u"config"_qs, Qt::CaseInsensitive) : m_context->err != 0)
                return r.error();
            return QStringList{
                u"Redis refused CONFIG GET (%1): whether it may evict or lose acknowledged records is unknown"_qs
                    .arg(r.error().message)};
        }
        const auto fields = fieldsFrom(r->get());
        config.insert(name, fields.value(name));
    }
    QStringList warnings;
    const QByteArray policy = config.value("maxmemory-policy");
    if (policy != "noeviction")
        warnings
            << u"Redis maxmemory-policy is %1: under memory pressure it may evict idempotency records (an evicted key is processed again) and the fencing-token floors of deleted keys; set maxmemory-policy noeviction"_qs
                   .arg(QString::fromUtf8(policy));
    if (config.value("appendonly") != "yes") {
        if (config.value("save").isEmpty())
            warnings
                << u"Redis persists nothing (appendonly no, no save points): a restart of Redis forgets every key (their duplicates are processed again) and the fencing-token floors of deleted keys"_qs;
        else
            warnings
                << u"Redis persists by snapshots only (save %1): a crash of Redis loses the records written since the last one; use appendonly yes with appendfsync always"_qs
                       .arg(QString::fromUtf8(config.value("save")));
    } else if (config.value("appendfsync") != "always") {
        warnings
            << u"Redis appendfsync is %1: a crash of Redis may lose about a second of acknowledged records; use appendfsync always"_qs
                   .arg(QString::fromUtf8(config.value("appendfsync")));
    }
    return warnings;
}

Result<std::optional<KeyRecord>> RedisStore::key(const QString &key)
{
    // The store's clock with the record, in one round trip (export reads every key this way).
    auto read = pipeline({{"TIME"}, {"HGETALL", m_layout.record(key)}}, false);
    if (!read)
        return read.error();
    auto now = timeMs((*read)[0].get());
    if (!now)
        return now.error();
    const redisReply *record = (*read)[1].get();
    if (record->type == REDIS_REPLY_ERROR)
        return makeError(ErrorCode::Unavailable,
                         u"Redis %1: %2"_qs.arg(m_url.display(), QString::fromUtf8(text(record))));
    if (record->type != REDIS_REPLY_ARRAY)
        return makeError(ErrorCode::Unavailable,
                         u"Redis %1: unexpected answer to HGETALL"_qs.arg(m_url.display()));
    const auto fields = fieldsFrom(record);
    if (!fields.contains("m"))
        return std::optional<KeyRecord>();
    QHash<QByteArray, QByteArray> meta;
    if (!redis::metaFrom(fields.value("m"), meta))
        return makeError(ErrorCode::Unavailable,
                         u"Redis %1: the record of %2 is unreadable (its meta line)"_qs.arg(
                             m_url.display(), key));
    if (meta.value("expires_at").toLongLong() <= *now)
        return std::optional<KeyRecord>(); // a tombstone (expired, deleted)
    KeyRecord found = redis::recordFrom(key, fields);
    if (auto resolved =
            resolveShared(found, [this](const QByteArray &ref) { return readShared(ref); });
        !resolved)
        return resolved.error();
    return std::optional<KeyRecord>(std::move(found));
}

Result<std::optional<QByteArray>> RedisStore::readShared(const QByteArray &ref)
{
    auto r = command({"GET", redis::sharedKey(m_layout.prefix(), ref)}, false);
    if (!r)
        return r.error();
    if ((*r)->type != REDIS_REPLY_STRING)
        return std::optional<QByteArray>();
    return std::optional<QByteArray>(text(r->get()));
}

Result<QStringList> RedisStore::endpoints()
{
    QList<QList<QByteArray>> reads;
    for (int b = 0; b < m_layout.buckets(); ++b)
        reads.append({"SMEMBERS", m_layout.endpoints(b)});
    auto r = pipeline(reads, false);
    if (!r)
        return r.error();
    QSet<QString> names;
    for (const Reply &members : *r) {
        if (members->type != REDIS_REPLY_ARRAY)
            return makeError(ErrorCode::Unavailable,
                             u"Redis %1: unexpected answer to SMEMBERS: %2"_qs.arg(
                                 m_url.display(), QString::fromUtf8(text(members.get()))));
        for (size_t i = 0; i < members->elements; ++i)
            names.insert(QString::fromUtf8(text(members->element[i])));
    }
    QStringList sorted(names.begin(), names.end());
    sorted.sort();
    return sorted;
}

Result<RedisStore::Scope> RedisStore::scope(const QString &endpoint)
{
    auto now = clockMs();
    if (!now)
        return now.error();
    if (!endpoint.isEmpty())
        return Scope{*now, {endpoint}};
    auto all = endpoints();
    if (!all)
        return all.error();
    return Scope{*now, *all};
}

Result<qint64> RedisStore::purgeSlice(qint64 now, const QStringList &names, qint64 limit)
{
    // The entries of each bucket's k past their expiry (its score), at most `limit` per bucket
    // and endpoint; tombstone.lua decides on them atomically with their entries (a key claimed
    // again since carries its new expiry and is left alone).
    struct Due
    {
        int bucket;
        QString endpoint;
    };
    QList<Due> dues;
    QList<QList<QByteArray>> ranges;
    for (const QString &endpoint : names)
        for (int b = 0; b < m_layout.buckets(); ++b) {
            dues.append({b, endpoint});
            ranges.append({"ZRANGEBYSCORE", m_layout.keys(b, endpoint), "-inf", num(now), "LIMIT",
                           "0", num(limit)});
        }
    if (ranges.isEmpty())
        return 0;
    auto due = pipeline(ranges, false);
    if (!due)
        return due.error();
    QList<QList<QByteArray>> args;
    for (qsizetype i = 0; i < dues.size(); ++i) {
        const redisReply *members = (*due)[size_t(i)].get();
        if (members->type != REDIS_REPLY_ARRAY)
            return makeError(ErrorCode::Unavailable,
                             u"Redis %1: unexpected answer to ZRANGEBYSCORE: %2"_qs.arg(
                                 m_url.display(), QString::fromUtf8(text(members))));
        if (members->elements == 0)
            continue;
        // At most kTombstoneRun keys per script: Redis runs nothing else while one runs.
        for (size_t first = 0; first < members->elements; first += kTombstoneRun) {
            QList<QByteArray> keys = m_layout.indexes(dues.at(i).bucket, dues.at(i).endpoint),
                              names;
            for (size_t m = first; m < std::min(members->elements, first + kTombstoneRun); ++m) {
                const QByteArray key = text(members->element[m]);
                keys << m_layout.record(QString::fromUtf8(key));
                names << key;
            }
            args.append(QList<QByteArray>{num(keys.size())} + keys + names);
        }
    }
    if (args.isEmpty())
        return 0;
    auto removed = scriptsPipelined("tombstone", args);
    if (!removed)
        return removed.error();
    qint64 total = 0;
    for (const Reply &r : *removed)
        total += r->type == REDIS_REPLY_INTEGER ? r->integer : 0;
    return total;
}

Result<std::vector<RedisStore::Reply>>
RedisStore::scriptsPipelined(const char *name, const QList<QList<QByteArray>> &argsList,
                             ErrorCode onError)
{
    // Many runs of one script in one write; a master that lost its script cache runs it again
    // with it loaded (NOSCRIPT: it did not run). An error answer fails the whole (onError).
    QList<QList<QByteArray>> commands;
    for (const auto &args : argsList)
        commands.append(QList<QByteArray>{"EVALSHA", m_sha.value(name)} + args);
    auto replies = pipeline(commands, true);
    if (!replies)
        return replies.error();
    for (qsizetype i = 0; i < argsList.size(); ++i) {
        Reply &r = (*replies)[size_t(i)];
        if (r->type == REDIS_REPLY_ERROR &&
            QByteArray(r->str, qsizetype(r->len)).startsWith("NOSCRIPT")) {
            auto again = script(name, argsList.at(i), true);
            if (!again)
                return again.error();
            r = std::move(*again);
        }
        if (r->type == REDIS_REPLY_ERROR)
            return makeError(
                onError, u"Redis %1: %2.lua: %3"_qs.arg(m_url.display(), QLatin1String(name),
                                                        QString::fromUtf8(r->str, int(r->len))));
    }
    return replies;
}

Result<QPair<QByteArray, QList<QByteArray>>>
RedisStore::scanStep(redisContext *node, const QByteArray &cursor, const QByteArray &match)
{
    if (node->err)
        return failure(u"connection lost: %1"_qs.arg(QString::fromUtf8(node->errstr)), false);
    redis::Argv a({"SCAN", cursor, "MATCH", match, "COUNT", "1000"});
    auto *raw = static_cast<redisReply *>(
        redisCommandArgv(node, a.count(), a.argv.data(), a.lengths.data()));
    if (!raw) {
        const Error error = failure(QString::fromUtf8(node->errstr), false);
        if (m_cluster)
            m_cluster->broken(node);
        return error;
    }
    Reply answer(raw, freeReplyObject);
    if (answer->type != REDIS_REPLY_ARRAY || answer->elements != 2 ||
        answer->element[0]->type != REDIS_REPLY_STRING ||
        answer->element[1]->type != REDIS_REPLY_ARRAY)
        return makeError(ErrorCode::Unavailable,
                         u"Redis %1: unexpected answer to SCAN"_qs.arg(m_url.display()));
    QList<QByteArray> names;
    for (size_t i = 0; i < answer->element[1]->elements; ++i)
        names << text(answer->element[1]->element[i]);
    return QPair<QByteArray, QList<QByteArray>>{text(answer->element[0]), names};
}

Result<QStringList> RedisStore::keyNames(const KeyQuery &q)
{
    // The records themselves, every master's, not the indexes: an export must hold every live
    // record, and an index entry lost (an index evicted under an allkeys-* policy, a key written
    // by hand) would lose one without a word. SCAN returns each key present for the whole scan
    // at least once (duplicates dropped here). Tombstones and expired records are named too: the
    // caller reads each record and checks it. Any failure fails the whole: a partial list is
    // never an answer.
    const QRegularExpression glob = keyGlob(q.glob);
    const QByteArray match = globEscaped(m_prefix) + "{b*}:r:" +
                             (q.endpoint.isEmpty() ? QByteArray()
                                                   : globEscaped(q.endpoint.toUtf8()) + ':') +
                             '*';
    QSet<QString> seen;
    QStringList names;
    auto scanned = scanAll(match, [&](const QList<QByteArray> &found) -> Result<void> {
        for (const QByteArray &name : found) {
            const qsizetype at = name.indexOf("}:r:", m_prefix.size());
            if (at < 0)
                continue;
            const QString key = QString::fromUtf8(name.mid(at + 4));
            // Only a record of this layout's buckets: the name its key would be written under.
            if (m_layout.record(key) != name || seen.contains(key))
                continue;
            if (!glob.pattern().isEmpty() && !glob.match(key).hasMatch())
                continue;
            seen.insert(key);
            names << key;
        }
        return {};
    });
    if (!scanned)
        return scanned.error();
    names.sort();
    return names;
}

Result<QList<KeyRecord>> RedisStore::listKeys(const KeyQuery &q)
{
    auto scope = this->scope(q.endpoint);
    if (!scope)
        return scope.error();
    const qint64 now = scope->now;
    // The keys newest first (by expiry: a key's expiry is its last claim's time plus its TTL),
    // merged across the endpoints asked for and their buckets: from k (no state asked, or
    // completed, which has no index of its own), from s:<state> (processing, failed, reset);
    // only entries scored above now (the expired ones are the purge's). The indexes are written
    // with the records, so each entry is a record; its state is read again with it, and one
    // that changed between the two reads is left out.
    struct Source
    {
        QByteArray index;
        bool byState = false; // an s:<state> index: its keys are in the state asked
        qint64 next = 0;      // the rank of the next entry to read
        QList<QPair<qint64, QByteArray>> entries;
        bool done = false;
    };
    QList<Source> sources;
    for (const QString &endpoint : std::as_const(scope->endpoints))
        for (int b = 0; b < m_layout.buckets(); ++b) {
            if (q.state && *q.state != KeyState::Completed)
                sources.append({m_layout.stateIndex(b, endpoint, *q.state), true});
            else
                sources.append({m_layout.keys(b, endpoint)});
        }
    const QRegularExpression glob = keyGlob(q.glob);
    // Enough of each source that the merge seldom reads one again; at least a few entries each
    // when there are many (the buckets of a cluster).
    const qint64 chunk = std::clamp<qint64>(
        (qint64(q.offset) + q.limit) / std::max<qsizetype>(sources.size(), 1) * 2 + 8, 16, 1000);

    QList<KeyRecord> records;
    qint64 skipped = 0;
    // The index is read a chunk at a time by rank, and new keys push older ones down meanwhile:
    // a key met again in the next chunk is listed once (a long listing repeated some).
    QSet<QString> met;
    while (records.size() < q.limit) {
        // Refill what ran dry, in one round trip.
        QList<QList<QByteArray>> reads;
        QList<Source *> reading;
        for (Source &s : sources)
            if (s.entries.isEmpty() && !s.done) {
                reads.append({"ZREVRANGEBYSCORE", s.index, "+inf", "(" + num(now), "WITHSCORES",
                              "LIMIT", num(s.next), num(chunk)});
                reading << &s;
                s.next += chunk;
            }
        if (!reads.isEmpty()) {
            auto ranges = pipeline(reads, false);
            if (!ranges)
                return ranges.error();
            for (qsizetype i = 0; i < reading.size(); ++i) {
                const redisReply *array = (*ranges)[size_t(i)].get();
                if (array->type != REDIS_REPLY_ARRAY)
                    return makeError(ErrorCode::Unavailable,
                                     u"Redis %1: unexpected answer to ZREVRANGEBYSCORE: %2"_qs.arg(
                                         m_url.display(), QString::fromUtf8(text(array))));
                for (size_t e = 0; e + 1 < array->elements; e += 2)
                    reading[i]->entries.append(
                        {text(array->element[e + 1]).toLongLong(), text(array->element[e])});
                reading[i]->done = qint64(array->elements / 2) < chunk;
            }
        }
        // The next candidates, newest first, up to what is still needed.
        struct Candidate
        {
            QString key;
            const Source *source;
        };
        QList<Candidate> candidates;
        const qint64 wanted = q.limit - records.size() + (q.offset - skipped);
        while (qint64(candidates.size()) < std::max<qint64>(wanted, 1)) {
            Source *best = nullptr;
            for (Source &s : sources)
                if (!s.entries.isEmpty() &&
                    (!best || s.entries.first().first > best->entries.first().first))
                    best = &s;
            if (!best)
                break;
            const QString key = QString::fromUtf8(best->entries.takeFirst().second);
            const bool refill = best->entries.isEmpty() && !best->done;
            if ((glob.pattern().isEmpty() || glob.match(key).hasMatch()) && !met.contains(key)) {
                met.insert(key);
                candidates.append({key, best});
            }
            if (refill)
                break; // that source must be read further before anything older is taken
        }
        if (candidates.isEmpty()) {
            if (std::all_of(sources.begin(), sources.end(),
                            [](const Source &s) { return s.done && s.entries.isEmpty(); }))
                break;
            continue;
        }
        QList<QList<QByteArray>> hmgets;
        for (const Candidate &c : std::as_const(candidates))
            hmgets.append({"HMGET", m_layout.record(c.key), "m", "e", "t"});
        auto replies = pipeline(hmgets, false);
        if (!replies)
            return replies.error();
        for (qsizetype i = 0; i < candidates.size(); ++i) {
            const QString &key = candidates.at(i).key;
            const redisReply *reply = (*replies)[size_t(i)].get();
            if (reply->type != REDIS_REPLY_ARRAY)
                return makeError(ErrorCode::Unavailable,
                                 u"Redis %1: unexpected answer to HMGET: %2"_qs.arg(
                                     m_url.display(), QString::fromUtf8(text(reply))));
            QHash<QByteArray, QByteArray> fields;
            static const QByteArray kRead[] = {"m", "e", "t"};
            for (size_t f = 0; f < reply->elements && f < std::size(kRead); ++f)
                if (reply->element[f]->type == REDIS_REPLY_STRING)
                    fields.insert(kRead[f], text(reply->element[f]));
            QHash<QByteArray, QByteArray> meta;
            if (!fields.contains("m") || !redis::metaFrom(fields.value("m"), meta))
                continue; // gone (evicted), or unreadable (every script refuses it)
            const auto state = keyStateFromString(QString::fromLatin1(meta.value("state")));
            if (!state || meta.value("expires_at").toLongLong() <= now)
                continue; // a tombstone, or expired since the index was read
            if (q.state && *state != *q.state)
                continue; // another state's key: k read for completed, or moved meanwhile
            if (!q.type.isEmpty() && fields.value("t") != q.type.toUtf8())
                continue;
            if (skipped < q.offset) {
                ++skipped;
                continue;
            }
            if (records.size() < q.limit)
                records.append(redis::recordFrom(key, fields));
        }
    }
    return records;
}

Result<KeyPage> RedisStore::findKeys(const KeyQuery &q)
{
    std::optional<ListPosition> from;
    if (!q.after.isEmpty() && !(from = ListPosition::parse(q.after)))
        return badListPosition(q.after);
    auto scope = this->scope(q.endpoint);
    if (!scope)
        return scope.error();
    const qint64 now = scope->now;
    // The index entries newest first, as listKeys() merges them, but in one total order, the
    // expiry then the key, both descending, so that a page can say where it stopped and the
    // next go on from there (ListPosition: the last entry looked at). Records are read a round
    // of candidates at a time (HMGET, pipelined; with the request when searching) until the
    // page is full, the budget spent, or the indexes at their end.
    // Each index is read on from the score it stopped at, past the entries of that score it
    // read already: a rank (LIMIT offset) costs Redis the entries it skips, and reading a
    // million by rank took minutes where this takes seconds (docs/stores.md#search).
    struct Source
    {
        QByteArray index;
        bool started = false;
        qint64 lastScore = 0;   // the score of the last entry read
        qint64 atLastScore = 0; // how many entries of that score were read
        QList<QPair<qint64, QByteArray>> entries;
        bool done = false;
    };
    QList<Source> sources;
    for (const QString &endpoint : std::as_const(scope->endpoints))
        for (int b = 0; b < m_layout.buckets(); ++b)
            sources.append({q.state && *q.state != KeyState::Completed
                                ? m_layout.stateIndex(b, endpoint, *q.state)
                                : m_layout.keys(b, endpoint)});
    const QRegularExpression glob = keyGlob(q.glob);
    const bool searching = !q.search.isEmpty();
    const QByteArray needle = searchNeedle(q.search), type = q.type.toUtf8();
    const QByteArray top = from ? num(from->at) : QByteArray("+inf");
    const QByteArray fromKey = from ? from->key.toUtf8() : QByteArray();
    constexpr qint64 kChunk = 256; // entries of one index read at a time
    constexpr int kRound = 256;    // records read in one round trip
    const auto before = [](const QPair<qint64, QByteArray> &a, const QPair<qint64, QByteArray> &b) {
        return a.first != b.first ? a.first > b.first : a.second > b.second;
    };
    QElapsedTimer spent;
    spent.start();
    KeyPage page;
    QSet<QByteArray> met;
    for (;;) {
        QList<QList<QByteArray>> reads;
        QList<Source *> reading;
        for (Source &s : sources)
            if (s.entries.isEmpty() && !s.done) {
                reads.append({"ZREVRANGEBYSCORE", s.index, s.started ? num(s.lastScore) : top,
                              "(" + num(now), "WITHSCORES", "LIMIT",
                              num(s.started ? s.atLastScore : 0), num(kChunk)});
                reading << &s;
            }
        if (!reads.isEmpty()) {
            auto ranges = pipeline(reads, false);
            if (!ranges)
                return ranges.error();
            for (qsizetype i = 0; i < reading.size(); ++i) {
                const redisReply *array = (*ranges)[size_t(i)].get();
                if (array->type != REDIS_REPLY_ARRAY)
                    return makeError(ErrorCode::Unavailable,
                                     u"Redis %1: unexpected answer to ZREVRANGEBYSCORE: %2"_qs.arg(
                                         m_url.display(), QString::fromUtf8(text(array))));
                // Equal scores come in reverse order of the key: the total order, by rank.
                for (size_t e = 0; e + 1 < array->elements; e += 2) {
                    const QPair<qint64, QByteArray> entry{text(array->element[e + 1]).toLongLong(),
                                                          text(array->element[e])};
                    Source &source = *reading[i];
                    if (source.started && entry.first == source.lastScore) {
                        ++source.atLastScore;
                    } else {
                        source.started = true;
                        source.lastScore = entry.first;
                        source.atLastScore = 1;
                    }
                    // At the position's expiry, the keys it had passed already (read again
                    // because a range by score starts at a score, not a key).
                    if (!from || entry.first < from->at || entry.second < fromKey)
                        reading[i]->entries.append(entry);
                }
                reading[i]->done = qint64(array->elements / 2) < kChunk;
            }
        }
        // The next round of candidates in the total order, up to an index that must be read
        // further before anything older is taken.
        QList<QPair<qint64, QByteArray>> round;
        while (round.size() < kRound) {
            Source *best = nullptr;
            for (Source &s : sources)
                if (!s.entries.isEmpty() &&
                    (!best || before(s.entries.first(), best->entries.first())))
                    best = &s;
            if (!best)
                break;
            const auto entry = best->entries.takeFirst();
            // New keys push older ones down the index while it is read by rank: one met again
            // is looked at once.
            if (!met.contains(entry.second)) {
                met.insert(entry.second);
                round.append(entry);
            }
            if (best->entries.isEmpty() && !best->done)
                break;
        }
        if (round.isEmpty()) {
            if (std::all_of(sources.begin(), sources.end(),
                            [](const Source &s) { return s.done && s.entries.isEmpty(); }))
                return page; // nothing older: no next page
            continue;
        }
        QList<QList<QByteArray>> hmgets;
        for (const auto &entry : std::as_const(round)) {
            QList<QByteArray> hmget{"HMGET", m_layout.record(QString::fromUtf8(entry.second)), "m",
                                    "e", "t"};
            if (searching)
                hmget << "q";
            hmgets.append(hmget);
        }
        auto replies = pipeline(hmgets, false);
        if (!replies)
            return replies.error();
        for (qsizetype i = 0; i < round.size(); ++i) {
            const QString key = QString::fromUtf8(round.at(i).second);
            const redisReply *reply = (*replies)[size_t(i)].get();
            if (reply->type != REDIS_REPLY_ARRAY)
                return makeError(ErrorCode::Unavailable,
                                 u"Redis %1: unexpected answer to HMGET: %2"_qs.arg(
                                     m_url.display(), QString::fromUtf8(text(reply))));
            ++page.scanned;
            QHash<QByteArray, QByteArray> fields;
            static const QByteArray kRead[] = {"m", "e", "t", "q"};
            for (size_t f = 0; f < reply->elements && f < std::size(kRead); ++f)
                if (reply->element[f]->type == REDIS_REPLY_STRING)
                    fields.insert(kRead[f], text(reply->element[f]));
            QHash<QByteArray, QByteArray> meta;
            const bool live = fields.contains("m") && redis::metaFrom(fields.value("m"), meta) &&
                              meta.value("expires_at").toLongLong() > now;
            const auto state = keyStateFromString(QString::fromLatin1(meta.value("state")));
            const bool matches =
                live && state && (!q.state || *state == *q.state) &&
                (glob.pattern().isEmpty() || glob.match(key).hasMatch()) &&
                (type.isEmpty() || fields.value("t") == type) &&
                (!searching || bodyContains(redis::requestBody(fields.value("q")), needle));
            if (matches) {
                fields.remove("q"); // the listing's record has no request (as listKeys())
                page.records.append(redis::recordFrom(key, fields));
            }
            if (page.records.size() == q.limit) {
                page.next = ListPosition{round.at(i).first, key}.text();
                return page;
            }
        }
        if (q.budgetMs > 0 && spent.elapsed() >= q.budgetMs) {
            page.next =
                ListPosition{round.last().first, QString::fromUtf8(round.last().second)}.text();
            return page;
        }
    }
}

Result<StateCounts> RedisStore::countKeys(const QString &endpoint)
{
    auto scope = this->scope(endpoint);
    if (!scope)
        return scope.error();
    const QStringList &endpointNames = scope->endpoints;
    // Every index is scored by expiry: ZCOUNT above now counts the live keys alone. Completed
    // has no index of its own: it is every live key of k but those of the other states.
    constexpr KeyState kCounted[] = {KeyState::Processing, KeyState::Failed, KeyState::Reset};
    QList<QList<QByteArray>> cards;
    for (const QString &name : std::as_const(endpointNames))
        for (int b = 0; b < m_layout.buckets(); ++b) {
            cards.append({"ZCOUNT", m_layout.keys(b, name), "(" + num(scope->now), "+inf"});
            for (KeyState s : kCounted)
                cards.append(
                    {"ZCOUNT", m_layout.stateIndex(b, name, s), "(" + num(scope->now), "+inf"});
        }
    StateCounts counts;
    if (cards.isEmpty())
        return counts;
    auto r = pipeline(cards, false);
    if (!r)
        return r.error();
    for (const Reply &reply : *r)
        if (reply->type != REDIS_REPLY_INTEGER)
            return makeError(ErrorCode::Unavailable,
                             u"Redis %1: unexpected answer to ZCOUNT: %2"_qs.arg(
                                 m_url.display(), QString::fromUtf8(text(reply.get()))));
    for (size_t at = 0; at + 3 < r->size(); at += 4) {
        const qint64 processing = (*r)[at + 1]->integer, failed = (*r)[at + 2]->integer,
                     reset = (*r)[at + 3]->integer;
        counts.processing += processing;
        counts.failed += failed;
        counts.reset += reset;
        counts.completed += std::max<qint64>(0, (*r)[at]->integer - processing - failed - reset);
    }
    return counts;
}

Result<OperatorVerdict> RedisStore::applyOperator(const QString &key, OperatorAction action,
                                                  bool force, const QString &detail)
{
    auto r = script("operator", redis::operatorArgs(m_layout, key, action, force, detail), true);
    if (!r)
        return r.error();
    return redis::operatorVerdict(r->get());
}

Result<ImportVerdict> RedisStore::importRecord(const KeyRecord &r, qint64 ttlMs, qint64 leaseMs)
{
    auto reply = script("import", redis::importArgs(m_layout, r, ttlMs, leaseMs), true);
    if (!reply)
        return reply.error();
    return redis::importVerdict(reply->get());
}

Result<QString> RedisStore::serverVersion()
{
    auto reply = command({"INFO", "server"}, false);
    if (!reply)
        return reply.error();
    for (const QByteArray &line : text(reply->get()).split('\n'))
        if (line.startsWith("redis_version:"))
            return u"Redis "_qs + QString::fromLatin1(line.mid(14).trimmed());
    return u"Redis (version not reported)"_qs;
}

Result<qint64> RedisStore::purgeExpired()
{
    auto names = endpoints();
    if (!names)
        return names.error();
    if (auto swept = sweepStateIndexes(*names); !swept)
        return swept.error();
    qint64 total = 0;
    for (;;) {
        auto now = clockMs();
        if (!now)
            return now.error();
        auto n = purgeSlice(*now, *names, kPurgeSlice);
        if (!n)
            return n.error();
        total += *n;
        if (*n < kPurgeSlice)
            break;
    }
    return total;
}

Result<void> RedisStore::sweepStateIndexes(const QStringList &names)
{
    // A state index entry is read only while its score (the key's expiry) is ahead of the
    // clock, so one behind it can go at any time. Most leave with their record's purge; these
    // are the ones a record took with it when Redis expired or evicted it before a purge ran
    // (claimed again, the key's entries in k and processing were rewritten, not this one).
    auto now = clockMs();
    if (!now)
        return now.error();
    constexpr KeyState kIndexed[] = {KeyState::Processing, KeyState::Failed, KeyState::Reset};
    QList<QList<QByteArray>> sweeps;
    for (const QString &endpoint : names)
        for (int b = 0; b < m_layout.buckets(); ++b)
            for (KeyState s : kIndexed)
                sweeps.append({"ZREMRANGEBYSCORE", m_layout.stateIndex(b, endpoint, s), "-inf",
                               "(" + num(*now)});
    if (sweeps.isEmpty())
        return {};
    auto r = pipeline(sweeps, true);
    if (!r)
        return r.error();
    for (const Reply &reply : *r)
        if (reply->type != REDIS_REPLY_INTEGER)
            return makeError(ErrorCode::Unavailable,
                             u"Redis %1: unexpected answer to ZREMRANGEBYSCORE: %2"_qs.arg(
                                 m_url.display(), QString::fromUtf8(text(reply.get()))));
    return {};
}

Result<qint64> RedisStore::migrateLayout(bool confirmed)
{
    auto layout = command({"GET", m_layout.layoutKey()}, false);
    if (!layout)
        return layout.error();
    if (text(layout->get()).toLongLong() >= redis::kLayoutVersion)
        return 0; // done (or newer: ready() says so)
    // One desk migrates; the others wait for "P layout" as long as it holds the lock (it renews
    // it as it goes), and take over if it went away without finishing. On an empty store it is
    // done in a few round trips, so a fleet started together all starts.
    const QByteArray lock = m_layout.migratingKey();
    const QByteArray mine = QByteArray::number(QRandomGenerator::system()->generate64(), 16) +
                            QByteArray::number(QRandomGenerator::system()->generate64(), 16);
    for (;;) {
        auto locked = command({"SET", lock, mine, "NX", "PX", num(kMigrationLockMs)}, true);
        if (!locked)
            return locked.error();
        if ((*locked)->type != REDIS_REPLY_NIL)
            break;
        QThread::msleep(100);
        auto now = command({"GET", m_layout.layoutKey()}, false);
        if (!now)
            return now.error();
        if (text(now->get()).toLongLong() >= redis::kLayoutVersion)
            return 0; // the other desk finished
    }
    m_migrationLock = mine;
    auto unlock = qScopeGuard([&] {
        (void)script("lock", {"1", lock, mine, "0"}, true);
        m_migrationLock.clear();
    });
    if (auto again = command({"GET", m_layout.layoutKey()}, false); !again)
        return again.error();
    else if (text(again->get()).toLongLong() >= redis::kLayoutVersion)
        return 0; // the other desk finished just before
    auto v1 = migrateV1();
    if (!v1)
        return v1.error();
    auto moved = migrateV3(confirmed || *v1 > 0);
    if (!moved)
        return moved.error();
    // Last, so that a migration cut short is found and finished by the next one.
    if (auto held = renewMigrationLock(); !held)
        return held.error();
    if (auto buckets = command({"SET", m_layout.bucketsKey(), num(m_layout.buckets())}, true);
        !buckets)
        return buckets.error();
    if (auto done = command({"SET", m_layout.layoutKey(), num(redis::kLayoutVersion)}, true); !done)
        return done.error();
    return std::max(*v1, *moved); // a v1 record is migrated twice (v1 to v2, then on), counted once
}

Result<void> RedisStore::renewMigrationLock()
{
    auto held = script("lock", {"1", m_layout.migratingKey(), m_migrationLock, num(kMigrationLockMs)},
                       true);
    if (!held)
        return held.error();
    if ((*held)->type != REDIS_REPLY_INTEGER || (*held)->integer != 1)
        return makeError(ErrorCode::Conflict,
                         u"Redis %1: another desk took over the migration (this one held its "
                         u"lock past %2 s without renewing it): stopped; run idemdesk migrate "
                         u"again if that desk does not finish"_qs.arg(m_url.display())
                             .arg(kMigrationLockMs / 1000));
    return {};
}

Result<void> RedisStore::refuseIfWritten(bool confirmed, const QString &what)
{
    if (confirmed)
        return {};
    // A desk of the previous version writing now would take every migrated key for a new one
    // and process it again: refused while the delivery log is moving.
    auto newest = command({"XREVRANGE", m_layout.logKey(), "+", "-", "COUNT", "1"}, false);
    if (!newest)
        return newest.error();
    auto now = clockMs();
    if (!now)
        return now.error();
    const redisReply *entries = newest->get();
    if (entries->type != REDIS_REPLY_ARRAY || entries->elements != 1 ||
        entries->element[0]->type != REDIS_REPLY_ARRAY || entries->element[0]->elements != 2)
        return {};
    // The entry's ID is Redis's clock when it was written (the "at" field, the desk's).
    const auto f = fieldsFrom(entries->element[0]->element[1]);
    const qint64 ago =
        *now - text(entries->element[0]->element[0]).split('-').value(0).toLongLong();
    if (ago >= 120'000)
        return {};
    return makeError(ErrorCode::Conflict,
                     u"Redis %1 holds %2 and a delivery was logged %3 s ago (instance %4): stop "
                     u"every desk of the previous version, then run idemdesk migrate"_qs.arg(
                         m_url.display(), what, QString::number(std::max<qint64>(0, ago) / 1000),
                         escapeControls(QString::fromUtf8(f.value("i")).left(100))));
}

Result<void> RedisStore::scanAll(const QByteArray &match,
                                 const std::function<Result<void>(const QList<QByteArray> &)> &each)
{
    // Every key of the pattern, a thousand at a time: on a cluster, of every master (the slot
    // map read again).
    QList<redis::ClusterNode> masters{redis::ClusterNode()}; // the single Redis
    if (m_cluster) {
        if (auto r = m_cluster->refresh(); !r)
            return makeError(r.error().code,
                             u"Redis %1: %2"_qs.arg(m_url.display(), r.error().message));
        masters = m_cluster->map().masters();
    }
    for (const redis::ClusterNode &master : std::as_const(masters)) {
        QByteArray cursor = "0";
        do {
            // The master's connection is asked for on each page: `each` routes commands of its
            // own, and a map read or a dropped link there frees connections (one held across it
            // was used after it was freed).
            redisContext *node = m_context;
            if (m_cluster) {
                auto c = m_cluster->linkTo(master);
                if (!c)
                    return makeError(c.error().code,
                                     u"Redis %1: %2"_qs.arg(m_url.display(), c.error().message));
                node = *c;
            }
            auto page = scanStep(node, cursor, match);
            if (!page)
                return page.error();
            if (!m_migrationLock.isEmpty())
                if (auto held = renewMigrationLock(); !held)
                    return held.error();
            cursor = page->first;
            if (!page->second.isEmpty())
                if (auto done = each(page->second); !done)
                    return done.error();
        } while (cursor != "0");
    }
    return {};
}

Result<qint64> RedisStore::migrateV3(bool confirmed)
{
    // Every record of layout v3 (P{<key>}:r) or v2 (the same key holding a field per column, or
    // only its token counter P{<key>}:t), page by page: first made v3 in place (v3/migrate3.lua,
    // which only answers on a v3 record), then written into its bucket with its index entries
    // (migrate4.lua), then deleted unless it changed meanwhile (v3/drop.lua: a desk of the
    // previous version still writing; tried again, then refused).
    bool checked = false;
    qint64 moved = 0;
    auto records = scanAll(
        globEscaped(m_prefix) + "{*}:[rt]", [&](const QList<QByteArray> &names) -> Result<void> {
            QStringList keys;
            QSet<QString> seen;
            for (const QByteArray &name : names) {
                // A token counter is read as its record's name; a key's :r and :t once.
                const QString key = redis::keyOfV3Record(
                    m_prefix, name.endsWith("}:t") ? name.chopped(1) + 'r' : name);
                if (!key.isEmpty() && !seen.contains(key)) {
                    seen.insert(key);
                    keys << key;
                }
            }
            if (keys.isEmpty())
                return {};
            if (!checked) {
                if (auto refused = refuseIfWritten(confirmed, u"records of an earlier layout"_qs);
                    !refused)
                    return refused.error();
                checked = true;
            }
            QStringList left = keys;
            for (int pass = 0; pass < 3 && !left.isEmpty(); ++pass) {
                auto done = moveV3(left);
                if (!done)
                    return done.error();
                moved += done->moved;
                left = done->changed;
            }
            if (!left.isEmpty())
                return makeError(
                    ErrorCode::Conflict,
                    u"Redis %1: the record of %2 kept changing while it was moved to "
                    u"layout v%3: stop every desk of the previous version, then run "
                    u"idemdesk migrate"_qs.arg(m_url.display(), escapeControls(left.first()))
                        .arg(redis::kLayoutVersion));
            return {};
        });
    if (!records)
        return records.error();
    // The old layouts' indexes (v3: i:k:*, i:es:*, i:eps; v2: i:s:*, i:exp): all under "P i:".
    auto indexes =
        scanAll(globEscaped(m_prefix) + "i:*", [&](const QList<QByteArray> &names) -> Result<void> {
            QList<QList<QByteArray>> commands;
            for (const QByteArray &name : names)
                commands.append({"DEL", name});
            if (auto done = pipeline(commands, true); !done)
                return done.error();
            return {};
        });
    if (!indexes)
        return indexes.error();
    return moved;
}

Result<RedisStore::Moved> RedisStore::moveV3(const QStringList &keys)
{
    // Made v3 first (a v2 record, a v2 counter alone); then each read with its key's expiry.
    QList<QList<QByteArray>> converts;
    for (const QString &key : keys)
        converts.append({"2", redis::v3RecordKey(m_prefix, key), redis::tokenKey(m_prefix, key)});
    if (auto converted = scriptsPipelined("v3/migrate3", converts); !converted)
        return converted.error();
    QList<QList<QByteArray>> reads;
    for (const QString &key : keys) {
        reads.append({"HGETALL", redis::v3RecordKey(m_prefix, key)});
        reads.append({"PEXPIRETIME", redis::v3RecordKey(m_prefix, key)});
    }
    auto read = pipeline(reads, false);
    if (!read)
        return read.error();
    QList<QList<QByteArray>> writes, drops;
    QStringList written;
    for (qsizetype i = 0; i < keys.size(); ++i) {
        const redisReply *hash = (*read)[size_t(2 * i)].get();
        const redisReply *expiry = (*read)[size_t(2 * i + 1)].get();
        if (hash->type != REDIS_REPLY_ARRAY || expiry->type != REDIS_REPLY_INTEGER)
            return makeError(ErrorCode::Unavailable,
                             u"Redis %1: unexpected answer reading the v3 record of %2"_qs.arg(
                                 m_url.display(), escapeControls(keys.at(i))));
        const auto fields = fieldsFrom(hash);
        if (!fields.contains("m"))
            continue; // gone meanwhile (expired), or nothing was there but a spent counter
        const QString &key = keys.at(i);
        QList<QByteArray> args = QList<QByteArray>{"6", m_layout.record(key)} +
                                 m_layout.indexes(m_layout.bucketOf(key), redis::endpointOf(key));
        args << m_layout.endpoints(m_layout.bucketOf(key)) << key.toUtf8() << fields.value("m")
             << fields.value("h") << fields.value("q") << fields.value("s") << fields.value("e")
             << num(std::max<long long>(0, expiry->integer)) << redis::endpointOf(key).toUtf8();
        writes.append(args);
        drops.append({"1", redis::v3RecordKey(m_prefix, key), fields.value("m")});
        written << key;
    }
    Moved result;
    if (writes.isEmpty())
        return result;
    if (auto moved = scriptsPipelined("migrate4", writes); !moved)
        return moved.error();
    auto dropped = scriptsPipelined("v3/drop", drops);
    if (!dropped)
        return dropped.error();
    for (qsizetype i = 0; i < written.size(); ++i) {
        const redisReply *r = (*dropped)[size_t(i)].get();
        if (r->type == REDIS_REPLY_INTEGER && r->integer == 1)
            ++result.moved;
        else
            result.changed << written.at(i);
    }
    return result;
}

Result<qint64> RedisStore::migrateV1()
{
    const QByteArray tokens = m_prefix + "tokens", all = m_prefix + "i:all";
    if (m_cluster) {
        // Layout v1's scripts touched keys of many slots: they never ran on a cluster, so none of
        // its records can be there — unless a prefix with a hash tag kept them all in one slot.
        // Their move would cross slots (one script per record), so it is refused, not skipped.
        for (const QByteArray &v1Key : {tokens, all}) {
            auto found = command({"EXISTS", v1Key}, false);
            if (!found)
                return found.error();
            if ((*found)->integer != 0)
                return makeError(ErrorCode::Conflict,
                                 u"Redis Cluster %1 holds records of layout v1 (%2): migrate them "
                                 u"on a single Redis "
                                 u"(idemdesk migrate), then move them to the cluster"_qs.arg(
                                     m_url.display(), QString::fromUtf8(v1Key)));
        }
        return 0;
    }
    auto v1 = command({"EXISTS", tokens, all}, false);
    if (!v1)
        return v1.error();
    if ((*v1)->integer == 0)
        return 0;
    auto floor = command({"GET", tokens}, false);
    if (!floor)
        return floor.error();
    const QByteArray lastToken = text(floor->get()).isEmpty() ? "0" : text(floor->get());
    qint64 migrated = 0;
    // Every v1 record, and the v1-only endpoint indexes, whatever their number.
    for (const QByteArray &pattern : {QByteArray("k:*"), QByteArray("i:e:*")}) {
        auto scanned = scanAll(
            globEscaped(m_prefix) + pattern, [&](const QList<QByteArray> &names) -> Result<void> {
                QList<QList<QByteArray>> commands;
                for (const QByteArray &name : names) {
                    if (pattern.startsWith("i:")) {
                        commands.append({"DEL", name});
                        continue;
                    }
                    const QString key = QString::fromUtf8(name.mid(m_prefix.size() + 2));
                    commands.append({"EVALSHA", m_sha.value("v3/migrate"), "3",
                                     redis::v3RecordKey(m_prefix, key),
                                     redis::tokenKey(m_prefix, key), name, lastToken});
                }
                auto replies = pipeline(commands, true);
                if (!replies)
                    return replies.error();
                for (const Reply &r : *replies) {
                    if (r->type == REDIS_REPLY_ERROR)
                        return makeError(ErrorCode::Unavailable,
                                         u"Redis %1: migrating a record: %2"_qs.arg(
                                             m_url.display(), QString::fromUtf8(r->str)));
                    if (r->type == REDIS_REPLY_INTEGER && !pattern.startsWith("i:"))
                        migrated += r->integer;
                }
                return {};
            });
        if (!scanned)
            return scanned.error();
    }
    // Last, so that a migration cut short is found and finished by the next one.
    if (auto done = pipeline({{"DEL", all, tokens}, {"SET", m_prefix + "layout", "2"}}, true);
        !done)
        return done.error();
    return migrated;
}

Result<void> RedisStore::appendDeliveries(const QList<DeliveryEvent> &events)
{
    const QByteArray stream = m_prefix + "log";
    const QByteArray maxLen = num(m_options.logMaxLength);
    QList<QList<QByteArray>> commands;
    commands.reserve(events.size());
    for (const DeliveryEvent &e : events) {
        commands.append({"XADD",   stream,
                         "MAXLEN", "~",
                         maxLen,   "*",
                         "at",     num(e.atMs),
                         "e",      e.endpoint.toUtf8(),
                         "k",      e.key.toUtf8(),
                         "o",      toString(e.outcome).toLatin1(),
                         "s",      num(e.status),
                         "l",      num(e.latencyUs),
                         "t",      num(e.token),
                         "i",      e.instance.toUtf8(),
                         "d",      e.detail.toUtf8(),
                         "b",      e.payload});
        if (e.count != 1) // a summary's count (DeliveryEvent::count); absent: 1
            commands.last() << "n" << num(e.count);
        if (!e.type.isEmpty()) // absent: no type
            commands.last() << "y" << e.type.toUtf8();
    }
    auto written = pipeline(commands, true);
    if (!written)
        return written.error();
    // An XADD Redis refused (out of memory) is kept by the caller for later, not lost.
    for (const Reply &reply : *written)
        if (reply->type == REDIS_REPLY_ERROR)
            return makeError(
                ErrorCode::Unavailable,
                u"Redis %1: the delivery log: %2"_qs.arg(
                    m_url.display(), QString::fromUtf8(reply->str, qsizetype(reply->len))));
    return {};
}

Result<QList<DeliveryEvent>> RedisStore::deliveries(const DeliveryQuery &q)
{
    QList<DeliveryEvent> events;
    QByteArray end = "+";
    qint64 scanned = 0;
    while (events.size() < q.limit && scanned < m_options.logMaxLength * 2) {
        auto r = command({"XREVRANGE", m_prefix + "log", end, "-", "COUNT", "1000"}, false);
        if (!r)
            return r.error();
        const redisReply *array = r->get();
        if (array->type != REDIS_REPLY_ARRAY)
            return makeError(ErrorCode::Unavailable,
                             u"Redis %1: unexpected answer to XREVRANGE"_qs.arg(m_url.display()));
        if (array->elements == 0)
            break;
        bool older = false;
        for (size_t i = 0; i < array->elements && events.size() < q.limit; ++i) {
            QByteArray id;
            auto e = redis::deliveryFrom(array->element[i], &id);
            if (!e)
                return makeError(
                    ErrorCode::Unavailable,
                    u"Redis %1: an unreadable entry in the delivery log"_qs.arg(m_url.display()));
            end = "(" + id;
            if (e->atMs < q.sinceMs) {
                older = true;
                break;
            }
            if (e->atMs >= q.untilBound())
                continue; // newer than asked: the stream is read from its newest end
            if ((!q.key.isEmpty() && e->key != q.key) ||
                (!q.endpoint.isEmpty() && e->endpoint != q.endpoint))
                continue;
            events.append(std::move(*e));
        }
        scanned += qint64(array->elements);
        if (older || array->elements < 1000)
            break;
    }
    return events;
}

Result<void> RedisStore::ping()
{
    auto r = command({"PING"}, false);
    if (!r)
        return r.error();
    return {};
}

Result<void> RedisStore::ready()
{
    auto marks = pipeline({{"GET", m_layout.layoutKey()}, {"GET", m_layout.bucketsKey()}}, false);
    if (!marks)
        return marks.error();
    // Not marked: no desk of this version started on it (each migrates, or marks an empty store,
    // before it serves), so an earlier layout's records may be there.
    const qint64 version = text((*marks)[0].get()).toLongLong();
    if (version == 0)
        return makeError(ErrorCode::Internal,
                         u"Redis layout: not marked as v%1 (no desk of this version migrated it): "
                         u"run idemdesk migrate"_qs.arg(redis::kLayoutVersion));
    if (auto current = schemaCurrent(u"Redis layout"_qs, version, redis::kLayoutVersion); !current)
        return current;
    const QByteArray buckets = text((*marks)[1].get());
    if (!buckets.isEmpty() && buckets != num(m_layout.buckets()))
        return makeError(ErrorCode::Internal,
                         u"Redis layout: its records are in %1 buckets, and a desk on %2 reads "
                         u"%3 (a single Redis: 1, a cluster: %4): were they copied from a "
                         u"cluster to a single Redis, or back? Move them with keys export and "
                         u"keys import"_qs.arg(escapeControls(QString::fromUtf8(buckets)).left(20),
                                               m_url.display(), QString::number(m_layout.buckets()),
                                               QString::number(redis::Layout::kClusterBuckets)));
    return {};
}

} // namespace idem
