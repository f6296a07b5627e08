#include "store/redisprotocol.h"

#include <QCryptographicHash>
#include <QFile>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstring>

#include <hiredis.h>
#include <poll.h>

namespace idem::redis {

namespace {

QByteArray num(qint64 v)
{
    return QByteArray::number(v);
}

// The SUMMARY of claim.lua's answer, in its order: the meta's columns, then the result and the
// error as stored (fields s and e).
const QByteArray kSummary[] = {"endpoint",    "provider",   "state",   "fingerprint",
                               "token",       "attempts",   "created", "updated",
                               "lease_until", "expires_at", "s",       "e"};
constexpr size_t kSummarySize = std::size(kSummary);
constexpr size_t kSummaryResult = 10; // s, then e

ClaimAction actionFrom(const QByteArray &text)
{
    if (text == "create")
        return ClaimAction::Create;
    if (text == "reclaim")
        return ClaimAction::Reclaim;
    if (text == "replay")
        return ClaimAction::Replay;
    if (text == "in-progress")
        return ClaimAction::InProgress;
    return ClaimAction::Mismatch;
}

Error unexpected(const char *script)
{
    return makeError(ErrorCode::Unavailable,
                     u"Redis: unexpected answer from %1.lua"_qs.arg(QLatin1String(script)));
}

const QByteArray &stateName(KeyState s)
{
    static const QByteArray names[] = {"processing", "completed", "failed", "reset"};
    return names[int(s)];
}

constexpr KeyState kStates[] = {KeyState::Processing, KeyState::Completed, KeyState::Failed,
                                KeyState::Reset};

// "METHOD path\n" + the headers' JSON: the request's head in one field.
QByteArray requestHead(const StoredRequest &r)
{
    return r.method + ' ' + r.path + '\n' + headersJson(r.headers);
}

} // namespace

Argv::Argv(const QList<QByteArray> &args) : held(args)
{
    argv.reserve(size_t(held.size()));
    lengths.reserve(size_t(held.size()));
    for (const QByteArray &a : std::as_const(held)) {
        argv.push_back(a.constData());
        lengths.push_back(size_t(a.size()));
    }
}

QByteArray text(const redisReply *r)
{
    return r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS)
               ? QByteArray(r->str, qsizetype(r->len))
               : QByteArray();
}

QByteArray recordKey(const QByteArray &prefix, const QString &key)
{
    return prefix + '{' + key.toUtf8() + "}:r";
}

QByteArray tokenKey(const QByteArray &prefix, const QString &key)
{
    return prefix + '{' + key.toUtf8() + "}:t";
}

QByteArray endpointIndex(const QByteArray &prefix, const QString &endpoint)
{
    return prefix + "i:k:" + endpoint.toUtf8();
}

QByteArray endpointStateIndex(const QByteArray &prefix, const QString &endpoint, KeyState state)
{
    return prefix + "i:es:" + endpoint.toUtf8() + ':' + stateName(state);
}

QByteArray endpointsSet(const QByteArray &prefix)
{
    return prefix + "i:eps";
}

QString endpointOf(const QString &key)
{
    return key.section(u':', 0, 0);
}

namespace {

// The result as stored (field s: status, headers JSON, body, a line break between), split.
struct ResultColumns
{
    QByteArray status, headers, body;
};

ResultColumns resultColumns(const QByteArray &s)
{
    const qsizetype a = s.indexOf('\n');
    const qsizetype b = a < 0 ? -1 : s.indexOf('\n', a + 1);
    return {a < 0 ? s : s.left(a), a < 0 ? QByteArray() : s.mid(a + 1, b < 0 ? -1 : b - a - 1),
            b < 0 ? QByteArray() : s.mid(b + 1)};
}

} // namespace

