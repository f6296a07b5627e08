#pragma once

#include "model/keyrecord.h"
#include "model/statemachine.h"
#include "util/result.h"

#include <QList>
#include <QString>

#include <functional>
#include <optional>

namespace idem {

struct ClaimRequest
{
    QString key;
    QString endpoint;
    QString provider;
    QByteArray fingerprint;
    StoredRequest request; // kept on the record when this delivery wins the claim
    ClaimPolicy policy;
    qint64 nowMs = 0;
};

struct ClaimResult
{
    ClaimDecision decision;
    KeyRecord record; // the record after the step (stored result for Replay, lease for InProgress)
    bool claimed() const
    {
        return decision.action == ClaimAction::Create || decision.action == ClaimAction::Reclaim;
    }
};

// The record a Create or Reclaim leaves: `current` is the record before (null when absent), the
// token is the backend's new fencing token. SQLite and PostgreSQL write this; claim.lua mirrors it.
KeyRecord claimedRecord(const KeyRecord *current, const ClaimRequest &request,
                        const ClaimDecision &decision, qint64 token);

class IdempotencyStore;
// Resets every failed key (of `endpoint`, or all), a page at a time, telling `onReset` each key.
// Returns how many were reset. Shared by `keys reset --all-failed` and the window.
Result<qint64> resetFailedKeys(IdempotencyStore &store, const QString &endpoint, const QString &detail,
                               const std::function<void(const QString &key)> &onReset = {});

struct FinishRequest
{
    QString key;
    qint64 token = 0;
    KeyState state = KeyState::Completed; // Completed or Failed
    StoredResult result;
    QString error;
    qint64 nowMs = 0;
};

struct KeyQuery
{
    std::optional<KeyState> state;
    QString endpoint; // empty: all
    QString glob;     // empty: all; shell glob on the stored key (* ? [...])
    int limit = 100;
    int offset = 0;
    qint64 nowMs = 0;
};

struct StateCounts
{
    qint64 processing = 0;
    qint64 completed = 0;
    qint64 failed = 0;
    qint64 reset = 0;
    qint64 total() const { return processing + completed + failed + reset; }
};

struct DeliveryQuery
{
    QString key;      // empty: all keys
    QString endpoint; // empty: all endpoints
    qint64 sinceMs = 0;
    int limit = 1000; // newest first
};

// One connection to an idempotency store. Every transition is atomic in the store, so any
// number of connections, threads and processes may share one store. An instance is NOT
// thread-safe: it belongs to one thread at a time (StorePool gives each worker its own).
// Errors are values: Unavailable (could not reach / store error) or InDoubt (may have applied).
class IdempotencyStore
{
public:
    virtual ~IdempotencyStore() = default;

    // Atomically: read the key, ask decideClaim(), apply. Every delivery counts in `attempts`
    // except a mismatch, which leaves the record untouched.
    virtual Result<ClaimResult> claim(const ClaimRequest &request) = 0;
    // complete/fail, guarded by the fencing token (decideFinish()).
    virtual Result<FinishVerdict> finish(const FinishRequest &request) = 0;
    virtual Result<std::optional<KeyRecord>> key(const QString &key, qint64 nowMs) = 0;
    virtual Result<QList<KeyRecord>> listKeys(const KeyQuery &query) = 0;
    virtual Result<StateCounts> countKeys(const QString &endpoint, qint64 nowMs) = 0;
    virtual Result<OperatorVerdict> applyOperator(const QString &key, OperatorAction action,
                                                  bool force, const QString &detail,
                                                  qint64 nowMs) = 0;
    virtual Result<qint64> purgeExpired(qint64 nowMs) = 0;
    virtual Result<void> appendDeliveries(const QList<DeliveryEvent> &events) = 0;
    virtual Result<QList<DeliveryEvent>> deliveries(const DeliveryQuery &query) = 0;
    virtual Result<void> ping() = 0;

    // Group commit. A store that has it (SQLite) lets the pool run several calls between
    // beginBatch() and endBatch(): one transaction, each call a savepoint in it, so one commit
    // for all of them. Their callers hear back only after endBatch() succeeded (a failed commit
    // fails every call of the batch), so an answer never tells of a write that was not kept.
    virtual bool batches() const { return false; }
    virtual bool beginBatch() { return false; }
    virtual Result<void> endBatch() { return {}; }
};

} // namespace idem
