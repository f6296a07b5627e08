// The listener's limits as plain arithmetic: the request buffer budget, per-client connections,
// the upload pace and the body's growth, without sockets or an event loop.
#include "http/connectionlimits.h"

#include <QFile>
#include <QTest>

using namespace idem;

namespace {
const QByteArray kA = clientKey(QHostAddress(QStringLiteral("192.0.2.1")));
const QByteArray kB = clientKey(QHostAddress(QStringLiteral("192.0.2.2")));

ConnectionBudget budget(qint64 total, qint64 perClient, int connections)
{
    ConnectionBudget::Limits limits;
    limits.maxBufferedBytes = total;
    limits.maxBufferedBytesPerClient = perClient;
    limits.maxConnectionsPerClient = connections;
    return ConnectionBudget(limits);
}
} // namespace

class TestConnectionLimits : public QObject
{
    Q_OBJECT
private Q_SLOTS:
    void aClientIsAnIpv4AddressOrAnIpv6Slash64()
    {
        QCOMPARE(clientKey(QHostAddress(QStringLiteral("192.0.2.1"))).size(), 4);
        QVERIFY(kA != kB);
        // Dual-stack listeners see IPv4 peers as mapped IPv6 addresses: the same client.
        QCOMPARE(clientKey(QHostAddress(QStringLiteral("::ffff:192.0.2.1"))), kA);
        // One host has a whole /64: its addresses are one client; another /64 is another.
        QCOMPARE(clientKey(QHostAddress(QStringLiteral("2001:db8:1:2::1"))),
                 clientKey(QHostAddress(QStringLiteral("2001:db8:1:2:ffff:ffff:ffff:ffff"))));
        QVERIFY(clientKey(QHostAddress(QStringLiteral("2001:db8:1:2::1"))) !=
                clientKey(QHostAddress(QStringLiteral("2001:db8:1:3::1"))));
    }

    void aClientPastItsConnectionsIsRefusedOthersAreNot()
    {
        ConnectionBudget b = budget(1000, 1000, 2);
        QCOMPARE(b.openConnection(kA), LimitRefusal::None);
        QCOMPARE(b.openConnection(kA), LimitRefusal::None);
        QCOMPARE(b.openConnection(kA), LimitRefusal::Client);
        QCOMPARE(b.connections(kA), 2);
        QCOMPARE(b.openConnection(kB), LimitRefusal::None);
        b.closeConnection(kA);
        QCOMPARE(b.openConnection(kA), LimitRefusal::None);
    }

    void aClientTakesItsShareAndNoMore()
    {
        ConnectionBudget b = budget(1000, 400, 10);
        QCOMPARE(b.reserve(kA, 300), LimitRefusal::None);
        QCOMPARE(b.reserve(kA, 101), LimitRefusal::Client); // nothing taken
        QCOMPARE(b.bufferedBytes(kA), 300);
        QCOMPARE(b.reserve(kA, 100), LimitRefusal::None);
        QCOMPARE(b.reserve(kB, 400), LimitRefusal::None);
        QCOMPARE(b.bufferedBytes(), 800);
    }

    void theWholeBudgetRefusesEveryClientOnceFull()
    {
        ConnectionBudget b = budget(1000, 400, 10);
        const QByteArray c = clientKey(QHostAddress(QStringLiteral("192.0.2.3")));
        QCOMPARE(b.reserve(kA, 400), LimitRefusal::None);
        QCOMPARE(b.reserve(kB, 400), LimitRefusal::None);
        QCOMPARE(b.reserve(c, 201), LimitRefusal::Server);
        QCOMPARE(b.reserve(c, 200), LimitRefusal::None);
        QCOMPARE(b.reserve(c, 1), LimitRefusal::Server);
        // Given back, it is there for the next.
        b.release(kA, 400);
        QCOMPARE(b.reserve(c, 1), LimitRefusal::None);
        QCOMPARE(b.bufferedBytes(), 601);
    }

