// What the window's status bar says of the store: the calls of the last 10 s, not the last one
// alone (which flapped between healthy and unavailable on every refresh while a part of the
// store failed: one Redis Cluster master of three, a lock held now and then).
#include "store/storepool.h"

#include <QDateTime>
#include <QTest>
#include <QThread>

using namespace idem;

namespace {

// A pool whose store never opens: its health comes only from what the test reports.
std::unique_ptr<StorePool> pool()
{
    return std::make_unique<StorePool>(
        [] {
            return Result<std::unique_ptr<IdempotencyStore>>(
                makeError(ErrorCode::Unavailable, u"unused"_qs));
        },
        1);
}

StoreHealth::Verdict verdict(const StorePool &p)
{
    return p.health().verdict(QDateTime::currentMSecsSinceEpoch());
}

} // namespace

class StoreHealthTest : public QObject
{
    Q_OBJECT
private Q_SLOTS:
    void noCallsIsHealthy() { QCOMPARE(verdict(*pool()), StoreHealth::Verdict::Healthy); }

    // Some calls fail, the others go through: degraded, whichever came last.
    void aPartlyFailingStoreIsDegradedNotFlapping()
    {
        auto p = pool();
        for (int i = 0; i < 3; ++i) {
            p->reportHealth(true);
            p->reportHealth(false, u"master 127.0.0.1:7001 timed out"_qs);
            p->reportHealth(true);
            QCOMPARE(verdict(*p), StoreHealth::Verdict::Degraded);
        }
        const StoreHealth h = p->health();
        QCOMPARE(h.recentCalls, 9);
        QCOMPARE(h.recentFailures, 3);
        QCOMPARE(h.lastError, u"master 127.0.0.1:7001 timed out"_qs);
    }

    void everyCallFailingIsUnavailable()
    {
        auto p = pool();
        p->reportHealth(false, u"Connection refused"_qs);
        p->reportHealth(false, u"Connection refused"_qs);
        QCOMPARE(verdict(*p), StoreHealth::Verdict::Unavailable);
        p->reportHealth(true);
        QCOMPARE(verdict(*p), StoreHealth::Verdict::Degraded);
    }

    // Good calls, then the store goes away: unavailable once the latest seconds' calls all
    // failed, the good ones before them notwithstanding (they still make the 10 s degraded).
    void aStoreGoneIsUnavailableOnceItsLatestCallsFail()
    {
        auto p = pool();
        for (int i = 0; i < 3; ++i)
            p->reportHealth(true);
        QThread::msleep(StoreHealth::kLatestSeconds * 1000 + 100);
        p->reportHealth(false, u"Connection refused"_qs);
        QCOMPARE(verdict(*p), StoreHealth::Verdict::Unavailable);
        QCOMPARE(p->health().recentCalls, 4);
    }

    // Reads go through, the last write was refused (a full disk, Redis out of memory): every new
    // delivery gets 503, which "healthy" hid.
    void refusedWritesAreSaid()
    {
        auto p = pool();
        p->reportHealth(true);
        p->reportHealth(false, u"database or disk is full"_qs, true);
        p->reportHealth(true);
        p->reportHealth(true);
        QCOMPARE(verdict(*p), StoreHealth::Verdict::RefusingWrites);
        p->reportHealth(true, {}, true); // a write went through
        QCOMPARE(verdict(*p), StoreHealth::Verdict::Degraded);
    }

    // The window's pool reads fine while the receiver's refuses every claim (a full disk): the
    // status bar tells both, so "refusing writes", not "healthy" (the window's alone).
    void theReceiversRefusedWritesAreSaidWithTheWindows()
    {
        auto window = pool();
        auto receiver = pool();
        window->reportHealth(true);
        window->reportHealth(true);
        receiver->reportHealth(true, {}, true);
        receiver->reportHealth(false, u"database or disk is full"_qs, true);
        receiver->reportHealth(true);
        const qint64 now = QDateTime::currentMSecsSinceEpoch();
        QCOMPARE(window->health().verdict(now), StoreHealth::Verdict::Healthy);
        const StoreHealth both = combinedHealth(window->health(), receiver->health());
        QCOMPARE(both.verdict(now), StoreHealth::Verdict::RefusingWrites);
        QCOMPARE(both.lastWriteError, u"database or disk is full"_qs);
        QCOMPARE(both.recentCalls, 5);
        QCOMPARE(both.recentFailures, 1);
        QCOMPARE(combinedHealth(receiver->health(), window->health()).verdict(now),
                 StoreHealth::Verdict::RefusingWrites);
    }
};

QTEST_GUILESS_MAIN(StoreHealthTest)
#include "tst_storehealth.moc"
