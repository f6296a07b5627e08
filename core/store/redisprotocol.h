#pragma once

#include "store/idempotencystore.h"

#include <QByteArray>
#include <QHash>
#include <QList>

struct redisReply;

namespace idem::redis {

// The Lua scripts of resources/redis, each with common.lua prepended, and their SHA1 (what
// SCRIPT LOAD answers and EVALSHA takes).
struct Script
{
    QByteArray source;
    QByteArray sha;
};
Result<QHash<QByteArray, Script>> scripts(); // by name: claim, finish, operator, purge

// The arguments of claim.lua and finish.lua, and what their answers mean. Shared by the
// blocking RedisStore and the receiver thread's RedisLane, so that both speak the same protocol.
QList<QByteArray> claimArgs(const QByteArray &prefix, const ClaimRequest &request);
Result<ClaimResult> claimResult(const redisReply *reply, const ClaimRequest &request);
QList<QByteArray> finishArgs(const QByteArray &prefix, const FinishRequest &request);
Result<FinishVerdict> finishVerdict(const redisReply *reply);

QByteArray text(const redisReply *reply);
KeyRecord recordFrom(const QHash<QByteArray, QByteArray> &fields);

} // namespace idem::redis
