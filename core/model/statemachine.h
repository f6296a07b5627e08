#pragma once

#include "model/keyrecord.h"

namespace idem {

enum class OnFailed { Reprocess, Reject };
enum class OnMismatch { Reject, Ignore };

struct ClaimPolicy
{
    OnFailed onFailed = OnFailed::Reprocess;
    OnMismatch onMismatch = OnMismatch::Reject;
    qint64 leaseMs = 60'000;
    qint64 ttlMs = 7LL * 24 * 3600 * 1000;
};

// What an arriving delivery does to its key. Pure: every backend asks this same function (or,
// for Redis, a Lua script checked against it by the contract suite) inside its atomic step.
enum class ClaimAction {
    Create,     // no live record: create it in `processing` with token 1 (or old token + 1)
    Reclaim,    // take over an existing record: new token, new lease, back to `processing`
    Replay,     // answer with the stored result
    InProgress, // somebody holds a live lease: come back later
    Mismatch,   // same key, other payload: refuse, leave the record alone
};

struct ClaimDecision
{
    ClaimAction action = ClaimAction::Create;
    Outcome outcome = Outcome::Processed;
    friend bool operator==(const ClaimDecision &, const ClaimDecision &) = default;
};

ClaimDecision decideClaim(const KeyRecord *existing, QByteArrayView fingerprint, qint64 nowMs,
                          const ClaimPolicy &policy);

// A worker reporting its processing result. Only the holder of the current token may finish.
enum class FinishVerdict {
    Accept,
    Repeated,      // this token already finished the key with this same result (a retried finish)
    StaleToken,    // the lease was taken over: the newer claim's result wins
    NotProcessing, // the key is not being processed (already finished, reset, ...)
    Missing,       // no live record
};

// A finish may be sent again after an answer was lost (a timeout, a dropped connection): the
// same token asking for the state and result the key already has is Repeated, not refused.
FinishVerdict decideFinish(const KeyRecord *existing, qint64 token, KeyState state,
                           const StoredResult &result, qint64 nowMs);
// Accept and Repeated both mean: the result asked for is the one stored.
inline bool finishStored(FinishVerdict verdict)
{
    return verdict == FinishVerdict::Accept || verdict == FinishVerdict::Repeated;
}

// Operator actions (dashboard, CLI).
enum class OperatorAction { Reset, ForceFail, Delete };
enum class OperatorVerdict { Accept, WrongState, Missing, Leased };

// Reset accepts failed keys (and, with force, completed ones or stuck processing ones);
// ForceFail accepts stuck processing keys; Delete accepts any live key. Nothing that would let a
// key run again is done to a processing key whose lease is live: a run may be going, and the
// guarantee (at most one run per live lease) holds against operators too — Leased. Accepted,
// the next delivery ran the key beside the run still going.
OperatorVerdict decideOperator(const KeyRecord *existing, OperatorAction action, bool force,
                               qint64 nowMs);

// Why an operator's action was refused with OperatorVerdict::Leased, naming what was not done.
QString leasedMessage(const QString &key, const QString &notDone);

QString toString(ClaimAction action);
QString toString(FinishVerdict verdict);

} // namespace idem
