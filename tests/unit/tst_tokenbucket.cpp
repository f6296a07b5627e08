// The token bucket behind the delivery log's budgets (rejections logged one by one, mismatch
// bodies kept): a full burst at first, refilled at its rate and never past its burst, and a clock
// that stands still or goes back adds nothing.
#include "util/tokenbucket.h"

#include <QTest>

using namespace idem;

class TokenBucketTest : public QObject
{
    Q_OBJECT
private Q_SLOTS:
    void startsWithAFullBurst()
    {
        TokenBucket bucket(100, 60, 5'000);
        int taken = 0;
        while (bucket.take(5'000))
            ++taken;
        QCOMPARE(taken, 100);
    }

    void refillsAtItsRate()
    {
        TokenBucket bucket(3, 60, 0); // one a second
        for (int i = 0; i < 3; ++i)
            QVERIFY(bucket.take(0));
        QVERIFY(!bucket.take(999));
        QVERIFY(bucket.take(1'000));
        QVERIFY(!bucket.take(1'000));
        QVERIFY(bucket.take(2'500)); // 1.5 refilled, 1 taken: half of one left
        QVERIFY(!bucket.take(2'500));
        QVERIFY(bucket.take(3'000));
    }

    void neverHoldsMoreThanItsBurst()
    {
        TokenBucket bucket(5, 60, 0);
        QVERIFY(bucket.take(0));
        int taken = 0;
        while (bucket.take(86'400'000)) // a day idle
            ++taken;
        QCOMPARE(taken, 5);
    }

    void aClockGoingBackAddsNothing()
    {
        TokenBucket bucket(2, 60, 10'000);
        QVERIFY(bucket.take(10'000));
        QVERIFY(bucket.take(10'000));
        QVERIFY(!bucket.take(4'000)); // back 6 s
        QVERIFY(!bucket.take(10'500));
        QVERIFY(bucket.take(11'000)); // a second after the last time that moved it on
    }
};

QTEST_GUILESS_MAIN(TokenBucketTest)
#include "tst_tokenbucket.moc"
