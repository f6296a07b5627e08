#include "faults/checker.h"

#include <QMap>

#include <algorithm>

namespace idem::test {

namespace {

// Two runs closer than this are not called overlapping: the desk's HTTP thread closes a forward
// it gave up on asynchronously, so the downstream may see the close a moment after the next
// run's request. Overlaps that break the promise last a run's whole length (100 ms and more).
constexpr qint64 kOverlapToleranceMs = 25;

enum class Cause { Failed, TimedOut, Killed, Unexplained };

QString causeName(Cause cause)
{
    switch (cause) {
    case Cause::Failed:
        return QStringLiteral("after a failed run (downstream 5xx)");
    case Cause::TimedOut:
        return QStringLiteral("after a run the desk cut (forward timeout)");
    case Cause::Killed:
        return QStringLiteral("after its desk was killed holding the lease");
    case Cause::Unexplained:
        return QStringLiteral("UNEXPLAINED");
    }
    return {};
}

class Checker
{
public:
    explicit Checker(const FaultHistory &history) : m_history(history)
    {
        for (const DownstreamRun &run : m_history.runs)
            m_runsByKey[QString::fromLatin1(run.key)].append(run);
        for (auto &runs : m_runsByKey)
            std::sort(runs.begin(), runs.end(),
                      [](const auto &a, const auto &b) { return a.startMs < b.startMs; });
        for (const SenderLog &sender : m_history.senders)
            m_sendersByKey[storedKey(sender.key)].append(sender);
        for (const DownstreamRun &run : m_history.runs)
            m_runByDelivery.insert(run.delivery, run);
        for (const SenderLog &sender : m_history.senders)
            for (const SenderAnswer &answer : sender.answers)
                m_answerByDelivery.insert(answer.delivery, answer);
        for (const InjectedFault &f : m_history.faults)
            if (f.kind == QLatin1String("desk SIGKILL"))
                m_kills.insert(f.target.toLatin1(), f.atMs);
    }

    CheckOutcome run()
    {
        for (int k = 0; k < m_history.keys; ++k)
            checkKey(storedKey(k));
        CheckOutcome outcome;
        outcome.failures = m_failures;
        outcome.summary = summary();
        return outcome;
    }

private:
    QString storedKey(int index) const
    {
        return m_history.endpoint + u':' + QString::fromLatin1(Driver::key(index));
    }
    QString at(qint64 ms) const
    {
        return QStringLiteral("+%1 s").arg(double(ms - m_history.originMs) / 1000.0, 0, 'f', 2);
    }

    QString describe(const DownstreamRun &run) const
    {
        QString end = run.endMs < 0 ? QStringLiteral("never ended") : at(run.endMs);
        QString how;
        if (run.endMs < 0)
            how = QStringLiteral("open");
        else if (run.cut)
            how = QStringLiteral("cut by the desk");
        else
            how = QStringLiteral("answered %1").arg(run.plan.status);
        const QString plan =
            run.plan.kind == RunPlan::Kind::Trickle ? QStringLiteral("trickle")
            : run.plan.delayMs > 1000
                ? QStringLiteral("hang %1 ms").arg(run.plan.delayMs)
                : QStringLiteral("%1 after %2 ms").arg(run.plan.status).arg(run.plan.delayMs);
        return QStringLiteral("%1 token %2 delivery %3 [%4 .. %5] plan %6, %7")
            .arg(QString::fromLatin1(run.instance))
            .arg(run.token)
            .arg(QString::fromLatin1(run.delivery), at(run.startMs), end, plan, how);
    }

    QString historyOf(const QString &key) const
    {
        QString out;
        const QList<DownstreamRun> runs = m_runsByKey.value(key);
        for (qsizetype i = 0; i < runs.size(); ++i)
            out += QStringLiteral("\n    run %1: %2").arg(i + 1).arg(describe(runs.at(i)));
        if (runs.isEmpty())
            out += QStringLiteral("\n    no run");
        QList<SenderAnswer> answers;
        for (const SenderLog &sender : m_sendersByKey.value(key))
            answers += sender.answers;
        std::sort(answers.begin(), answers.end(),
                  [](const auto &a, const auto &b) { return a.atMs < b.atMs; });
        for (const SenderAnswer &a : answers)
            out += QStringLiteral("\n    %1 %2 to %3: %4 %5 %6")
                       .arg(at(a.atMs), QString::fromLatin1(a.delivery),
                            a.slot ? QStringLiteral("b") : QStringLiteral("a"))
                       .arg(a.status)
                       .arg(QString::fromLatin1(a.outcome),
                            a.status ? QString::fromUtf8(a.body.left(160)) : a.error);
        const StoredKey stored = m_history.stored.value(key);
        out += stored.found ? QStringLiteral("\n    store: %1, token %2, result %3 %4")
                                  .arg(stored.state)
                                  .arg(stored.token)
                                  .arg(stored.resultStatus)
                                  .arg(QString::fromUtf8(stored.resultBody.left(160)))
                            : QStringLiteral("\n    store: no record");
        return out;
    }

