#include "store/redisstore.h"

#include "store/rediscluster.h"
#include "store/redisprotocol.h"

#include <QRegularExpression>

#include <hiredis.h>

namespace idem {

namespace {

QByteArray num(qint64 v)
{
    return QByteArray::number(v);
}

using redis::text;
using redis::recordFrom;

QHash<QByteArray, QByteArray> fieldsFrom(const redisReply *array)
{
    QHash<QByteArray, QByteArray> fields;
    if (!array || array->type != REDIS_REPLY_ARRAY)
        return fields;
    for (size_t i = 0; i + 1 < array->elements; i += 2)
        fields.insert(text(array->element[i]), text(array->element[i + 1]));
    return fields;
}

const QList<QByteArray> kSummaryFields = {"key",     "endpoint", "provider",    "state",
                                          "fingerprint", "token", "attempts",   "created",
                                          "updated", "lease_until", "expires_at", "res_status",
                                          "error"};

// On a cluster, every key of the desk shares the prefix's hash tag: one slot, so that the
// scripts (which derive their keys from the prefix) and MULTI/EXEC stay on one master.
QByteArray clusterPrefix(const QByteArray &prefix)
{
    const qsizetype open = prefix.indexOf('{');
    if (open >= 0 && prefix.indexOf('}', open + 1) > open + 1)
        return prefix;
    return '{' + prefix + '}';
}

Result<void> authenticate(redisContext *c, const StoreUrl &url)
{
    if (url.password.isEmpty())
        return {};
    QList<QByteArray> auth{"AUTH"};
    if (!url.user.isEmpty())
        auth << url.user.toUtf8();
    auth << url.password.toUtf8();
    std::vector<const char *> argv;
    std::vector<size_t> lengths;
    for (const QByteArray &a : auth) {
        argv.push_back(a.constData());
        lengths.push_back(size_t(a.size()));
    }
    auto *raw = static_cast<redisReply *>(
        redisCommandArgv(c, int(argv.size()), argv.data(), lengths.data()));
    const QString why = !raw ? QString::fromUtf8(c->errstr)
                        : raw->type == REDIS_REPLY_ERROR
                            ? QString::fromUtf8(raw->str, int(raw->len))
                            : QString();
    if (raw)
        freeReplyObject(raw);
    if (!why.isEmpty())
        return makeError(ErrorCode::Unavailable,
                         u"Redis %1: authentication failed: %2"_qs.arg(url.display(), why));
    return {};
}

} // namespace

RedisStore::RedisStore(redisContext *context, StoreUrl url, RedisOptions options)
    : m_context(context), m_url(std::move(url)), m_options(options), m_prefix(m_url.prefix.toUtf8())
{}

RedisStore::~RedisStore()
{
    if (m_context)
        redisFree(m_context);
}

Result<std::unique_ptr<RedisStore>> RedisStore::connect(const StoreUrl &url, const RedisOptions &options)
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
    timeval commandTimeout{options.commandTimeoutMs / 1000, (options.commandTimeoutMs % 1000) * 1000};
    redisSetTimeout(context, commandTimeout);
    std::unique_ptr<RedisStore> store(new RedisStore(context, url, options));
    if (auto r = authenticate(context, url); !r)
        return r.error();
    // A cluster node behind a plain redis:// URL is served as a cluster (it is one of the seeds).
    if (auto info = store->command({"CLUSTER", "INFO"}, false);
        info && text(info->get()).contains("cluster_state:")) {
        StoreUrl clustered = url;
        clustered.cluster = true;
        clustered.clusterSeeds = {{url.host, url.port}};
        if (url.database != u"0"_qs)
            return makeError(
                ErrorCode::Invalid,
                u"Redis %1 is a cluster node: a Redis Cluster has database 0 only"_qs.arg(
                    url.display()));
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

Result<std::unique_ptr<RedisStore>> RedisStore::connectCluster(StoreUrl url,
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
    store->m_prefix = clusterPrefix(store->m_prefix);
    // The SHA1 of each script is known here; a master that lacks one answers NOSCRIPT and gets it
    // then (script()), so no master needs to be up front.
    auto scripts = redis::scripts();
    if (!scripts)
        return scripts.error();
    for (auto it = scripts->cbegin(); it != scripts->cend(); ++it)
        store->m_sha.insert(it.key(), it->sha);
    return store;
}

Result<redisContext *> RedisStore::contextFor(const QByteArray &slotKey)
{
    if (!m_cluster) {
        if (m_context->err)
            return failure(u"connection lost: %1"_qs.arg(QString::fromUtf8(m_context->errstr)),
                           false);
        return m_context;
    }
    auto c = m_cluster->link(redis::keySlot(slotKey));
    if (!c)
        return makeError(c.error().code,
                         u"Redis %1: %2"_qs.arg(m_url.display(), c.error().message));
    return c;
}

void RedisStore::lost(redisContext *context)
{
    if (m_cluster)
        m_cluster->broken(context);
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
    std::vector<const char *> argv;
    std::vector<size_t> lengths;
    argv.reserve(size_t(args.size()));
    lengths.reserve(size_t(args.size()));
    for (const QByteArray &a : args) {
        argv.push_back(a.constData());
        lengths.push_back(size_t(a.size()));
    }
    if (m_context->err)
        return failure(u"connection lost: %1"_qs.arg(QString::fromUtf8(m_context->errstr)), false);
    void *raw = redisCommandArgv(m_context, int(argv.size()), argv.data(), lengths.data());
    if (!raw)
        return failure(QString::fromUtf8(m_context->errstr), writes);
    Reply reply(static_cast<redisReply *>(raw), freeReplyObject);
    if (reply->type == REDIS_REPLY_ERROR)
        return makeError(ErrorCode::Unavailable, u"Redis %1: %2"_qs.arg(m_url.display(), QString::fromUtf8(reply->str, int(reply->len))));
    return reply;
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

Result<RedisStore::Reply> RedisStore::script(const char *name, const QList<QByteArray> &args, bool writes)
{
    QList<QByteArray> call{"EVALSHA", m_sha.value(name), "0"};
    call += args;
    auto r = command(call, writes);
    if (!r && r.error().code == ErrorCode::Unavailable && r.error().message.contains(u"NOSCRIPT"_qs)) {
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
    auto r = command({"WAIT", num(m_url.waitReplicas), num(m_url.waitTimeoutMs)}, false);
    if (!r)
        return r.error();
    if (r->get()->integer < m_url.waitReplicas)
        return makeError(ErrorCode::Unavailable,
                         u"Redis %1: only %2 of %3 replicas acknowledged the write within %4 ms (wait_replicas)"_qs
                             .arg(m_url.display())
                             .arg(r->get()->integer)
                             .arg(m_url.waitReplicas)
                             .arg(m_url.waitTimeoutMs));
    return {};
}

Result<ClaimResult> RedisStore::claim(const ClaimRequest &req)
{
    auto r = script("claim", redis::claimArgs(m_prefix, req), true);
    if (!r)
        return r.error();
    auto result = redis::claimResult(r->get(), req);
    if (auto waited = waitForReplicas(); result && !waited)
        return waited.error(); // refused: the claim may be lost in a failover, so nothing runs
    return result;
}

Result<FinishVerdict> RedisStore::finish(const FinishRequest &req)
{
    auto r = script("finish", redis::finishArgs(m_prefix, req), true);
    if (!r)
        return r.error();
    auto verdict = redis::finishVerdict(r->get());
    if (auto waited = waitForReplicas(); verdict && !waited)
        return waited.error(); // retried by the engine: the same finish answers Repeated
    return verdict;
}

Result<RedisStore::Reply> RedisStore::scriptsInTransaction(const char *name, const QList<QList<QByteArray>> &argsList)
{
    // On a cluster, every script of the batch runs on its prefix's slot (one master).
    for (int round = 0; round < 2 + redis::kMaxRedirects; ++round) {
        auto context = contextFor(argsList.isEmpty() ? m_prefix : argsList.first().first());
        if (!context)
            return context.error();
        redisContext *c = *context;
        QList<QList<QByteArray>> commands{{"MULTI"}};
        for (const auto &args : argsList)
            commands.append(QList<QByteArray>{"EVALSHA", m_sha.value(name), "0"} + args);
        commands.append({"EXEC"});
        for (const auto &command : commands) {
            std::vector<const char *> argv;
            std::vector<size_t> lengths;
            for (const QByteArray &a : command) {
                argv.push_back(a.constData());
                lengths.push_back(size_t(a.size()));
            }
            redisAppendCommandArgv(c, int(argv.size()), argv.data(), lengths.data());
        }
        Reply exec(nullptr, freeReplyObject);
        std::optional<redis::Redirect> redirect;
        for (qsizetype i = 0; i < commands.size(); ++i) {
            void *raw = nullptr;
            if (redisGetReply(c, &raw) != REDIS_OK || !raw) {
                const Error error = failure(QString::fromUtf8(c->errstr), true);
                lost(c);
                return error;
            }
            exec.reset(static_cast<redisReply *>(raw)); // the last one kept is EXEC's
            if (m_cluster && !redirect && exec->type == REDIS_REPLY_ERROR)
                redirect = redis::redirectFrom(QByteArrayView(exec->str, qsizetype(exec->len)));
        }
        if (redirect && exec->type == REDIS_REPLY_ERROR) {
            // A script refused at queueing (MOVED/ASK): EXEC aborted, nothing ran. The slot map is
            // read again and the batch goes to the slot's master.
            m_cluster->markStale();
            if (round < 1 + redis::kMaxRedirects)
                continue;
        }
        if (exec->type != REDIS_REPLY_ARRAY || exec->elements != size_t(argsList.size()))
            return makeError(ErrorCode::Unavailable, u"Redis %1: the batch's transaction was refused"_qs.arg(m_url.display()));
        // The server lost its script cache: every EVALSHA of the batch failed, none ran.
        const redisReply *first = exec->elements ? exec->element[0] : nullptr;
        if (round == 0 && first && first->type == REDIS_REPLY_ERROR && QByteArray(first->str).startsWith("NOSCRIPT")) {
            if (auto loaded = loadScripts(); !loaded)
                return loaded.error();
            continue;
        }
        for (size_t i = 0; i < exec->elements; ++i)
            if (exec->element[i]->type == REDIS_REPLY_ERROR)
                return makeError(ErrorCode::InDoubt, u"Redis %1: %2"_qs.arg(m_url.display(), QString::fromUtf8(exec->element[i]->str)));
        return exec;
    }
    return makeError(ErrorCode::Unavailable, u"Redis %1: the scripts could not be loaded"_qs.arg(m_url.display()));
}

Result<QList<ClaimResult>> RedisStore::claimBatch(const QList<ClaimRequest> &requests)
{
    QList<QList<QByteArray>> args;
    for (const ClaimRequest &req : requests)
        args.append(redis::claimArgs(m_prefix, req));
    auto exec = scriptsInTransaction("claim", args);
    if (!exec)
        return exec.error();
    QList<ClaimResult> results;
    for (qsizetype i = 0; i < requests.size(); ++i) {
        auto result = redis::claimResult((*exec)->element[i], requests.at(i));
        if (!result)
            return result.error();
        results.append(std::move(*result));
    }
    if (auto waited = waitForReplicas(); !waited)
        return waited.error();
    return results;
}

Result<QList<FinishVerdict>> RedisStore::finishBatch(const QList<FinishRequest> &requests)
{
    QList<QList<QByteArray>> args;
    for (const FinishRequest &req : requests)
        args.append(redis::finishArgs(m_prefix, req));
    auto exec = scriptsInTransaction("finish", args);
    if (!exec)
        return exec.error();
    QList<FinishVerdict> verdicts;
    for (qsizetype i = 0; i < requests.size(); ++i) {
        auto verdict = redis::finishVerdict((*exec)->element[i]);
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
    if (r->get()->type != REDIS_REPLY_ARRAY || r->get()->elements != 2)
        return makeError(ErrorCode::Unavailable, u"Redis %1: unexpected answer to TIME"_qs.arg(m_url.display()));
    return text(r->get()->element[0]).toLongLong() * 1000 + text(r->get()->element[1]).toLongLong() / 1000;
}

Result<QStringList> RedisStore::durabilityWarnings()
{
    QHash<QByteArray, QByteArray> config;
    for (const char *name : {"maxmemory-policy", "appendonly", "appendfsync", "save"}) {
        auto r = command({"CONFIG", "GET", name}, false);
        if (!r) {
            // A connection that failed is an error; a refusal of CONFIG (ACL, a managed service) is
            // a warning.
            if (m_cluster ? !r.error().message.contains(u"config"_qs, Qt::CaseInsensitive)
                          : m_context->err != 0)
                return r.error(); // the connection failed
            return QStringList{u"Redis refused CONFIG GET (%1): whether it may evict or lose acknowledged records is unknown"_qs
                                   .arg(r.error().message)};
        }
        const auto fields = fieldsFrom(r->get());
        config.insert(name, fields.value(name));
    }
    QStringList warnings;
    const QByteArray policy = config.value("maxmemory-policy");
    if (policy != "noeviction")
        warnings << u"Redis maxmemory-policy is %1: under memory pressure it may evict idempotency records (an evicted key is processed again) and the fencing-token counter; set maxmemory-policy noeviction"_qs
                        .arg(QString::fromUtf8(policy));
    if (config.value("appendonly") != "yes") {
        if (config.value("save").isEmpty())
            warnings << u"Redis persists nothing (appendonly no, no save points): a restart of Redis forgets every key (their duplicates are processed again) and restarts the fencing-token counter"_qs;
        else
            warnings << u"Redis persists by snapshots only (save %1): a crash of Redis loses the records written since the last one; use appendonly yes with appendfsync always"_qs
                            .arg(QString::fromUtf8(config.value("save")));
    } else if (config.value("appendfsync") != "always") {
        warnings << u"Redis appendfsync is %1: a crash of Redis may lose about a second of acknowledged records; use appendfsync always"_qs
                        .arg(QString::fromUtf8(config.value("appendfsync")));
    }
    return warnings;
}

Result<std::optional<KeyRecord>> RedisStore::key(const QString &key)
{
    auto r = command({"HGETALL", m_prefix + "k:" + key.toUtf8()}, false);
    if (!r)
        return r.error();
    const auto fields = fieldsFrom(r->get());
    if (fields.isEmpty())
        return std::optional<KeyRecord>();
    // Expiry is Redis's own (PEXPIREAT on its clock): an expired record is gone from HGETALL.
    return std::optional<KeyRecord>(recordFrom(fields));
}

Result<qint64> RedisStore::purgeSlice()
{
    auto r = script("purge", {m_prefix, "5000"}, true);
    if (!r)
        return r.error();
    return qint64(r->get()->integer);
}

Result<QList<KeyRecord>> RedisStore::listKeys(const KeyQuery &q)
{
    if (auto purged = purgeSlice(); !purged)
        return purged.error();
    QByteArray index;
    const QByteArray state = q.state ? toString(*q.state).toLatin1() : QByteArray();
    if (q.state && !q.endpoint.isEmpty())
        index = m_prefix + "i:es:" + q.endpoint.toUtf8() + ":" + state;
    else if (!q.endpoint.isEmpty())
        index = m_prefix + "i:e:" + q.endpoint.toUtf8();
    else if (q.state)
        index = m_prefix + "i:s:" + state;
    else
        index = m_prefix + "i:all";

    // Keys newest first; a glob filters as it goes (ZSCAN's MATCH would lose the order).
    const QRegularExpression glob(q.glob.isEmpty() ? QString()
                                                   : QRegularExpression::wildcardToRegularExpression(
                                                         q.glob, QRegularExpression::UnanchoredWildcardConversion));
    const QRegularExpression anchored(glob.pattern().isEmpty() ? QString() : u"\\A(?:"_qs + glob.pattern() + u")\\z"_qs);
    QList<QByteArray> keys;
    qint64 skipped = 0;
    const qint64 chunk = q.glob.isEmpty() ? q.limit : 1000;
    for (qint64 start = q.glob.isEmpty() ? q.offset : 0;; start += chunk) {
        auto r = command({"ZREVRANGE", index, num(start), num(start + chunk - 1)}, false);
        if (!r)
            return r.error();
        const redisReply *array = r->get();
        for (size_t i = 0; i < array->elements && keys.size() < q.limit; ++i) {
            const QByteArray key = text(array->element[i]);
            if (!q.glob.isEmpty()) {
                if (!anchored.match(QString::fromUtf8(key)).hasMatch())
                    continue;
                if (skipped++ < q.offset)
                    continue;
            }
            keys.append(key);
        }
        if (q.glob.isEmpty() || keys.size() >= q.limit || qint64(array->elements) < chunk)
            break;
    }

    // One round trip for all the records.
    QList<QByteArray> hmget{"HMGET", QByteArray()};
    hmget += kSummaryFields;
    auto context = contextFor(m_prefix + "k:");
    if (!context)
        return context.error();
    redisContext *c = *context;
    for (const QByteArray &key : keys) {
        hmget[1] = m_prefix + "k:" + key;
        std::vector<const char *> argv;
        std::vector<size_t> lengths;
        for (const auto &a : hmget) {
            argv.push_back(a.constData());
            lengths.push_back(size_t(a.size()));
        }
        redisAppendCommandArgv(c, int(argv.size()), argv.data(), lengths.data());
    }
    QList<KeyRecord> records;
    for (qsizetype i = 0; i < keys.size(); ++i) {
        void *raw = nullptr;
        if (redisGetReply(c, &raw) != REDIS_OK || !raw) {
            const Error error = failure(QString::fromUtf8(c->errstr), false);
            lost(c);
            return error;
        }
        Reply reply(static_cast<redisReply *>(raw), freeReplyObject);
        if (reply->type == REDIS_REPLY_ERROR) {
            if (m_cluster)
                m_cluster->markStale(); // MOVED after a failover: the next page asks the new master
            return makeError(ErrorCode::Unavailable,
                             u"Redis %1: %2"_qs.arg(
                                 m_url.display(), QString::fromUtf8(reply->str, int(reply->len))));
        }
        QHash<QByteArray, QByteArray> fields;
        for (size_t f = 0; f < reply->elements && f < size_t(kSummaryFields.size()); ++f)
            if (reply->element[f]->type == REDIS_REPLY_STRING)
                fields.insert(kSummaryFields.at(qsizetype(f)), text(reply->element[f]));
        if (fields.isEmpty())
            continue; // expired between the index read and now
        records.append(recordFrom(fields));
    }
    return records;
}

Result<StateCounts> RedisStore::countKeys(const QString &endpoint)
{
    if (auto purged = purgeSlice(); !purged)
        return purged.error();
    StateCounts counts;
    qint64 *slots[] = {&counts.processing, &counts.completed, &counts.failed, &counts.reset};
    for (int s = 0; s < 4; ++s) {
        const QByteArray state = toString(KeyState(s)).toLatin1();
        const QByteArray index = endpoint.isEmpty() ? m_prefix + "i:s:" + state
                                                    : m_prefix + "i:es:" + endpoint.toUtf8() + ":" + state;
        auto r = command({"ZCARD", index}, false);
        if (!r)
            return r.error();
        *slots[s] = r->get()->integer;
    }
    return counts;
}

Result<OperatorVerdict> RedisStore::applyOperator(const QString &key, OperatorAction action, bool force,
                                                  const QString &detail)
{
    const QByteArray name = action == OperatorAction::Reset       ? "reset"
                            : action == OperatorAction::ForceFail ? "force-fail"
                                                                  : "delete";
    auto r = script("operator", {m_prefix, key.toUtf8(), name, force ? "1" : "0", detail.toUtf8(),
                                 num(kHistoryCap)},
                    true);
    if (!r)
        return r.error();
    const QByteArray verdict = text(r->get());
    if (verdict == "accept") return OperatorVerdict::Accept;
    if (verdict == "wrong-state") return OperatorVerdict::WrongState;
    return OperatorVerdict::Missing;
}

Result<qint64> RedisStore::purgeExpired()
{
    qint64 total = 0;
    for (;;) {
        auto n = purgeSlice();
        if (!n)
            return n.error();
        total += *n;
        if (*n < 5000)
            return total;
    }
}

Result<void> RedisStore::appendDeliveries(const QList<DeliveryEvent> &events)
{
    const QByteArray stream = m_prefix + "log";
    const QByteArray maxLen = num(m_options.logMaxLength);
    auto context = contextFor(stream);
    if (!context)
        return context.error();
    redisContext *c = *context;
    for (const DeliveryEvent &e : events) {
        const QList<QByteArray> args{"XADD", stream, "MAXLEN", "~", maxLen, "*",
                                     "at", num(e.atMs), "e", e.endpoint.toUtf8(), "k", e.key.toUtf8(),
                                     "o", toString(e.outcome).toLatin1(), "s", num(e.status),
                                     "l", num(e.latencyUs), "t", num(e.token), "i", e.instance.toUtf8(),
                                     "d", e.detail.toUtf8(), "b", e.payload};
        std::vector<const char *> argv;
        std::vector<size_t> lengths;
        for (const auto &a : args) {
            argv.push_back(a.constData());
            lengths.push_back(size_t(a.size()));
        }
        redisAppendCommandArgv(c, int(argv.size()), argv.data(), lengths.data());
    }
    QString refused;
    for (qsizetype i = 0; i < events.size(); ++i) {
        void *raw = nullptr;
        if (redisGetReply(c, &raw) != REDIS_OK || !raw) {
            const Error error = failure(QString::fromUtf8(c->errstr), true);
            lost(c);
            return error;
        }
        Reply reply(static_cast<redisReply *>(raw), freeReplyObject);
        if (reply->type == REDIS_REPLY_ERROR && refused.isEmpty())
            refused = QString::fromUtf8(reply->str, int(reply->len));
    }
    if (!refused.isEmpty()) {
        if (m_cluster)
            m_cluster->markStale();
        return makeError(ErrorCode::Unavailable, u"Redis %1: %2"_qs.arg(m_url.display(), refused));
    }
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
            e.endpoint = QString::fromUtf8(f.value("e"));
            e.key = QString::fromUtf8(f.value("k"));
            if ((!q.key.isEmpty() && e.key != q.key) || (!q.endpoint.isEmpty() && e.endpoint != q.endpoint))
                continue;
            e.outcome = outcomeFromString(QString::fromLatin1(f.value("o"))).value_or(Outcome::Rejected);
            e.status = f.value("s").toInt();
            e.latencyUs = f.value("l").toLongLong();
            e.token = f.value("t").toLongLong();
            e.instance = QString::fromUtf8(f.value("i"));
            e.detail = QString::fromUtf8(f.value("d"));
            e.payload = f.value("b");
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

} // namespace idem