bool metaFrom(const QByteArray &m, QHash<QByteArray, QByteArray> &into)
{
    // "state token attempts created updated lease_until expires_at status provider endpoint
    // fingerprint": the scripts' unpackMeta, which refuses what this refuses.
    static const QByteArray names[] = {"state",    "token",       "attempts",   "created",
                                       "updated",  "lease_until", "expires_at", "res_status",
                                       "provider", "endpoint"};
    QHash<QByteArray, QByteArray> read;
    qsizetype at = 0;
    for (size_t i = 0; i < std::size(names); ++i) {
        const qsizetype space = m.indexOf(' ', at);
        if (space < 0)
            return false;
        const QByteArray value = m.mid(at, space - at);
        // As unpackMeta's pattern: digits (the status may be negative), no white space.
        const bool digits = !value.isEmpty() &&
                            std::all_of(value.begin() + (i == 7 && value.startsWith('-') ? 1 : 0),
                                        value.end(), [](char c) { return c >= '0' && c <= '9'; });
        const bool blank =
            std::any_of(value.begin(), value.end(), [](char c) { return std::isspace(uchar(c)); });
        if (blank || (i >= 1 && i <= 7 && !digits) || (i == 0 && value.isEmpty()))
            return false;
        read.insert(names[i], value);
        at = space + 1;
    }
    read.insert("fingerprint", m.mid(at));
    into.insert(read);
    return true;
}

QHash<QByteArray, QByteArray> columnsFrom(const QHash<QByteArray, QByteArray> &record)
{
    QHash<QByteArray, QByteArray> c;
    if (!metaFrom(record.value("m"), c))
        return {};
    const QByteArray q = record.value("q");
    const qsizetype eol = q.indexOf('\n');
    const qsizetype headEnd = eol < 0 ? -1 : q.indexOf('\n', eol + 1);
    c.insert("req_head", headEnd < 0 ? q : q.left(headEnd));
    c.insert("req_body", headEnd < 0 ? QByteArray() : q.mid(headEnd + 1));
    if (const QByteArray stored = record.value("s"); !stored.isEmpty()) {
        const ResultColumns result = resultColumns(stored);
        c.insert("res_status", result.status);
        c.insert("res_headers", result.headers);
        c.insert("res_body", result.body);
    }
    c.insert("error", record.value("e"));
    c.insert("history", record.value("h"));
    return c;
}

namespace {

// A record from its columns (those of layout v2: the meta's, req_head req_body res_status
// res_headers res_body error history), each read by `column(name)`, empty when there is none.
template <typename Column> KeyRecord recordFromColumns(const QString &key, const Column &column)
{
    KeyRecord r;
    r.key = key;
    r.endpoint = QString::fromUtf8(column("endpoint"));
    r.provider = QString::fromUtf8(column("provider"));
    r.state = keyStateFromString(QString::fromLatin1(column("state"))).value_or(KeyState::Failed);
    r.fingerprint = column("fingerprint");
    r.token = column("token").toLongLong();
    r.attempts = column("attempts").toInt();
    r.createdMs = column("created").toLongLong();
    r.updatedMs = column("updated").toLongLong();
    r.leaseUntilMs = column("lease_until").toLongLong();
    r.expiresAtMs = column("expires_at").toLongLong();
    const QByteArray head = column("req_head");
    if (const qsizetype eol = head.indexOf('\n'); eol >= 0) {
        const QByteArray line = head.left(eol);
        const qsizetype space = line.indexOf(' ');
        r.request.method = line.left(space);
        r.request.path = space < 0 ? QByteArray() : line.mid(space + 1);
        r.request.headers = headersFromJson(parseJsonArray(head.mid(eol + 1)));
    }
    r.request.body = column("req_body");
    r.result.status = column("res_status").toInt();
    if (const QByteArray headers = column("res_headers"); !headers.isEmpty())
        r.result.headers = headersFromJson(parseJsonArray(headers));
    r.result.body = column("res_body");
    r.error = QString::fromUtf8(column("error"));
    if (const QByteArray history = column("history"); !history.isEmpty())
        r.history = historyFromJson(parseJsonArray(history));
    return r;
}

} // namespace

KeyRecord recordFrom(const QString &key, const QHash<QByteArray, QByteArray> &fields)
{
    const QHash<QByteArray, QByteArray> columns = columnsFrom(fields);
    return recordFromColumns(key, [&columns](const char *name) { return columns.value(name); });
}