    // One broken promise of the key being checked; checkKey() reports them with its history.
    void fail(const QString &what) { m_problems.append(what); }

    // Why a key ran again after `previous`.
    Cause causeOf(const DownstreamRun &previous) const
    {
        // Its desk died holding the lease: killed after the run started and before it answered
        // the delivery that ran it (that sender got no answer), so the result may not be stored.
        const qint64 killedAt = m_kills.value(previous.instance, -1);
        const SenderAnswer answer = m_answerByDelivery.value(previous.delivery);
        if (killedAt >= previous.startMs && answer.status == 0 && answer.atMs >= killedAt)
            return Cause::Killed;
        if (previous.cut)
            return Cause::TimedOut;
        if (previous.plan.status >= 500)
            return Cause::Failed;
        return Cause::Unexplained;
    }

    void checkKey(const QString &key)
    {
        const QList<DownstreamRun> runs = m_runsByKey.value(key);
        for (qsizetype i = 1; i < runs.size(); ++i) {
            const DownstreamRun &previous = runs.at(i - 1);
            const DownstreamRun &next = runs.at(i);
            if (previous.endMs < 0 || next.startMs < previous.endMs - kOverlapToleranceMs)
                fail(QStringLiteral("runs %1 and %2 overlap: run %2 started at %3 while run %1 "
                                    "(%4) was still running")
                         .arg(i)
                         .arg(i + 1)
                         .arg(at(next.startMs), QString::fromLatin1(previous.instance)));
            if (previous.token && next.token && next.token <= previous.token)
                fail(QStringLiteral("run %1 has fencing token %2, not above run %3's %4")
                         .arg(i + 1)
                         .arg(next.token)
                         .arg(i)
                         .arg(previous.token));
            const Cause cause = causeOf(previous);
            m_secondRuns[cause] += 1;
            // Its claim came at most the forward timeout before it started, and its lease ran
            // from the claim: a run the desk cut leaves its key to that lease.
            const qint64 leaseEndedMs =
                previous.startMs - m_history.forwardTimeoutMs + m_history.leaseMs;
            // (An answer held back whole: a trickled one sent its status line, the app was done.)
            if (cause == Cause::TimedOut && previous.plan.kind == RunPlan::Kind::Answer &&
                next.startMs < leaseEndedMs)
                fail(QStringLiteral("run %1 started at %2, inside the lease of run %3, which the "
                                    "desk cut at its forward timeout (the app may still be at it; "
                                    "its lease lasted until %4 at the earliest)")
                         .arg(i + 1)
                         .arg(at(next.startMs))
                         .arg(i)
                         .arg(at(leaseEndedMs)));
            if (cause == Cause::Unexplained)
                fail(QStringLiteral("run %1 (%2) is unexplained: run %3 (%4) answered %5 at %6 and "
                                    "%4 was not killed before it answered that delivery")
                         .arg(i + 1)
                         .arg(QString::fromLatin1(next.instance))
                         .arg(i)
                         .arg(QString::fromLatin1(previous.instance))
                         .arg(previous.plan.status)
                         .arg(at(previous.endMs)));
        }
        checkAnswers(key);
        if (!m_problems.isEmpty())
            m_failures.append({key, m_problems, historyOf(key)});
        m_problems.clear();
    }

