#include "store/redisprotocol.h"

#include <QCryptographicHash>
#include <QFile>

#include <hiredis.h>

namespace idem::redis {

namespace {

QByteArray num(qint64 v)
{
    return QByteArray::number(v);
}

// The order of SUMMARY in claim.lua.
const QByteArray kSummary[] = {"key",     "endpoint",    "provider",   "state",      "fingerprint",
                               "token",   "attempts",    "created",    "updated",    "lease_until",
                               "expires_at", "res_status", "res_headers", "res_body", "error"};
constexpr size_t kSummarySize = std::size(kSummary);

ClaimAction actionFrom(const QByteArray &text)
{
    if (text == "create") return ClaimAction::Create;
    if (text == "reclaim") return ClaimAction::Reclaim;
    if (text == "replay") return ClaimAction::Replay;
    if (text == "in-progress") return ClaimAction::InProgress;
    return ClaimAction::Mismatch;
}

Error unexpected(const char *script)
{
    return makeError(ErrorCode::Unavailable, u"Redis: unexpected answer from %1.lua"_qs.arg(QLatin1String(script)));
}

} // namespace

QByteArray text(const redisReply *r)
{
    return r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS)
               ? QByteArray(r->str, qsizetype(r->len))
               : QByteArray();
}

KeyRecord recordFrom(const QHash<QByteArray, QByteArray> &f)
{
    KeyRecord r;
    r.key = QString::fromUtf8(f.value("key"));
    r.endpoint = QString::fromUtf8(f.value("endpoint"));
    r.provider = QString::fromUtf8(f.value("provider"));
    r.state = keyStateFromString(QString::fromLatin1(f.value("state"))).value_or(KeyState::Failed);
    r.fingerprint = f.value("fingerprint");
    r.token = f.value("token").toLongLong();
    r.attempts = f.value("attempts").toInt();
    r.createdMs = f.value("created").toLongLong();
    r.updatedMs = f.value("updated").toLongLong();
    r.leaseUntilMs = f.value("lease_until").toLongLong();
    r.expiresAtMs = f.value("expires_at").toLongLong();
    r.request.method = f.value("req_method");
    r.request.path = f.value("req_path");
    r.request.headers = headersFromJson(parseJsonArray(f.value("req_headers")));
    r.request.body = f.value("req_body");
    r.result.status = f.value("res_status").toInt();
    r.result.headers = headersFromJson(parseJsonArray(f.value("res_headers")));
    r.result.body = f.value("res_body");
    r.error = QString::fromUtf8(f.value("error"));
    r.history = historyFromJson(parseJsonArray(f.value("history")));
    return r;
}

Result<QHash<QByteArray, Script>> scripts()
{
    QFile commonFile(u":/redis/common.lua"_qs);
    if (!commonFile.open(QIODevice::ReadOnly))
        return makeError(ErrorCode::Internal, u"the Redis scripts are missing from the resources"_qs);
    const QByteArray common = commonFile.readAll();
    QHash<QByteArray, Script> loaded;
    for (const char *name : {"claim", "finish", "operator", "purge", "import"}) {
        QFile file(u":/redis/%1.lua"_qs.arg(QLatin1String(name)));
        if (!file.open(QIODevice::ReadOnly))
            return makeError(ErrorCode::Internal, u"the Redis script %1.lua is missing"_qs.arg(QLatin1String(name)));
        Script script;
        script.source = common + "\n" + file.readAll();
        script.sha = QCryptographicHash::hash(script.source, QCryptographicHash::Sha1).toHex();
        loaded.insert(name, script);
    }
    return loaded;
}

QList<QByteArray> claimArgs(const QByteArray &prefix, const ClaimRequest &req)
{
    return {prefix, req.key.toUtf8(), req.endpoint.toUtf8(), req.provider.toUtf8(),
            req.fingerprint, num(req.policy.leaseMs), num(req.policy.ttlMs),
            req.policy.onFailed == OnFailed::Reprocess ? "reprocess" : "reject",
            req.policy.onMismatch == OnMismatch::Reject ? "reject" : "ignore",
            req.request.method, req.request.path, compactJson(headersToJson(req.request.headers)),
            req.request.body, num(kHistoryCap)};
}

Result<ClaimResult> claimResult(const redisReply *reply, const ClaimRequest &req)
{
    if (!reply || reply->type != REDIS_REPLY_ARRAY || reply->elements < 4)
        return unexpected("claim");
    ClaimResult result;
    result.decision.action = actionFrom(text(reply->element[0]));
    result.decision.outcome = outcomeFromString(QString::fromLatin1(text(reply->element[1]))).value_or(Outcome::Mismatch);
    // Every answer ends with Redis's clock at the decision.
    result.storeNowMs = text(reply->element[reply->elements - 1]).toLongLong();
    switch (result.decision.action) {
    case ClaimAction::Create:
        if (reply->elements != 4 || reply->element[2]->type != REDIS_REPLY_INTEGER)
            return unexpected("claim");
        result.record = claimedRecord(nullptr, req, result.decision, reply->element[2]->integer, result.storeNowMs);
        return result;
    case ClaimAction::Reclaim: {
        if (reply->elements != 7 || reply->element[2]->type != REDIS_REPLY_INTEGER)
            return unexpected("claim");
        KeyRecord before;
        before.attempts = text(reply->element[3]).toInt();
        before.createdMs = text(reply->element[4]).toLongLong();
        before.history = historyFromJson(parseJsonArray(text(reply->element[5])));
        result.record = claimedRecord(&before, req, result.decision, reply->element[2]->integer, result.storeNowMs);
        return result;
    }
    case ClaimAction::Replay:
    case ClaimAction::InProgress:
    case ClaimAction::Mismatch:
        break;
    }
    if (reply->elements != 3 + kSummarySize)
        return unexpected("claim");
    QHash<QByteArray, QByteArray> fields;
    for (size_t i = 0; i < kSummarySize; ++i)
        fields.insert(kSummary[i], text(reply->element[i + 2]));
    result.record = recordFrom(fields);
    return result;
}

QList<QByteArray> finishArgs(const QByteArray &prefix, const FinishRequest &req)
{
    return {prefix, req.key.toUtf8(), num(req.token), toString(req.state).toLatin1(),
            num(req.result.status), compactJson(headersToJson(req.result.headers)),
            req.result.body, req.error.toUtf8(), num(kHistoryCap)};
}

Result<FinishVerdict> finishVerdict(const redisReply *reply)
{
    const QByteArray verdict = text(reply);
    if (verdict == "accept") return FinishVerdict::Accept;
    if (verdict == "repeated") return FinishVerdict::Repeated;
    if (verdict == "stale-token") return FinishVerdict::StaleToken;
    if (verdict == "not-processing") return FinishVerdict::NotProcessing;
    if (verdict == "missing") return FinishVerdict::Missing;
    return unexpected("finish");
}

} // namespace idem::redis
