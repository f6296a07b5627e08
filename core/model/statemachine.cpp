#include "model/statemachine.h"

namespace idem {

ClaimDecision decideClaim(const KeyRecord *existing, QByteArrayView fingerprint, qint64 nowMs,
                          const ClaimPolicy &policy)
{
    // An expired record counts as absent whatever its state: its TTL outlived every retry.
    if (!existing || existing->expiredAt(nowMs))
        return {ClaimAction::Create, Outcome::Processed};

    // An operator reset means "take the next delivery, whatever it carries".
    if (existing->state == KeyState::Reset)
        return {ClaimAction::Reclaim, Outcome::Reprocessed};

    if (policy.onMismatch == OnMismatch::Reject && existing->fingerprint != fingerprint)
        return {ClaimAction::Mismatch, Outcome::Mismatch};

    switch (existing->state) {
    case KeyState::Processing:
        if (existing->leaseUntilMs > nowMs)
            return {ClaimAction::InProgress, Outcome::InProgress};
        return {ClaimAction::Reclaim, Outcome::Recovered};
    case KeyState::Completed:
        return {ClaimAction::Replay, Outcome::Replayed};
    case KeyState::Failed:
        if (policy.onFailed == OnFailed::Reprocess)
            return {ClaimAction::Reclaim, Outcome::Reprocessed};
        return {ClaimAction::Replay, Outcome::Replayed};
    case KeyState::Reset:
        break;
    }
    return {ClaimAction::Reclaim, Outcome::Reprocessed};
}

FinishVerdict decideFinish(const KeyRecord *existing, qint64 token, KeyState state,
                           const StoredResult &result, qint64 nowMs)
{
    if (!existing || existing->expiredAt(nowMs))
        return FinishVerdict::Missing;
    if (existing->token != token)
        return FinishVerdict::StaleToken;
    // The token holder may finish after its lease ran out as long as nobody took over:
    // the fencing token, not the clock, decides.
    if (existing->state != KeyState::Processing) {
        if (existing->state == state && existing->result.status == result.status
            && existing->result.body == result.body)
            return FinishVerdict::Repeated;
        return FinishVerdict::NotProcessing;
    }
    return FinishVerdict::Accept;
}

OperatorVerdict decideOperator(const KeyRecord *existing, OperatorAction action, bool force,
                               qint64 nowMs)
{
    if (!existing || existing->expiredAt(nowMs))
        return OperatorVerdict::Missing;
    const OperatorVerdict unlessRunning =
        existing->state == KeyState::Processing && existing->leaseUntilMs > nowMs
            ? OperatorVerdict::Leased
            : OperatorVerdict::Accept;
    switch (action) {
    case OperatorAction::Delete:
        return unlessRunning;
    case OperatorAction::ForceFail:
        return existing->state == KeyState::Processing ? unlessRunning
                                                       : OperatorVerdict::WrongState;
    case OperatorAction::Reset:
        if (existing->state == KeyState::Failed)
            return OperatorVerdict::Accept;
        if (force && existing->state != KeyState::Reset)
            return unlessRunning;
        return OperatorVerdict::WrongState;
    }
    return OperatorVerdict::WrongState;
}

QString leasedMessage(const QString &key, const QString &notDone)
{
    return u"%1 is being processed and its lease has not ended (a run may still be going): not %2; "
           u"once the lease ends it can be"_qs.arg(key, notDone);
}

QString toString(ClaimAction action)
{
    switch (action) {
    case ClaimAction::Create: return u"create"_qs;
    case ClaimAction::Reclaim: return u"reclaim"_qs;
    case ClaimAction::Replay: return u"replay"_qs;
    case ClaimAction::InProgress: return u"in-progress"_qs;
    case ClaimAction::Mismatch: return u"mismatch"_qs;
    }
    return {};
}

QString toString(FinishVerdict verdict)
{
    switch (verdict) {
    case FinishVerdict::Accept: return u"accept"_qs;
    case FinishVerdict::Repeated: return u"repeated"_qs;
    case FinishVerdict::StaleToken: return u"stale-token"_qs;
    case FinishVerdict::NotProcessing: return u"not-processing"_qs;
    case FinishVerdict::Missing: return u"missing"_qs;
    }
    return {};
}

} // namespace idem
