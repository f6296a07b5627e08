// The state machine (docs/architecture.md#the-state-machine) as tables: one row per (state, event).
#include "model/statemachine.h"

#include <QTest>

using namespace idem;

namespace {

enum class Given { Absent, Expired, ProcessingLive, ProcessingLeaseOver, Completed, Failed, Reset };

constexpr qint64 kNow = 1'000'000;

std::optional<KeyRecord> make(Given given)
{
    if (given == Given::Absent)
        return std::nullopt;
    KeyRecord r;
    r.key = QStringLiteral("ep:k");
    r.fingerprint = "aaaa";
    r.token = 3;
    r.expiresAtMs = kNow + 10'000;
    switch (given) {
    case Given::Absent: break;
    case Given::Expired: r.state = KeyState::Completed; r.expiresAtMs = kNow; break;
    case Given::ProcessingLive: r.state = KeyState::Processing; r.leaseUntilMs = kNow + 1; break;
    case Given::ProcessingLeaseOver: r.state = KeyState::Processing; r.leaseUntilMs = kNow; break;
    case Given::Completed: r.state = KeyState::Completed; r.result = {200, {}, "ok"}; break;
    case Given::Failed: r.state = KeyState::Failed; r.result = {200, {}, "ok"}; break;
    case Given::Reset: r.state = KeyState::Reset; break;
    }
    return r;
}

} // namespace

Q_DECLARE_METATYPE(Given)
Q_DECLARE_METATYPE(ClaimAction)
Q_DECLARE_METATYPE(Outcome)
Q_DECLARE_METATYPE(FinishVerdict)
Q_DECLARE_METATYPE(KeyState)
Q_DECLARE_METATYPE(OperatorAction)
Q_DECLARE_METATYPE(OperatorVerdict)
Q_DECLARE_METATYPE(OnFailed)
Q_DECLARE_METATYPE(OnMismatch)

class TestStateMachine : public QObject
{
    Q_OBJECT
private Q_SLOTS:
    void claim_data()
    {
        QTest::addColumn<Given>("given");
        QTest::addColumn<bool>("samePayload");
        QTest::addColumn<OnFailed>("onFailed");
        QTest::addColumn<OnMismatch>("onMismatch");
        QTest::addColumn<ClaimAction>("action");
        QTest::addColumn<Outcome>("outcome");
        const auto R = OnFailed::Reprocess, J = OnFailed::Reject;
        const auto MR = OnMismatch::Reject, MI = OnMismatch::Ignore;
        struct Row { const char *name; Given g; bool same; OnFailed f; OnMismatch m; ClaimAction a; Outcome o; };
        const Row rows[] = {
            {"absent → create", Given::Absent, true, R, MR, ClaimAction::Create, Outcome::Processed},
            {"expired → create", Given::Expired, true, R, MR, ClaimAction::Create, Outcome::Processed},
            {"expired, other payload → create", Given::Expired, false, R, MR, ClaimAction::Create, Outcome::Processed},
            {"processing in lease → in-progress", Given::ProcessingLive, true, R, MR, ClaimAction::InProgress, Outcome::InProgress},
            {"processing lease over → recovered", Given::ProcessingLeaseOver, true, R, MR, ClaimAction::Reclaim, Outcome::Recovered},
            {"processing, other payload → mismatch", Given::ProcessingLive, false, R, MR, ClaimAction::Mismatch, Outcome::Mismatch},
            {"completed → replay", Given::Completed, true, R, MR, ClaimAction::Replay, Outcome::Replayed},
            {"completed, other payload → mismatch", Given::Completed, false, R, MR, ClaimAction::Mismatch, Outcome::Mismatch},
            {"completed, other payload, ignore → replay", Given::Completed, false, R, MI, ClaimAction::Replay, Outcome::Replayed},
            {"failed, reprocess → reprocessed", Given::Failed, true, R, MR, ClaimAction::Reclaim, Outcome::Reprocessed},
            {"failed, reject → replay failure", Given::Failed, true, J, MR, ClaimAction::Replay, Outcome::Replayed},
            {"failed, other payload → mismatch", Given::Failed, false, R, MR, ClaimAction::Mismatch, Outcome::Mismatch},
            {"reset → reprocessed", Given::Reset, true, J, MR, ClaimAction::Reclaim, Outcome::Reprocessed},
            {"reset, other payload → reprocessed", Given::Reset, false, J, MR, ClaimAction::Reclaim, Outcome::Reprocessed},
        };
        for (const Row &r : rows)
            QTest::newRow(r.name) << r.g << r.same << r.f << r.m << r.a << r.o;
    }
    void claim()
    {
        QFETCH(Given, given);
        QFETCH(bool, samePayload);
        QFETCH(OnFailed, onFailed);
        QFETCH(OnMismatch, onMismatch);
        QFETCH(ClaimAction, action);
        QFETCH(Outcome, outcome);
        const auto record = make(given);
        ClaimPolicy policy;
        policy.onFailed = onFailed;
        policy.onMismatch = onMismatch;
        const ClaimDecision d = decideClaim(record ? &*record : nullptr,
                                            samePayload ? "aaaa" : "bbbb", kNow, policy);
        QCOMPARE(toString(d.action), toString(action));
        QCOMPARE(toString(d.outcome), toString(outcome));
    }

