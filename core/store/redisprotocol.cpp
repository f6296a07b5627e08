#include "store/redisprotocol.h"

#include "store/rediscluster.h"

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

// "METHOD path\n" + the headers' JSON (or their shared name, storedHeadersJson): the request's
// head in one field.
QByteArray requestHead(const StoredRequest &r, bool sharedHeaders)
{
    return r.method + ' ' + r.path + '\n' + storedHeadersJson(r, sharedHeaders);
}

// hiredis's own reply functions (static in hiredis.c), as its plain reader has them.
const redisReplyObjectFunctions &plainReplyFunctions()
{
    static const redisReplyObjectFunctions functions = [] {
        redisReader *plain = redisReaderCreate();
        const redisReplyObjectFunctions copy = *plain->fn;
        redisReaderFree(plain);
        return copy;
    }();
    return functions;
}

void *createBoundedArray(const redisReadTask *task, int elements)
{
    if (elements > kMaxReplyElements)
        return nullptr; // the reader's error: the link goes, nothing is allocated
    return plainReplyFunctions().createArray(task, elements);
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

void guardReader(redisReader *reader)
{
    static redisReplyObjectFunctions guarded = [] {
        redisReplyObjectFunctions functions = plainReplyFunctions();
        functions.createArray = &createBoundedArray;
        return functions;
    }();
    reader->fn = &guarded;
}

QByteArray text(const redisReply *r)
{
    return r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS)
               ? QByteArray(r->str, qsizetype(r->len))
               : QByteArray();
}

Layout::Layout(QByteArray prefix, int buckets) : m_prefix(std::move(prefix))
{
    for (int i = 0; i < buckets; ++i) {
        const int first = i * kSlots / buckets, end = (i + 1) * kSlots / buckets;
        for (int n = 0;; ++n) {
            const QByteArray tag = 'b' + num(i) + '-' + num(n);
            const int slot = crc16(tag) & (kSlots - 1);
            if (slot >= first && slot < end) {
                m_tags.append(m_prefix + '{' + tag + '}');
                break;
            }
        }
    }
}

int Layout::bucketOf(const QString &key) const
{
    return m_tags.size() == 1 ? 0 : int(crc16(key.toUtf8()) % quint16(m_tags.size()));
}

QByteArray Layout::record(const QString &key) const
{
    return m_tags.at(bucketOf(key)) + ":r:" + key.toUtf8();
}

QByteArray Layout::keys(int bucket, const QString &endpoint) const
{
    return m_tags.at(bucket) + ":k:" + endpoint.toUtf8();
}

QByteArray Layout::stateIndex(int bucket, const QString &endpoint, KeyState state) const
{
    return m_tags.at(bucket) + ":s:" + endpoint.toUtf8() + ':' + stateName(state);
}

QByteArray Layout::endpoints(int bucket) const
{
    return m_tags.at(bucket) + ":eps";
}

QList<QByteArray> Layout::indexes(int bucket, const QString &endpoint) const
{
    return {keys(bucket, endpoint), stateIndex(bucket, endpoint, KeyState::Processing),
            stateIndex(bucket, endpoint, KeyState::Failed),
            stateIndex(bucket, endpoint, KeyState::Reset)};
}

QByteArray v3RecordKey(const QByteArray &prefix, const QString &key)
{
    return prefix + '{' + key.toUtf8() + "}:r";
}

QByteArray tokenKey(const QByteArray &prefix, const QString &key)
{
    return prefix + '{' + key.toUtf8() + "}:t";
}

QString keyOfV3Record(const QByteArray &prefix, const QByteArray &name)
{
    if (!name.startsWith(prefix + '{') || !name.endsWith("}:r"))
        return {};
    const QByteArray key = name.mid(prefix.size() + 1, name.size() - prefix.size() - 4);
    // "<endpoint>:<id>", an endpoint name holding no brace: a current record's name
    // (P{b<i>-<n>}:r:<key>) read this way starts with "b<i>-<n>}".
    const qsizetype colon = key.indexOf(':');
    if (colon <= 0 || key.left(colon).contains('}'))
        return {};
    return QString::fromUtf8(key);
}

