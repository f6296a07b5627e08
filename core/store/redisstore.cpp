#include "store/redisstore.h"

#include "store/rediscluster.h"
#include "store/redisprotocol.h"

#include <QRegularExpression>
#include <QScopeGuard>
#include <QSet>

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
// scripts have answered (stop(): the index writes after them are a derived view), nor after.
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

// Expired keys made tombstones per endpoint and round trip: by the purge (the engine's, every
// minute, and `keys purge-expired`), a slice after another; by a count, one small slice, so that
// a store where many keys expired at once (a burst a TTL ago, a desk that was stopped) keeps its
// counts of failed, processing and reset keys close without a count paying the whole purge
// (5000 tombstones: ~100 ms of Redis, measured on 1M keys). A listing purges nothing: it reads
// only live entries of i:k, and skips the expired records it meets in i:es.
constexpr qint64 kPurgeSlice = 5000;
constexpr qint64 kCountPurgeSlice = 500;

using redis::text;

QHash<QByteArray, QByteArray> fieldsFrom(const redisReply *array)
{
    QHash<QByteArray, QByteArray> fields;
    if (!array || array->type != REDIS_REPLY_ARRAY)
        return fields;
    for (size_t i = 0; i + 1 < array->elements; i += 2)
        fields.insert(text(array->element[i]), text(array->element[i + 1]));
    return fields;
}

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
    : m_context(context), m_url(std::move(url)), m_options(options), m_prefix(m_url.prefix.toUtf8())
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

void RedisStore::writeIndexes(const redis::IndexBatch &batch)
{
    if (batch.isEmpty())
        return;
    // A derived view: not waited for (wait_replicas; its writes are not marked, see MarkedWrites).
    (void)pipeline(batch.commands(m_prefix), true); // lost: listing and purge repair it
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
    if (r->get()->integer < m_url.waitReplicas)
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
    auto r = script("claim", redis::claimArgs(m_prefix, req), true);
    marked.stop();
    if (!r)
        return answerUnwritten(req, r.error());
    auto result = redis::claimResult(r->get(), req);
    if (!result)
        return result;
    // Listed whether or not replicas acknowledge it: the record is there either way (a refused
    // claim's key, left to its lease, was missing from listings until the purge's repair).
    redis::IndexBatch batch;
    if (auto move = redis::indexMoveOf(req, *result))
        batch.add(*move);
    writeIndexes(batch);
    if (auto waited = waitForReplicas(); !waited)
        return waited.error(); // refused: the claim may be lost in a failover, so nothing runs
    return result;
}

Result<FinishVerdict> RedisStore::finish(const FinishRequest &req)
{
    MarkedWrites marked(m_cluster.get());
    auto r = script("finish", redis::finishArgs(m_prefix, req), true);
    marked.stop();
    if (!r)
        return r.error();
    redis::IndexMove move;
    auto verdict = redis::finishVerdict(r->get(), req, &move);
    if (!verdict)
        return verdict;
    if (*verdict == FinishVerdict::Accept) { // listed either way, as a claim
        redis::IndexBatch batch;
        batch.add(move);
        writeIndexes(batch);
    }
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
        args.append(redis::claimArgs(m_prefix, req));
    MarkedWrites marked(m_cluster.get());
    auto exec = scriptsInTransaction("claim", args);
    marked.stop();
    if (!exec) // a transaction Redis refused (EXECABORT): none of them ran
        return answerUnwritten(requests, exec.error());
    QList<ClaimResult> results;
    redis::IndexBatch batch;
    for (qsizetype i = 0; i < requests.size(); ++i) {
        auto result = redis::claimResult(exec->at[size_t(i)], requests.at(i));
        if (!result)
            return result.error();
        if (auto move = redis::indexMoveOf(requests.at(i), *result))
            batch.add(*move);
        results.append(std::move(*result));
    }
    writeIndexes(batch); // listed either way, as a claim
    if (auto waited = waitForReplicas(); !waited)
        return waited.error();
    return results;
}