    void finish_data()
    {
        QTest::addColumn<Given>("given");
        QTest::addColumn<qint64>("token");
        QTest::addColumn<KeyState>("asks");
        QTest::addColumn<bool>("sameResult"); // the result asked for is the one the record holds
        QTest::addColumn<FinishVerdict>("verdict");
        const auto C = KeyState::Completed, F = KeyState::Failed;
        struct Row { const char *name; Given g; qint64 token; KeyState asks; bool same; FinishVerdict v; };
        const Row rows[] = {
            {"absent", Given::Absent, 3, C, true, FinishVerdict::Missing},
            {"expired", Given::Expired, 3, C, true, FinishVerdict::Missing},
            {"processing, holder", Given::ProcessingLive, 3, C, false, FinishVerdict::Accept},
            {"processing, holder fails it", Given::ProcessingLive, 3, F, false, FinishVerdict::Accept},
            {"processing, lease over, still the holder", Given::ProcessingLeaseOver, 3, C, false, FinishVerdict::Accept},
            {"processing, stale token", Given::ProcessingLive, 2, C, false, FinishVerdict::StaleToken},
            {"completed, holder repeats its finish", Given::Completed, 3, C, true, FinishVerdict::Repeated},
            {"completed, holder with another result", Given::Completed, 3, C, false, FinishVerdict::NotProcessing},
            {"completed, holder asks failed", Given::Completed, 3, F, true, FinishVerdict::NotProcessing},
            {"completed, stale", Given::Completed, 1, C, true, FinishVerdict::StaleToken},
            {"failed, holder repeats its finish", Given::Failed, 3, F, true, FinishVerdict::Repeated},
            {"failed, holder asks completed", Given::Failed, 3, C, true, FinishVerdict::NotProcessing},
            {"reset, holder", Given::Reset, 3, C, true, FinishVerdict::NotProcessing},
        };
        for (const Row &r : rows)
            QTest::newRow(r.name) << r.g << r.token << r.asks << r.same << r.v;
    }
    void finish()
    {
        QFETCH(Given, given);
        QFETCH(qint64, token);
        QFETCH(KeyState, asks);
        QFETCH(bool, sameResult);
        QFETCH(FinishVerdict, verdict);
        const auto record = make(given);
        const StoredResult result = sameResult ? StoredResult{200, {}, "ok"} : StoredResult{201, {}, "new"};
        QCOMPARE(toString(decideFinish(record ? &*record : nullptr, token, asks, result, kNow)), toString(verdict));
    }

    void operatorAction_data()
    {
        QTest::addColumn<Given>("given");
        QTest::addColumn<OperatorAction>("action");
        QTest::addColumn<bool>("force");
        QTest::addColumn<OperatorVerdict>("verdict");
        const auto A = OperatorVerdict::Accept, W = OperatorVerdict::WrongState,
                   M = OperatorVerdict::Missing, L = OperatorVerdict::Leased;
        QTest::newRow("reset failed") << Given::Failed << OperatorAction::Reset << false << A;
        QTest::newRow("reset completed") << Given::Completed << OperatorAction::Reset << false << W;
        QTest::newRow("reset completed, force") << Given::Completed << OperatorAction::Reset << true << A;
        QTest::newRow("reset processing") << Given::ProcessingLive << OperatorAction::Reset << false << W;
        // A live lease: a run may be going, nothing that would let the key run again.
        QTest::newRow("reset processing, force")
            << Given::ProcessingLive << OperatorAction::Reset << true << L;
        QTest::newRow("reset stuck, force")
            << Given::ProcessingLeaseOver << OperatorAction::Reset << true << A;
        QTest::newRow("reset reset, force") << Given::Reset << OperatorAction::Reset << true << W;
        QTest::newRow("reset absent") << Given::Absent << OperatorAction::Reset << false << M;
        QTest::newRow("reset expired") << Given::Expired << OperatorAction::Reset << true << M;
        QTest::newRow("force-fail processing")
            << Given::ProcessingLive << OperatorAction::ForceFail << false << L;
        QTest::newRow("force-fail stuck")
            << Given::ProcessingLeaseOver << OperatorAction::ForceFail << false << A;
        QTest::newRow("force-fail completed") << Given::Completed << OperatorAction::ForceFail << true << W;
        QTest::newRow("delete completed") << Given::Completed << OperatorAction::Delete << false << A;
        QTest::newRow("delete processing")
            << Given::ProcessingLive << OperatorAction::Delete << true << L;
        QTest::newRow("delete stuck")
            << Given::ProcessingLeaseOver << OperatorAction::Delete << false << A;
        QTest::newRow("delete absent") << Given::Absent << OperatorAction::Delete << false << M;
    }
    void operatorAction()
    {
        QFETCH(Given, given);
        QFETCH(OperatorAction, action);
        QFETCH(bool, force);
        QFETCH(OperatorVerdict, verdict);
        const auto record = make(given);
        QCOMPARE(int(decideOperator(record ? &*record : nullptr, action, force, kNow)), int(verdict));
    }

    void namesRoundTrip()
    {
        for (int i = 0; i < 8; ++i)
            QCOMPARE(int(*outcomeFromString(toString(Outcome(i)))), i);
        for (int i = 0; i < 4; ++i)
            QCOMPARE(int(*keyStateFromString(toString(KeyState(i)))), i);
        QVERIFY(!outcomeFromString(u"nope"));
    }
};

QTEST_GUILESS_MAIN(TestStateMachine)
#include "tst_statemachine.moc"