QString endpointOf(const QString &key)
{
    return key.section(u':', 0, 0);
}

QByteArray sharedKey(const QByteArray &prefix, const QByteArray &ref)
{
    return prefix + "shared:" + ref;
}

QList<QByteArray> sharedArgs(const Layout &layout, const SharedContent &shared)
{
    return {"1", sharedKey(layout.prefix(), shared.ref), shared.content, num(shared.ttlMs)};
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

QByteArrayView requestBody(const QByteArray &q)
{
    const qsizetype eol = q.indexOf('\n');
    const qsizetype headEnd = eol < 0 ? -1 : q.indexOf('\n', eol + 1);
    return headEnd < 0 ? QByteArrayView() : QByteArrayView(q).sliced(headEnd + 1);
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
    c.insert("type", record.value("t"));
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
    r.type = QString::fromUtf8(column("type"));
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
        readStoredHeaders(r.request, head.mid(eol + 1));
    }
    r.request.body = column("req_body");
    r.result.status = column("res_status").toInt();
    readStoredResult(r.result, column("res_headers"), column("res_body"));
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
    auto read = [](const QString &name) -> std::optional<QByteArray> {
        QFile file(u":/redis/%1.lua"_qs.arg(name));
        if (!file.open(QIODevice::ReadOnly))
            return std::nullopt;
        return file.readAll();
    };
    QHash<QByteArray, Script> loaded;
    for (const char *name : {"claim", "finish", "operator", "import", "tombstone", "shared",
                             "migrate4", "lock", "v3/migrate", "v3/migrate3", "v3/drop"}) {
        const QString file = QLatin1String(name);
        const auto common = read(file.startsWith(u"v3/"_qs) ? u"v3/common"_qs : u"common"_qs);
        const auto body = read(file);
        if (!common || !body)
            return makeError(ErrorCode::Internal,
                             u"the Redis script %1.lua is missing from the resources"_qs.arg(file));
        Script script;
        script.source = "local CAP = " + num(kHistoryCap) + "\n" + *common + "\n" + *body;
        script.sha = QCryptographicHash::hash(script.source, QCryptographicHash::Sha1).toHex();
        loaded.insert(name, script);
    }
    return loaded;
}

namespace {

// The record's key, then its bucket's indexes (Layout::indexes), as KEYS of a transition script;
// numkeys first.
QList<QByteArray> transitionKeys(const Layout &layout, const QString &key, bool withEndpoints)
{
    const int bucket = layout.bucketOf(key);
    QList<QByteArray> keys{layout.record(key)};
    keys += layout.indexes(bucket, endpointOf(key));
    if (withEndpoints)
        keys << layout.endpoints(bucket);
    return QList<QByteArray>{num(keys.size())} + keys;
}

} // namespace