Result<QHash<QByteArray, Script>> scripts()
{
    QFile commonFile(u":/redis/common.lua"_qs);
    if (!commonFile.open(QIODevice::ReadOnly))
        return makeError(ErrorCode::Internal,
                         u"the Redis scripts are missing from the resources"_qs);
    const QByteArray common = "local CAP = " + num(kHistoryCap) + "\n" + commonFile.readAll();
    QHash<QByteArray, Script> loaded;
    for (const char *name :
         {"claim", "finish", "operator", "import", "migrate", "migrate3", "tombstone", "unindex"}) {
        QFile file(u":/redis/%1.lua"_qs.arg(QLatin1String(name)));
        if (!file.open(QIODevice::ReadOnly))
            return makeError(ErrorCode::Internal,
                             u"the Redis script %1.lua is missing"_qs.arg(QLatin1String(name)));
        Script script;
        script.source = common + "\n" + file.readAll();
        script.sha = QCryptographicHash::hash(script.source, QCryptographicHash::Sha1).toHex();
        loaded.insert(name, script);
    }
    return loaded;
}

QList<QByteArray> claimArgs(const QByteArray &prefix, const ClaimRequest &req)
{
    QByteArray policy(2, 'X');
    if (req.policy.onFailed == OnFailed::Reprocess)
        policy[0] = 'R';
    policy[1] = req.policy.onMismatch == OnMismatch::Reject ? 'M' : 'I';
    return {"1",
            recordKey(prefix, req.key),
            req.endpoint.toUtf8(),
            req.provider.toUtf8(),
            req.fingerprint,
            num(req.policy.leaseMs),
            num(req.policy.ttlMs),
            policy,
            requestHead(req.request) + '\n' + req.request.body};
}

Result<ClaimResult> claimResult(const redisReply *reply, const ClaimRequest &req)
{
    if (!reply || reply->type != REDIS_REPLY_ARRAY || reply->elements < 4)
        return unexpected("claim");
    ClaimResult result;
    result.decision.action = actionFrom(text(reply->element[0]));
    result.decision.outcome =
        outcomeFromString(QString::fromLatin1(text(reply->element[1]))).value_or(Outcome::Mismatch);
    switch (result.decision.action) {
    case ClaimAction::Create:
        if (reply->elements != 4 || reply->element[2]->type != REDIS_REPLY_INTEGER)
            return unexpected("claim");
        result.storeNowMs = text(reply->element[3]).toLongLong();
        result.record = claimedRecord(nullptr, req, result.decision, reply->element[2]->integer,
                                      result.storeNowMs);
        return result;
    case ClaimAction::Reclaim: {
        if (reply->elements != 8 || reply->element[2]->type != REDIS_REPLY_INTEGER)
            return unexpected("claim");
        result.storeNowMs = text(reply->element[6]).toLongLong();
        KeyRecord before;
        before.attempts = text(reply->element[3]).toInt();
        before.createdMs = text(reply->element[4]).toLongLong();
        before.history = historyFromJson(parseJsonArray(text(reply->element[5])));
        before.state = keyStateFromString(QString::fromLatin1(text(reply->element[7])))
                           .value_or(KeyState::Failed);
        result.record = claimedRecord(&before, req, result.decision, reply->element[2]->integer,
                                      result.storeNowMs);
        return result;
    }
    case ClaimAction::Replay:
    case ClaimAction::InProgress:
    case ClaimAction::Mismatch:
        break;
    }
    // After the store's clock, when Redis refused to count the delivery (out of memory): why.
    if (reply->elements != 3 + kSummarySize && reply->elements != 4 + kSummarySize)
        return unexpected("claim");
    result.storeNowMs = text(reply->element[2 + kSummarySize]).toLongLong();
    if (reply->elements == 4 + kSummarySize)
        result.uncounted =
            u"Redis: "_qs + QString::fromUtf8(text(reply->element[3 + kSummarySize]));
    // Read in place, by column name: on every duplicate's path, so no map of the columns.
    const redisReply *const *summary = reply->element + 2;
    const ResultColumns stored = resultColumns(text(summary[kSummaryResult]));
    result.record = recordFromColumns(req.key, [&](const char *name) -> QByteArray {
        if (std::strcmp(name, "res_status") == 0)
            return stored.status;
        if (std::strcmp(name, "res_headers") == 0)
            return stored.headers;
        if (std::strcmp(name, "res_body") == 0)
            return stored.body;
        if (std::strcmp(name, "error") == 0)
            return text(summary[kSummaryResult + 1]);
        const auto at = std::find(std::begin(kSummary), std::end(kSummary), name);
        return at < std::begin(kSummary) + kSummaryResult ? text(summary[at - std::begin(kSummary)])
                                                          : QByteArray();
    });
    return result;
}