    void whatIsGivenBackIsNeverMoreThanWasTaken()
    {
        ConnectionBudget b = budget(1000, 1000, 10);
        QCOMPARE(b.reserve(kA, 100), LimitRefusal::None);
        QCOMPARE(b.reserve(kB, 100), LimitRefusal::None);
        b.release(kA, 500); // a bug elsewhere must not let B's bytes go
        QCOMPARE(b.bufferedBytes(), 100);
        QCOMPARE(b.bufferedBytes(kB), 100);
        b.release(kA, 1);
        QCOMPARE(b.bufferedBytes(), 100);
    }

    void clientsWithNothingAreForgotten()
    {
        ConnectionBudget b = budget(1000, 1000, 10);
        QCOMPARE(b.openConnection(kA), LimitRefusal::None);
        QCOMPARE(b.reserve(kA, 10), LimitRefusal::None);
        b.closeConnection(kA);
        QCOMPARE(b.clients(), 1); // still holds bytes
        b.release(kA, 10);
        QCOMPARE(b.clients(), 0);
    }

    void aRequestSlowerThanTheMinimumOverAWindowIsTooSlow()
    {
        UploadPace pace(1000, 10'000); // 10 000 bytes each 10 s
        pace.start(0);
        pace.received(9'999);
        QVERIFY(!pace.tooSlow(9'999)); // its window has not ended
        QCOMPARE(pace.windowEndMs(), 10'000);
        QVERIFY(pace.tooSlow(10'000));
    }

    void eachWindowIsJudgedOnItsOwn()
    {
        // A body sent fast, then stalled: the window after the burst brings nothing.
        UploadPace pace(1000, 10'000);
        pace.start(0);
        pace.received(1'000'000);
        QVERIFY(!pace.tooSlow(10'000));
        QCOMPARE(pace.windowEndMs(), 20'000);
        QVERIFY(pace.tooSlow(20'000));
    }

    void aLateCheckAsksForTheTimeThatPassed()
    {
        UploadPace pace(1000, 10'000);
        pace.start(0);
        pace.received(12'000);
        QVERIFY(!pace.tooSlow(12'000)); // 12 s at 1000 bytes/s: due 12 000
        pace.received(12'000);
        QVERIFY(pace.tooSlow(25'000)); // 13 s: due 13 000
    }

    void aMinimumOfZeroIsNoMinimum()
    {
        UploadPace pace(0, 10'000);
        pace.start(0);
        QVERIFY(!pace.enabled());
        QVERIFY(!pace.tooSlow(1'000'000));
    }

    void aBodyBufferGrowsInStepsNeverPastItsLimit()
    {
        const qint64 step = 64 * 1024, limit = 1024 * 1024;
        QCOMPARE(nextBodyCapacity(1, 0, step, 500), 500);          // a small known length: exactly
        QCOMPARE(nextBodyCapacity(1, 0, step, limit), step);       // a large one: a step at a time
        QCOMPARE(nextBodyCapacity(step, step, step, limit), step); // enough: unchanged
        QCOMPARE(nextBodyCapacity(step + 1, step, step, limit), 2 * step);
        QCOMPARE(nextBodyCapacity(5 * step, step, step, limit), 5 * step); // one large chunk
        QCOMPARE(nextBodyCapacity(limit, limit - 10, step, limit), limit);
        // Filled from empty to the limit, a buffer never holds more than a step unused.
        qint64 capacity = 0;
        for (qint64 size = 0; size < limit; size += 1000) {
            capacity = nextBodyCapacity(std::min(size + 1000, limit), capacity, step, limit);
            QVERIFY(capacity - std::min(size + 1000, limit) <= step);
        }
        QCOMPARE(capacity, limit);
    }

    void theListenBacklogIsTheSystemsMaximum()
    {
        QFile somaxconn(QStringLiteral("/proc/sys/net/core/somaxconn"));
        QVERIFY(somaxconn.open(QIODevice::ReadOnly));
        QCOMPARE(listenBacklog(), somaxconn.readAll().trimmed().toInt());
        QVERIFY(listenBacklog() > 50); // Qt's own
    }
};

QTEST_GUILESS_MAIN(TestConnectionLimits)
#include "tst_connectionlimits.moc"
