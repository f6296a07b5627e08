#include "store/idempotencystore.h"


namespace idem {

KeyRecord claimedRecord(const KeyRecord *current, const ClaimRequest &req, const ClaimDecision &decision,
                        qint64 token, qint64 nowMs)
{
    const bool fresh = decision.action == ClaimAction::Create;
    KeyRecord r = fresh || !current ? KeyRecord{} : *current; // a reclaim keeps created, attempts, history
    r.key = req.key;
    r.endpoint = req.endpoint;
    r.provider = req.provider;
    r.state = KeyState::Processing;
    r.fingerprint = req.fingerprint;
    r.token = token;
    r.attempts = fresh ? 1 : r.attempts + 1;
    if (fresh)
        r.createdMs = nowMs;
    r.updatedMs = nowMs;
    r.leaseUntilMs = nowMs + req.policy.leaseMs;
    r.expiresAtMs = nowMs + req.policy.ttlMs;
    r.request = req.request;
    r.result = {};
    r.error.clear();
    const QString event = decision.outcome == Outcome::Recovered     ? u"recovered"_qs
                          : decision.outcome == Outcome::Reprocessed ? u"reprocessed"_qs
                                                                     : u"claimed"_qs;
    appendHistory(r.history, {nowMs, event, token, {}});
    return r;
}

Result<qint64> resetFailedKeys(IdempotencyStore &store, const QString &endpoint, const QString &detail,
                               const std::function<void(const QString &)> &onReset)
{
    qint64 reset = 0;
    KeyQuery q;
    q.state = KeyState::Failed;
    q.endpoint = endpoint;
    q.limit = 500;
    for (;;) {
        auto page = store.listKeys(q);
        if (!page)
            return page.error();
        const qint64 before = reset;
        for (const KeyRecord &r : *page) {
            auto verdict = store.applyOperator(r.key, OperatorAction::Reset, false, detail);
            if (!verdict)
                return verdict.error();
            if (*verdict == OperatorVerdict::Accept) {
                ++reset;
                if (onReset)
                    onReset(r.key);
            }
        }
        // Reset keys leave the failed list; a page with none reset (all taken by others) ends it.
        if (page->isEmpty() || reset == before)
            return reset;
    }
}

Result<QList<ClaimResult>> IdempotencyStore::claimBatch(const QList<ClaimRequest> &requests)
{
    QList<ClaimResult> results;
    for (const ClaimRequest &request : requests) {
        auto r = claim(request);
        if (!r)
            return r.error();
        results.append(std::move(*r));
    }
    return results;
}

Result<QList<FinishVerdict>> IdempotencyStore::finishBatch(const QList<FinishRequest> &requests)
{
    QList<FinishVerdict> verdicts;
    for (const FinishRequest &request : requests) {
        auto v = finish(request);
        if (!v)
            return v.error();
        verdicts.append(*v);
    }
    return verdicts;
}

Result<void> IdempotencyStore::schemaCurrent(const QString &store, qint64 have, qint64 want)
{
    if (have != want)
        return makeError(
            ErrorCode::Internal,
            u"the %1 schema is at version %2, this desk reads and writes version %3"_qs.arg(store)
                .arg(have)
                .arg(want));
    return {};
}

} // namespace idem