Result<QList<FinishVerdict>> RedisStore::finishBatch(const QList<FinishRequest> &requests)
{
    QList<QList<QByteArray>> args;
    for (const FinishRequest &req : requests)
        args.append(redis::finishArgs(m_prefix, req));
    MarkedWrites marked(m_cluster.get());
    auto exec = scriptsInTransaction("finish", args);
    marked.stop();
    if (!exec)
        return exec.error();
    QList<FinishVerdict> verdicts;
    redis::IndexBatch batch;
    for (qsizetype i = 0; i < requests.size(); ++i) {
        redis::IndexMove move;
        auto verdict = redis::finishVerdict(exec->at[size_t(i)], requests.at(i), &move);
        if (!verdict)
            return verdict.error();
        if (*verdict == FinishVerdict::Accept)
            batch.add(move);
        verdicts.append(*verdict);
    }
    writeIndexes(batch); // listed either way, as a claim
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
    auto read = pipeline({{"TIME"}, {"HGETALL", redis::recordKey(m_prefix, key)}}, false);
    if (!read)
        return read.error();
    auto now = timeMs((*read)[0].get());
    if (!now)
        return now.error();
    if ((*read)[1]->type == REDIS_REPLY_ERROR)
        return makeError(
            ErrorCode::Unavailable,
            u"Redis %1: %2"_qs.arg(m_url.display(),
                                   QString::fromUtf8((*read)[1]->str, int((*read)[1]->len))));
    auto fields = fieldsFrom((*read)[1].get());
    if (!fields.contains("m") && fields.contains("state")) {
        // A record of layout v2 left over: converted (tombstone.lua reads it as every script
        // does), then read again.
        if (auto converted = script("tombstone", {"1", redis::recordKey(m_prefix, key)}, true);
            !converted)
            return converted.error();
        auto again = command({"HGETALL", redis::recordKey(m_prefix, key)}, false);
        if (!again)
            return again.error();
        fields = fieldsFrom(again->get());
    }
    if (!fields.contains("m"))
        return std::optional<KeyRecord>();
    QHash<QByteArray, QByteArray> meta;
    if (!redis::metaFrom(fields.value("m"), meta) || fields.contains("state"))
        return makeError(
            ErrorCode::Unavailable,
            u"Redis %1: the record of %2 is unreadable (its meta line, or fields of layout v2 beside it)"_qs
                .arg(m_url.display(), key));
    if (meta.value("expires_at").toLongLong() <= *now)
        return std::optional<KeyRecord>(); // a tombstone (expired, deleted)
    return std::optional<KeyRecord>(redis::recordFrom(key, fields));
}

Result<QStringList> RedisStore::endpoints()
{
    auto r = command({"SMEMBERS", redis::endpointsSet(m_prefix)}, false);
    if (!r)
        return r.error();
    QStringList names;
    for (size_t i = 0; i < (*r)->elements; ++i)
        names << QString::fromUtf8(text((*r)->element[i]));
    names.sort();
    return names;
}

Result<RedisStore::Scope> RedisStore::scope(const QString &endpoint, qint64 purgeLimit)
{
    auto now = clockMs();
    if (!now)
        return now.error();
    auto all = endpoints();
    if (!all)
        return all.error();
    Scope scope{*now, endpoint.isEmpty() ? *all : QStringList{endpoint}};
    if (purgeLimit > 0)
        if (auto purged = purgeSlice(*now, scope.endpoints, purgeLimit); !purged)
            return purged.error();
    return scope;
}