QList<QByteArray> claimArgs(const Layout &layout, const ClaimRequest &req, bool sharedHeaders)
{
    QByteArray policy(2, 'X');
    if (req.policy.onFailed == OnFailed::Reprocess)
        policy[0] = 'R';
    policy[1] = req.policy.onMismatch == OnMismatch::Reject ? 'M' : 'I';
    return transitionKeys(layout, req.key, true) +
           QList<QByteArray>{endpointOf(req.key).toUtf8(),
                             req.provider.toUtf8(),
                             req.fingerprint,
                             num(req.policy.leaseMs),
                             num(req.policy.ttlMs),
                             policy,
                             requestHead(req.request, sharedHeaders) + '\n' + req.request.body,
                             req.key.toUtf8(),
                             req.type.toUtf8()};
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

QList<QByteArray> finishArgs(const Layout &layout, const FinishRequest &req, bool sharedResult)
{
    const StoredResult result = storedForm(req.result, sharedResult);
    return transitionKeys(layout, req.key, false) +
           QList<QByteArray>{num(req.token),     stateName(req.state),
                             num(result.status), storedResultHeadersJson(result, sharedResult),
                             result.body,        req.error.toUtf8(),
                             req.key.toUtf8()};
}

Result<FinishVerdict> finishVerdict(const redisReply *reply)
{
    if (reply && reply->type == REDIS_REPLY_ARRAY) {
        if (reply->elements != 3 || text(reply->element[0]) != "accept")
            return unexpected("finish");
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

QList<QByteArray> operatorArgs(const Layout &layout, const QString &key, OperatorAction action,
                               bool force, const QString &detail)
{
    const QByteArray name = action == OperatorAction::Reset       ? "reset"
                            : action == OperatorAction::ForceFail ? "force-fail"
                                                                  : "delete";
    return transitionKeys(layout, key, false) +
           QList<QByteArray>{name, force ? "1" : "0", detail.toUtf8(), key.toUtf8()};
}

Result<OperatorVerdict> operatorVerdict(const redisReply *reply)
{
    if (reply && reply->type == REDIS_REPLY_ARRAY) {
        if (reply->elements != 5 || text(reply->element[0]) != "accept")
            return unexpected("operator");
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

QList<QByteArray> importArgs(const Layout &layout, const KeyRecord &r, qint64 ttlMs, qint64 leaseMs)
{
    return transitionKeys(layout, r.key, true) +
           QList<QByteArray>{endpointOf(r.key).toUtf8(),
                             r.provider.toUtf8(),
                             stateName(r.state),
                             r.fingerprint,
                             num(r.attempts),
                             num(r.createdMs),
                             num(r.updatedMs),
                             num(leaseMs),
                             num(ttlMs),
                             requestHead(r.request, false) + '\n' + r.request.body,
                             num(r.result.status) + '\n' + headersJson(r.result.headers) + '\n' +
                                 r.result.body,
                             r.error.toUtf8(),
                             compactJson(historyToJson(r.history)),
                             num(r.result.status),
                             num(r.token),
                             r.key.toUtf8(),
                             r.type.toUtf8()};
}

Result<ImportVerdict> importVerdict(const redisReply *reply)
{
    if (reply && reply->type == REDIS_REPLY_INTEGER && reply->integer == 0)
        return ImportVerdict::Exists;
    if (!reply || reply->type != REDIS_REPLY_ARRAY || reply->elements != 2)
        return unexpected("import");
    return ImportVerdict::Imported;
}

QHash<QByteArray, QByteArray> fieldsFrom(const redisReply *array)
{
    QHash<QByteArray, QByteArray> fields;
    if (!array || array->type != REDIS_REPLY_ARRAY)
        return fields;
    for (size_t i = 0; i + 1 < array->elements; i += 2)
        fields.insert(text(array->element[i]), text(array->element[i + 1]));
    return fields;
}

std::optional<DeliveryEvent> deliveryFrom(const redisReply *entry, QByteArray *id)
{
    if (!entry || entry->type != REDIS_REPLY_ARRAY || entry->elements != 2 ||
        entry->element[0]->type != REDIS_REPLY_STRING ||
        entry->element[1]->type != REDIS_REPLY_ARRAY)
        return std::nullopt;
    const auto f = fieldsFrom(entry->element[1]);
    if (id)
        *id = text(entry->element[0]);
    DeliveryEvent e;
    e.atMs = f.value("at").toLongLong();
    e.endpoint = QString::fromUtf8(f.value("e"));
    e.key = QString::fromUtf8(f.value("k"));
    e.outcome = outcomeFromString(QString::fromLatin1(f.value("o"))).value_or(Outcome::Rejected);
    e.status = f.value("s").toInt();
    e.latencyUs = f.value("l").toLongLong();
    e.token = f.value("t").toLongLong();
    e.instance = QString::fromUtf8(f.value("i"));
    e.detail = QString::fromUtf8(f.value("d"));
    e.payload = f.value("b");
    e.type = QString::fromUtf8(f.value("y"));
    bool numeric = false;
    const qint64 n = f.value("n", "1").toLongLong(&numeric);
    e.count = numeric ? deliveryCount(n) : 1;
    return e;
}

bool linkClosed(const redisContext *c)
{
    if (c->err || c->fd < 0)
        return true;
    pollfd p{c->fd, POLLIN | POLLRDHUP, 0};
    return ::poll(&p, 1, 0) != 0;
}

} // namespace idem::redis