std::optional<IndexMove> indexMoveOf(const ClaimRequest &req, const ClaimResult &result)
{
    if (result.decision.action != ClaimAction::Create &&
        result.decision.action != ClaimAction::Reclaim)
        return std::nullopt;
    // A new claim may replace a record that expired under index entries of any state.
    return IndexMove{req.key,    req.endpoint,      KeyState::Processing,
                     kAllStates, result.storeNowMs, result.record.expiresAtMs};
}

QList<QByteArray> finishArgs(const QByteArray &prefix, const FinishRequest &req)
{
    return {"1",
            recordKey(prefix, req.key),
            num(req.token),
            stateName(req.state),
            num(req.result.status),
            headersJson(req.result.headers),
            req.result.body,
            req.error.toUtf8()};
}

Result<FinishVerdict> finishVerdict(const redisReply *reply, const FinishRequest &req,
                                    IndexMove *move)
{
    if (reply && reply->type == REDIS_REPLY_ARRAY) {
        if (reply->elements != 3 || text(reply->element[0]) != "accept")
            return unexpected("finish");
        if (move)
            *move = IndexMove{req.key,
                              QString::fromUtf8(text(reply->element[2])),
                              req.state,
                              bit(KeyState::Processing),
                              text(reply->element[1]).toLongLong(),
                              0};
        return FinishVerdict::Accept;
    }
    const QByteArray verdict = text(reply);
    if (verdict == "repeated")
        return FinishVerdict::Repeated;
    if (verdict == "stale-token")
        return FinishVerdict::StaleToken;
    if (verdict == "not-processing")
        return FinishVerdict::NotProcessing;
    if (verdict == "missing")
        return FinishVerdict::Missing;
    return unexpected("finish");
}

QList<QByteArray> operatorArgs(const QByteArray &prefix, const QString &key, OperatorAction action,
                               bool force, const QString &detail)
{
    const QByteArray name = action == OperatorAction::Reset       ? "reset"
                            : action == OperatorAction::ForceFail ? "force-fail"
                                                                  : "delete";
    return {"1", recordKey(prefix, key), name, force ? "1" : "0", detail.toUtf8()};
}

QList<QByteArray> importArgs(const QByteArray &prefix, const KeyRecord &r, qint64 ttlMs,
                             qint64 leaseMs)
{
    return {"1",
            recordKey(prefix, r.key),
            r.endpoint.toUtf8(),
            r.provider.toUtf8(),
            stateName(r.state),
            r.fingerprint,
            num(r.attempts),
            num(r.createdMs),
            num(r.updatedMs),
            num(leaseMs),
            num(ttlMs),
            requestHead(r.request) + '\n' + r.request.body,
            num(r.result.status) + '\n' + headersJson(r.result.headers) + '\n' + r.result.body,
            r.error.toUtf8(),
            compactJson(historyToJson(r.history)),
            num(r.result.status),
            num(r.token)};
}

Result<ImportVerdict> importVerdict(const redisReply *reply, const KeyRecord &r, IndexMove *move)
{
    if (reply && reply->type == REDIS_REPLY_INTEGER && reply->integer == 0)
        return ImportVerdict::Exists;
    if (!reply || reply->type != REDIS_REPLY_ARRAY || reply->elements != 2)
        return unexpected("import");
    if (move)
        // It may replace an expired record still indexed under any state.
        *move = IndexMove{r.key,       r.endpoint,  r.state,
                          kAllStates, r.updatedMs, text(reply->element[1]).toLongLong()};
    return ImportVerdict::Imported;
}