Result<qint64> RedisStore::purgeSlice(qint64 now, const QStringList &names, qint64 limit)
{
    // The index entries of records past their expiry (i:k's score), at most `limit` per
    // endpoint: tombstone.lua decides on each atomically (a key claimed again since keeps its
    // record and gets its new expiry here; an expired one keeps only its meta, the token floor,
    // until Redis expires it) and their entries go.
    QList<QList<QByteArray>> ranges;
    for (const QString &endpoint : names)
        ranges.append({"ZRANGEBYSCORE", redis::endpointIndex(m_prefix, endpoint), "-inf", num(now),
                       "LIMIT", "0", num(limit)});
    if (ranges.isEmpty())
        return 0;
    auto due = pipeline(ranges, false);
    if (!due)
        return due.error();
    QStringList keys, endpointOfKey;
    QList<QList<QByteArray>> args;
    for (qsizetype e = 0; e < names.size(); ++e) {
        const redisReply *members = (*due)[size_t(e)].get();
        for (size_t i = 0; members->type == REDIS_REPLY_ARRAY && i < members->elements; ++i) {
            keys << QString::fromUtf8(text(members->element[i]));
            endpointOfKey << names.at(e);
            args.append({"1", redis::recordKey(m_prefix, keys.last())});
        }
    }
    if (keys.isEmpty())
        return 0;
    auto verdicts = scriptsPipelined("tombstone", args);
    if (!verdicts)
        return verdicts.error();
    QList<QList<QByteArray>> writes;
    QHash<QString, QList<QByteArray>> expiredByEndpoint; // unindex.lua's arguments
    for (qsizetype i = 0; i < keys.size(); ++i) {
        const QByteArray verdict = text((*verdicts)[size_t(i)].get());
        if (verdict != "gone" && verdict != "tombstone") {
            writes.append({"ZADD", redis::endpointIndex(m_prefix, endpointOfKey.at(i)), verdict,
                           keys.at(i).toUtf8()});
            continue;
        }
        auto &args = expiredByEndpoint[endpointOfKey.at(i)];
        if (args.isEmpty())
            args << "1" << redis::endpointIndex(m_prefix, endpointOfKey.at(i)) << num(now);
        args << keys.at(i).toUtf8();
    }
    if (!writes.isEmpty())
        if (auto written = pipeline(writes, true); !written)
            return written.error();
    if (expiredByEndpoint.isEmpty())
        return 0;
    // Out of i:k only where the entry is still the expired one (a key claimed again meanwhile
    // keeps its new one); then out of the i:es indexes those went from.
    const QStringList expiredEndpoints = expiredByEndpoint.keys();
    QList<QList<QByteArray>> unindexArgs;
    for (const QString &endpoint : expiredEndpoints)
        unindexArgs << expiredByEndpoint.value(endpoint);
    auto unindexed = scriptsPipelined("unindex", unindexArgs);
    if (!unindexed)
        return unindexed.error();
    redis::IndexBatch gone;
    qint64 removed = 0;
    for (qsizetype e = 0; e < expiredEndpoints.size(); ++e) {
        const redisReply *list = (*unindexed)[size_t(e)].get();
        for (size_t i = 0; list->type == REDIS_REPLY_ARRAY && i < list->elements; ++i) {
            gone.add({QString::fromUtf8(text(list->element[i])), expiredEndpoints.at(e),
                      std::nullopt,
                      redis::bit(KeyState::Processing) | redis::bit(KeyState::Failed) |
                          redis::bit(KeyState::Reset),
                      now, 0});
            ++removed;
        }
    }
    if (auto written = pipeline(gone.commands(m_prefix), true); !written)
        return written.error();
    return removed;
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

Result<qint64> RedisStore::repairSlice()
{
    // A slice of the records, re-indexed from what they say: an index write that was lost (a
    // connection dropped after the script, a desk killed between the two) is made good here.
    // Only records settled for a minute: one changing now has its own index write on the way,
    // which this one, read before it, must not undo.
    auto now = clockMs();
    if (!now)
        return now.error();
    auto nodes = scanNodes();
    if (!nodes)
        return nodes.error();
    QList<QByteArray> names;
    for (const auto &[address, node] : std::as_const(*nodes)) {
        auto page =
            scanStep(node, m_repairCursors.value(address, "0"), globEscaped(m_prefix) + "{*}:r");
        if (!page)
            return page.error();
        m_repairCursors.insert(address, page->first);
        names += page->second;
    }
    QStringList keys;
    QList<QList<QByteArray>> reads;
    for (const QByteArray &name : std::as_const(names)) {
        keys << QString::fromUtf8(name.mid(m_prefix.size() + 1, name.size() - m_prefix.size() - 4));
        reads.append({"HGET", name, "m"});
    }
    if (keys.isEmpty())
        return 0;
    auto records = pipeline(reads, false);
    if (!records)
        return records.error();
    redis::IndexBatch batch;
    for (qsizetype i = 0; i < keys.size(); ++i) {
        QHash<QByteArray, QByteArray> meta;
        redis::metaFrom(text((*records)[size_t(i)].get()), meta);
        const auto state = keyStateFromString(QString::fromLatin1(meta.value("state")));
        const qint64 updated = meta.value("updated").toLongLong();
        if (!state || updated > *now - 60'000 || meta.value("expires_at").toLongLong() <= *now)
            continue; // a tombstone (purge's), or changing
        batch.add({keys.at(i), QString::fromUtf8(meta.value("endpoint")), *state, redis::kAllStates,
                   updated, meta.value("expires_at").toLongLong()});
    }
    writeIndexes(batch);
    return batch.size();
}

Result<QList<QPair<QByteArray, redisContext *>>> RedisStore::scanNodes()
{
    if (!m_cluster)
        return QList<QPair<QByteArray, redisContext *>>{{QByteArray(), m_context}};
    // SCAN walks one node's keys: on a cluster, every master's (the slot map read again).
    if (auto r = m_cluster->refresh(); !r)
        return makeError(r.error().code, u"Redis %1: %2"_qs.arg(m_url.display(), r.error().message));
    QList<QPair<QByteArray, redisContext *>> nodes;
    for (const redis::ClusterNode &node : m_cluster->map().masters()) {
        auto c = m_cluster->linkTo(node);
        if (!c)
            return makeError(c.error().code, u"Redis %1: %2"_qs.arg(m_url.display(), c.error().message));
        nodes.append({node.address(), *c});
    }
    return nodes;
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
    if (answer->type != REDIS_REPLY_ARRAY || answer->elements != 2)
        return makeError(ErrorCode::Unavailable,
                         u"Redis %1: unexpected answer to SCAN"_qs.arg(m_url.display()));
    QList<QByteArray> names;
    for (size_t i = 0; i < answer->element[1]->elements; ++i)
        names << text(answer->element[1]->element[i]);
    return QPair<QByteArray, QList<QByteArray>>{text(answer->element[0]), names};
}

Result<QStringList> RedisStore::keyNames(const KeyQuery &q)
{
    // An endpoint's i:k holds every live key from its claim to its end, whatever its state:
    // ZSCAN returns each member present for the whole scan at least once (duplicates dropped
    // here). The state is the caller's to check on the record.
    const QRegularExpression glob = keyGlob(q.glob);
    auto endpointNames =
        q.endpoint.isEmpty() ? endpoints() : Result<QStringList>(QStringList{q.endpoint});
    if (!endpointNames)
        return endpointNames.error();
    QSet<QString> seen;
    QStringList names;
    for (const QString &endpoint : std::as_const(*endpointNames)) {
        QByteArray cursor = "0";
        do {
            auto r = command(
                {"ZSCAN", redis::endpointIndex(m_prefix, endpoint), cursor, "COUNT", "1000"},
                false);
            if (!r)
                return r.error();
            const redisReply *answer = r->get();
            if (answer->type != REDIS_REPLY_ARRAY || answer->elements != 2)
                return makeError(ErrorCode::Unavailable,
                                 u"Redis %1: unexpected answer to ZSCAN"_qs.arg(m_url.display()));
            cursor = text(answer->element[0]);
            const redisReply *members = answer->element[1];
            for (size_t i = 0; i + 1 < members->elements; i += 2) { // member, score
                const QString key = QString::fromUtf8(text(members->element[i]));
                if ((glob.pattern().isEmpty() || glob.match(key).hasMatch()) &&
                    !seen.contains(key)) {
                    seen.insert(key);
                    names << key;
                }
            }
        } while (cursor != "0");
    }
    names.sort();
    return names;
}

Result<QList<KeyRecord>> RedisStore::listKeys(const KeyQuery &q)
{
    auto scope = this->scope(q.endpoint, 0);
    if (!scope)
        return scope.error();
    const qint64 now = scope->now;
    // The keys newest first, merged by score across the endpoints asked for: by expiry from
    // i:k (every key: no state asked, or completed, which has no index of its own; only its live
    // entries, scored above now: the expired ones are the purge's), by update from i:es
    // (processing, failed, reset). Each is checked against its record: an entry whose record is
    // gone, or an i:es entry in another state, is stale (index writes follow the scripts) and is
    // skipped and repaired; an i:k entry in another state than completed is only skipped. An
    // expired record met in i:es leaves it, and stays in i:k for the purge to make a tombstone.
    struct Source
    {
        QByteArray index;
        std::optional<KeyState> state; // an i:es index: the state its keys must be in
        QString endpoint;
        qint64 next = 0; // the rank of the next entry to read
        QList<QPair<qint64, QByteArray>> entries;
        bool done = false;
    };
    QList<Source> sources;
    for (const QString &endpoint : std::as_const(scope->endpoints)) {
        if (q.state && *q.state != KeyState::Completed)
            sources.append(
                {redis::endpointStateIndex(m_prefix, endpoint, *q.state), *q.state, endpoint});
        else
            sources.append({redis::endpointIndex(m_prefix, endpoint), std::nullopt, endpoint});
    }
    const QRegularExpression glob = keyGlob(q.glob);
    const qint64 chunk = std::clamp<qint64>(qint64(q.offset) + q.limit, 100, 1000);

    QList<KeyRecord> records;
    qint64 skipped = 0;
    redis::IndexBatch repairs;
    // The index is read a chunk at a time by rank, and new keys push older ones down meanwhile:
    // a key met again in the next chunk is listed once (a long listing repeated some).
    QSet<QString> met;
    while (records.size() < q.limit) {
        // Refill what ran dry, in one round trip.
        QList<QList<QByteArray>> reads;
        QList<Source *> reading;
        for (Source &s : sources)
            if (s.entries.isEmpty() && !s.done) {
                reads.append(s.state ? QList<QByteArray>{"ZREVRANGE", s.index, num(s.next),
                                                         num(s.next + chunk - 1), "WITHSCORES"}
                                     : QList<QByteArray>{"ZREVRANGEBYSCORE", s.index, "+inf",
                                                         "(" + num(now), "WITHSCORES", "LIMIT",
                                                         num(s.next), num(chunk)});
                reading << &s;
                s.next += chunk;
            }
        if (!reads.isEmpty()) {
            auto ranges = pipeline(reads, false);
            if (!ranges)
                return ranges.error();
            for (qsizetype i = 0; i < reading.size(); ++i) {
                const redisReply *array = (*ranges)[size_t(i)].get();
                if (array->type == REDIS_REPLY_ERROR)
                    return makeError(
                        ErrorCode::Unavailable,
                        u"Redis %1: %2"_qs.arg(m_url.display(), QString::fromUtf8(array->str)));
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
            hmgets.append({"HMGET", redis::recordKey(m_prefix, c.key), "m", "e"});
        auto replies = pipeline(hmgets, false);
        if (!replies)
            return replies.error();
        for (qsizetype i = 0; i < candidates.size(); ++i) {
            const QString &key = candidates.at(i).key;
            const Source &source = *candidates.at(i).source;
            const redisReply *reply = (*replies)[size_t(i)].get();
            QHash<QByteArray, QByteArray> fields;
            static const QByteArray kRead[] = {"m", "e"};
            for (size_t f = 0; f < reply->elements && f < std::size(kRead); ++f)
                if (reply->element[f]->type == REDIS_REPLY_STRING)
                    fields.insert(kRead[f], text(reply->element[f]));
            QHash<QByteArray, QByteArray> meta;
            if (fields.contains("m") && !redis::metaFrom(fields.value("m"), meta))
                continue; // unreadable: not listed, its entries left (every script refuses it)
            auto state = keyStateFromString(QString::fromLatin1(meta.value("state")));
            const qint64 expiresAt = meta.value("expires_at").toLongLong();
            if (state && expiresAt <= now && expiresAt > 0 && source.state) {
                // Expired, not yet purged: out of the i:es index read (not listed again);
                // its i:k entry is left to the purge, which makes it a tombstone.
                repairs.add({key, source.endpoint, KeyState::Completed, redis::bit(*source.state),
                             meta.value("updated").toLongLong(), 0});
                continue;
            }
            if (expiresAt <= now)
                state.reset(); // a tombstone
            if (!state) {
                // Gone (deleted, purged): its entries go, purge would have.
                repairs.add({key, source.endpoint, std::nullopt, redis::kAllStates, 0, 0});
                continue;
            }
            if (source.state && *state != *source.state) {
                repairs.add({key, source.endpoint, *state, redis::bit(*source.state),
                             meta.value("updated").toLongLong(), 0});
                continue; // listed where its state is, if that index is read
            }
            if (q.state && *state != *q.state)
                continue; // completed asked, i:k read: another state's key
            if (skipped < q.offset) {
                ++skipped;
                continue;
            }
            if (records.size() < q.limit)
                records.append(redis::recordFrom(key, fields));
        }
    }
    writeIndexes(repairs);
    return records;
}

Result<StateCounts> RedisStore::countKeys(const QString &endpoint)
{
    auto scope = this->scope(endpoint, kCountPurgeSlice);
    if (!scope)
        return scope.error();
    const QStringList &endpointNames = scope->endpoints;
    // Completed has no index of its own: it is every live key (i:k scored above now) but those
    // of the other states.
    constexpr KeyState kCounted[] = {KeyState::Processing, KeyState::Failed, KeyState::Reset};
    QList<QList<QByteArray>> cards;
    for (const QString &name : std::as_const(endpointNames)) {
        cards.append(
            {"ZCOUNT", redis::endpointIndex(m_prefix, name), "(" + num(scope->now), "+inf"});
        for (KeyState s : kCounted)
            cards.append({"ZCARD", redis::endpointStateIndex(m_prefix, name, s)});
    }
    StateCounts counts;
    if (cards.isEmpty())
        return counts;
    auto r = pipeline(cards, false);
    if (!r)
        return r.error();
    for (qsizetype e = 0; e < endpointNames.size(); ++e) {
        const size_t at = size_t(e) * 4;
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
    auto r = script("operator", redis::operatorArgs(m_prefix, key, action, force, detail), true);
    if (!r)
        return r.error();
    redis::IndexMove move;
    auto verdict = redis::operatorVerdict(r->get(), key, &move);
    if (verdict && *verdict == OperatorVerdict::Accept) {
        redis::IndexBatch batch;
        batch.add(move);
        writeIndexes(batch);
    }
    return verdict;
}

Result<ImportVerdict> RedisStore::importRecord(const KeyRecord &r, qint64 ttlMs, qint64 leaseMs)
{
    auto reply = script("import", redis::importArgs(m_prefix, r, ttlMs, leaseMs), true);
    if (!reply)
        return reply.error();
    redis::IndexMove move;
    auto verdict = redis::importVerdict(reply->get(), r, &move);
    if (verdict && *verdict == ImportVerdict::Imported) {
        redis::IndexBatch batch;
        batch.add(move);
        writeIndexes(batch);
    }
    return verdict;
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
    if (auto repaired = repairSlice(); !repaired)
        return repaired.error();
    return total;
}

Result<qint64> RedisStore::migrateLayout(bool confirmed)
{
    auto layout = command({"GET", m_prefix + "layout"}, false);
    if (!layout)
        return layout.error();
    if (text(layout->get()).toLongLong() >= 3)
        return 0; // done (or newer: ready() says so)
    auto v1 = migrateV1();
    if (!v1)
        return v1.error();
    auto v2 = migrateV2(confirmed || *v1 > 0);
    if (!v2)
        return v2.error();
    return std::max(*v1, *v2); // a v1 record is migrated twice (v1 to v2 to v3), counted once
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
            cursor = page->first;
            if (!page->second.isEmpty())
                if (auto done = each(page->second); !done)
                    return done.error();
        } while (cursor != "0");
    }
    return {};
}

Result<qint64> RedisStore::migrateV2(bool confirmed)
{
    // v2 is recognised by its expiry index (every live key of v2 in it) or its token counters.
    auto v2 = command({"EXISTS", m_prefix + "i:exp"}, false);
    if (!v2)
        return v2.error();
    if ((*v2)->integer != 0 && !confirmed) {
        // A desk of the previous version writing now would take every migrated key for a new
        // one and process it again: refused while the delivery log is moving.
        auto newest = command({"XREVRANGE", m_prefix + "log", "+", "-", "COUNT", "1"}, false);
        auto now = clockMs();
        if (!newest)
            return newest.error();
        if (!now)
            return now.error();
        const redisReply *entries = newest->get();
        if (entries->type == REDIS_REPLY_ARRAY && entries->elements == 1) {
            // The entry's ID is Redis's clock when it was written (the "at" field, the desk's).
            const auto f = fieldsFrom(entries->element[0]->element[1]);
            const qint64 ago =
                *now - text(entries->element[0]->element[0]).split('-').value(0).toLongLong();
            if (ago < 120'000)
                return makeError(ErrorCode::Conflict,
                                 u"Redis %1 holds records of layout v2 and a delivery was logged "
                                 u"%2 s ago (instance %3): stop every "
                                 u"desk of the previous version, then run idemdesk migrate"_qs.arg(
                                     m_url.display(),
                                     QString::number(std::max<qint64>(0, ago) / 1000),
                                     QString::fromUtf8(f.value("i"))));
        }
    }
    // One migration at a time (two desks starting together): the other is refused, and says so.
    const QByteArray lock = m_prefix + "migrating";
    auto locked = command({"SET", lock, "1", "NX", "PX", "900000"}, true);
    if (!locked)
        return locked.error();
    if ((*locked)->type == REDIS_REPLY_NIL)
        return makeError(ErrorCode::Conflict,
                         u"Redis %1: another desk is migrating the records to layout v3 (%2 is "
                         u"set): start again when "
                         u"it has finished"_qs.arg(m_url.display(), QString::fromUtf8(lock)));
    auto unlock = qScopeGuard([&] { (void)command({"DEL", lock}, true); });
    if (auto layout = command({"GET", m_prefix + "layout"}, false); !layout)
        return layout.error();
    else if (text(layout->get()).toLongLong() >= 3)
        return 0; // the other desk finished just before
    // v2's indexes go first (v3's are rebuilt from the records below; a v2 i:es entry whose
    // record is gone would stay forever); then each record and token counter by migrate3.lua:
    // run again after a migration cut short, it indexes every live record once more.
    QList<QList<QByteArray>> drop;
    for (const char *state : {"processing", "completed", "failed", "reset"})
        drop.append({"DEL", m_prefix + "i:s:" + state});
    drop.append({"DEL", m_prefix + "i:exp"});
    if (auto done = pipeline(drop, true); !done)
        return done.error();
    auto indexes = scanAll(globEscaped(m_prefix) + "i:es:*",
                           [&](const QList<QByteArray> &names) -> Result<void> {
                               QList<QList<QByteArray>> commands;
                               for (const QByteArray &name : names)
                                   commands.append({"DEL", name});
                               if (auto done = pipeline(commands, true); !done)
                                   return done.error();
                               return {};
                           });
    if (!indexes)
        return indexes.error();
    qint64 migrated = 0;
    auto records = scanAll(
        globEscaped(m_prefix) + "{*}:[rt]", [&](const QList<QByteArray> &names) -> Result<void> {
            // A key's :r and :t in one page are run once; in two, twice (the second only answers).
            QSet<QString> seen;
            QStringList keys;
            QList<QList<QByteArray>> args;
            for (const QByteArray &name : names) {
                const QString key = QString::fromUtf8(
                    name.mid(m_prefix.size() + 1, name.size() - m_prefix.size() - 4));
                if (seen.contains(key))
                    continue;
                seen.insert(key);
                keys << key;
                args.append({"2", redis::recordKey(m_prefix, key), redis::tokenKey(m_prefix, key)});
            }
            if (keys.isEmpty())
                return {};
            auto replies = scriptsPipelined("migrate3", args);
            if (!replies)
                return replies.error();
            redis::IndexBatch batch;
            for (qsizetype i = 0; i < keys.size(); ++i) {
                const redisReply *answer = (*replies)[size_t(i)].get();
                if (answer->type != REDIS_REPLY_ARRAY || answer->elements < 2)
                    return makeError(
                        ErrorCode::Unavailable,
                        u"Redis %1: unexpected answer from migrate3.lua"_qs.arg(m_url.display()));
                migrated += answer->element[0]->integer;
                if (answer->elements != 5)
                    continue; // nothing live there
                const auto state =
                    keyStateFromString(QString::fromLatin1(text(answer->element[1])));
                QString endpoint = QString::fromUtf8(text(answer->element[2]));
                if (endpoint.isEmpty())
                    endpoint = redis::endpointOf(keys.at(i));
                batch.add({keys.at(i), endpoint, state.value_or(KeyState::Failed),
                           redis::kAllStates, text(answer->element[3]).toLongLong(),
                           text(answer->element[4]).toLongLong()});
            }
            if (auto written = pipeline(batch.commands(m_prefix), true); !written)
                return written.error();
            return {};
        });
    if (!records)
        return records.error();
    if (auto done = command({"SET", m_prefix + "layout", "3"}, true); !done)
        return done.error();
    return migrated;
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
                    commands.append({"EVALSHA", m_sha.value("migrate"), "3",
                                     redis::recordKey(m_prefix, key),
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
        if (array->elements == 0)
            break;
        bool older = false;
        for (size_t i = 0; i < array->elements && events.size() < q.limit; ++i) {
            const redisReply *entry = array->element[i];
            end = "(" + text(entry->element[0]);
            const auto f = fieldsFrom(entry->element[1]);
            DeliveryEvent e;
            e.atMs = f.value("at").toLongLong();
            if (e.atMs < q.sinceMs) {
                older = true;
                break;
            }
            if (e.atMs >= q.untilBound())
                continue; // newer than asked: the stream is read from its newest end
            e.endpoint = QString::fromUtf8(f.value("e"));
            e.key = QString::fromUtf8(f.value("k"));
            if ((!q.key.isEmpty() && e.key != q.key) ||
                (!q.endpoint.isEmpty() && e.endpoint != q.endpoint))
                continue;
            e.outcome =
                outcomeFromString(QString::fromLatin1(f.value("o"))).value_or(Outcome::Rejected);
            e.status = f.value("s").toInt();
            e.latencyUs = f.value("l").toLongLong();
            e.token = f.value("t").toLongLong();
            e.instance = QString::fromUtf8(f.value("i"));
            e.detail = QString::fromUtf8(f.value("d"));
            e.payload = f.value("b");
            bool numeric = false;
            const qint64 n = f.value("n", "1").toLongLong(&numeric);
            e.count = numeric ? deliveryCount(n) : 1;
            events.append(e);
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
    // One key per command: on a cluster they live in different slots.
    for (const QByteArray &v1Key : {m_prefix + "tokens", m_prefix + "i:all"}) {
        auto found = command({"EXISTS", v1Key}, false);
        if (!found)
            return found.error();
        if ((*found)->integer != 0)
            return makeError(ErrorCode::Internal,
                             u"Redis holds records of layout v1 (%1): run idemdesk migrate"_qs.arg(
                                 QString::fromUtf8(v1Key)));
    }
    auto layout = command({"GET", m_prefix + "layout"}, false);
    if (!layout)
        return layout.error();
    qint64 version = text(layout->get()).toLongLong();
    if (version == 0) {
        // No migration ran: a store that never held records, or one of layout v2 (its
        // i:exp held every live key).
        auto v2 = command({"EXISTS", m_prefix + "i:exp"}, false);
        if (!v2)
            return v2.error();
        version = (*v2)->integer != 0 ? 2 : 3;
    }
    return schemaCurrent(u"Redis layout"_qs, version, 3);
}

} // namespace idem