    void checkAnswers(const QString &key)
    {
        const StoredKey stored = m_history.stored.value(key);
        bool acknowledged = false;
        for (const SenderLog &sender : m_sendersByKey.value(key)) {
            for (const SenderAnswer &a : sender.answers) {
                m_statuses[a.status] += 1;
                if (a.status == 503 && m_runByDelivery.contains(a.delivery))
                    fail(QStringLiteral("delivery %1 was answered 503 (%2) after it ran the "
                                        "processor (run on %3, token %4)")
                             .arg(QString::fromLatin1(a.delivery), QString::fromLatin1(a.outcome),
                                  QString::fromLatin1(m_runByDelivery.value(a.delivery).instance))
                             .arg(m_runByDelivery.value(a.delivery).token));
                if (a.status < 200 || a.status >= 300)
                    continue;
                acknowledged = true;
                if (!stored.found || stored.state != QLatin1String("completed"))
                    fail(QStringLiteral("delivery %1 got %2 but the key is %3 in the store")
                             .arg(QString::fromLatin1(a.delivery))
                             .arg(a.status)
                             .arg(stored.found ? stored.state : QStringLiteral("missing")));
                else if (stored.resultStatus != a.status || stored.resultBody != a.body)
                    fail(QStringLiteral("delivery %1 got %2 %3, the store holds %4 %5")
                             .arg(QString::fromLatin1(a.delivery))
                             .arg(a.status)
                             .arg(QString::fromUtf8(a.body.left(160)))
                             .arg(stored.resultStatus)
                             .arg(QString::fromUtf8(stored.resultBody.left(160))));
            }
            if (sender.result == SenderLog::Result::Refused)
                fail(QStringLiteral("copy %1 was refused: %2 %3")
                         .arg(sender.copy)
                         .arg(sender.last().status)
                         .arg(QString::fromUtf8(sender.last().body.left(200))));
            if (sender.result == SenderLog::Result::GaveUp)
                m_gaveUp += 1;
        }
        if (!acknowledged)
            fail(QStringLiteral("no sender got a 2xx within its patience (liveness)"));
        m_acknowledged += acknowledged;
    }

    QString summary() const
    {
        QString out = QStringLiteral("faults[%1]: %2 keys, %3 senders, %4 deliveries; answers:")
                          .arg(m_history.store)
                          .arg(m_history.keys)
                          .arg(m_history.senders.size())
                          .arg(m_history.deliveries);
        for (auto it = m_statuses.cbegin(); it != m_statuses.cend(); ++it)
            out += QStringLiteral(" %1 x%2")
                       .arg(it.key() ? QString::number(it.key()) : QStringLiteral("none"))
                       .arg(it.value());
        out += QStringLiteral("\n  acknowledged keys %1 of %2, senders that gave up %3")
                   .arg(m_acknowledged)
                   .arg(m_history.keys)
                   .arg(m_gaveUp);

        QMap<QString, QStringList> injected;
        for (const InjectedFault &f : m_history.faults)
            injected[f.kind].append(
                f.durationMs
                    ? QStringLiteral("%1 %2 for %3 ms").arg(f.target, at(f.atMs)).arg(f.durationMs)
                    : QStringLiteral("%1 %2").arg(f.target, at(f.atMs)));
        QMap<QString, int> downstream;
        for (const DownstreamRun &run : m_history.runs) {
            if (run.plan.kind == RunPlan::Kind::Trickle)
                downstream[QStringLiteral("trickle")] += 1;
            else if (run.plan.status >= 500)
                downstream[QStringLiteral("%1").arg(run.plan.status)] += 1;
            else if (run.plan.delayMs > 1000)
                downstream[QStringLiteral("hang")] += 1;
        }
        out += QStringLiteral("\n  faults injected:");
        for (auto it = injected.cbegin(); it != injected.cend(); ++it)
            out += QStringLiteral("\n    %1 x%2: %3")
                       .arg(it.key())
                       .arg(it.value().size())
                       .arg(it.value().join(QStringLiteral(", ")));
        out += QStringLiteral("\n    downstream runs:");
        for (auto it = downstream.cbegin(); it != downstream.cend(); ++it)
            out += QStringLiteral(" %1 x%2").arg(it.key()).arg(it.value());

        int secondRuns = 0;
        for (int n : m_secondRuns)
            secondRuns += n;
        out += QStringLiteral("\n  runs %1 of %2 keys; second runs %3")
                   .arg(m_history.runs.size())
                   .arg(m_runsByKey.size())
                   .arg(secondRuns);
        for (auto it = m_secondRuns.cbegin(); it != m_secondRuns.cend(); ++it)
            out += QStringLiteral("\n    %1: %2").arg(causeName(it.key())).arg(it.value());
        return out;
    }

    const FaultHistory &m_history;
    QHash<QString, QList<DownstreamRun>> m_runsByKey;
    QHash<QString, QList<SenderLog>> m_sendersByKey;
    QHash<QByteArray, DownstreamRun> m_runByDelivery;
    QHash<QByteArray, SenderAnswer> m_answerByDelivery;
    QHash<QByteArray, qint64> m_kills; // instance → when it was killed
    QMap<Cause, int> m_secondRuns;
    QMap<int, int> m_statuses;
    int m_acknowledged = 0;
    int m_gaveUp = 0;
    QStringList m_problems; // of the key being checked
    QList<KeyFailure> m_failures;
};

} // namespace

CheckOutcome checkHistory(const FaultHistory &history)
{
    return Checker(history).run();
}

} // namespace idem::test