Result<OperatorVerdict> operatorVerdict(const redisReply *reply, const QString &key,
                                        IndexMove *move)
{
    if (reply && reply->type == REDIS_REPLY_ARRAY) {
        if (reply->elements != 5 || text(reply->element[0]) != "accept")
            return unexpected("operator");
        if (move) {
            *move = IndexMove{key,        QString::fromUtf8(text(reply->element[2])), std::nullopt,
                              kAllStates, text(reply->element[1]).toLongLong(),       0};
            if (auto to = keyStateFromString(QString::fromLatin1(text(reply->element[4])))) {
                move->to = *to;
                move->from = bit(
                    keyStateFromString(QString::fromLatin1(text(reply->element[3]))).value_or(*to));
            }
        }
        return OperatorVerdict::Accept;
    }
    const QByteArray verdict = text(reply);
    if (verdict == "wrong-state")
        return OperatorVerdict::WrongState;
    if (verdict == "missing")
        return OperatorVerdict::Missing;
    if (verdict == "leased")
        return OperatorVerdict::Leased;
    return unexpected("operator");
}

void IndexBatch::add(const IndexMove &move)
{
    auto [it, added] = m_moves.try_emplace(move.key, move);
    if (added)
        return;
    IndexMove &m = it->second;
    m.from |= move.from;
    m.to = move.to;
    m.updatedMs = move.updatedMs;
    if (move.expiresAtMs)
        m.expiresAtMs = move.expiresAtMs;
    if (!move.endpoint.isEmpty())
        m.endpoint = move.endpoint;
}

QList<QList<QByteArray>> IndexBatch::commands(const QByteArray &prefix) const
{
    // Per index, the command being built: ZADD with (score, member) pairs, ZREM with members.
    // The index names are made once per endpoint, not per key (this runs on every delivery).
    // A key has one entry in its endpoint's i:k (by expiry, written when the expiry is new),
    // and one in i:es:<ep>:<state> while it is processing, failed or reset (by update).
    struct Commands
    {
        QList<QByteArray> add, remove;
    };
    struct Endpoint
    {
        Commands all;
        std::array<Commands, 4> byState; // completed's stays empty: it has no index
    };
    QHash<QString, Endpoint> byEndpoint;
    for (const auto &[key, m] : m_moves) {
        const QByteArray member = key.toUtf8();
        Endpoint &endpoint = byEndpoint[m.endpoint.isEmpty() ? endpointOf(key) : m.endpoint];
        if (!m.to)
            endpoint.all.remove << member;
        else if (m.expiresAtMs)
            endpoint.all.add << num(m.expiresAtMs) << member;
        for (KeyState s : kStates) {
            if (s == KeyState::Completed)
                continue;
            if (m.to && *m.to == s)
                endpoint.byState[size_t(s)].add << num(m.updatedMs) << member;
            else if (m.from & bit(s))
                endpoint.byState[size_t(s)].remove << member;
        }
    }
    QList<QList<QByteArray>> commands;
    auto append = [&](const Commands &c, const QByteArray &index) {
        if (!c.remove.isEmpty())
            commands.append(QList<QByteArray>{"ZREM", index} + c.remove);
        if (!c.add.isEmpty())
            commands.append(QList<QByteArray>{"ZADD", index} + c.add);
    };
    QList<QByteArray> endpoints{"SADD", endpointsSet(prefix)};
    for (auto it = byEndpoint.cbegin(); it != byEndpoint.cend(); ++it) {
        append(it.value().all, endpointIndex(prefix, it.key()));
        if (!it.value().all.add.isEmpty())
            endpoints << it.key().toUtf8();
        for (KeyState s : kStates)
            append(it.value().byState[size_t(s)], endpointStateIndex(prefix, it.key(), s));
    }
    if (endpoints.size() > 2)
        commands.append(endpoints);
    return commands;
}

bool linkClosed(const redisContext *c)
{
    if (c->err || c->fd < 0)
        return true;
    pollfd p{c->fd, POLLIN | POLLRDHUP, 0};
    return ::poll(&p, 1, 0) != 0;
}

} // namespace idem::redis
