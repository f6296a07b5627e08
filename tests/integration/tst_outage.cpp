// The store goes away during a storm: answers turn 503, nothing is forwarded while it is down,
// the receiver recovers by itself when it returns, and no key is processed twice.
#include "receiver/receiver.h"
#include "store/storefactory.h"
#include "support/downstream.h"
#include "http/blockingclient.h"
#include "support/servers.h"
#include "util/clock.h"

#include <QSet>
#include <QTemporaryDir>
#include <QTest>

#include <thread>

using namespace idem;
using namespace idem::test;

namespace {

// Keeps sending deliveries of a rotating set of keys from a few threads until told to stop.
class Storm
{
public:
    Storm(quint16 port, QByteArray prefix) : m_port(port), m_prefix(std::move(prefix))
    {
        for (int t = 0; t < 8; ++t)
            m_threads.emplace_back([this, t] { run(t); });
    }
    ~Storm() { stop(); }
    void stop()
    {
        m_stop = true;
        for (auto &t : m_threads)
            if (t.joinable())
                t.join();
    }
    // Keys from this generation on are new: keys of a phase are only sent during that phase.
    void nextPhase() { ++m_phase; }
    int count(int status) const
    {
        std::lock_guard lock(m_mutex);
        return m_byStatus.value(status);
    }
    QSet<QString> acknowledged() const
    {
        std::lock_guard lock(m_mutex);
        return m_acknowledged;
    }
    void resetCounts()
    {
        std::lock_guard lock(m_mutex);
        m_byStatus.clear();
    }

private:
    void run(int t)
    {
        RawConnection *c = nullptr;
        std::unique_ptr<RawConnection> owner;
        for (int i = 0; !m_stop; ++i) {
            if (!c || !c->isOpen()) {
                owner = std::make_unique<RawConnection>(m_port, 5000);
                c = owner.get();
            }
            const QByteArray key = m_prefix + "-p" + QByteArray::number(m_phase.load()) + "-k" + QByteArray::number((i + t) % 40);
            c->send(buildPost("/hooks/orders", "{\"k\":\"" + key + "\"}", {{"Idempotency-Key", key}}, false));
            const ClientResponse r = c->readResponse();
            if (r.status == 0) {
                owner.reset();
                c = nullptr;
                continue;
            }
            std::lock_guard lock(m_mutex);
            m_byStatus[r.status] += 1;
            if (r.status == 200)
                m_acknowledged.insert(QString::fromLatin1(r.header("Idempotency-Key")));
            if (r.header("Connection") == "close") {
                owner.reset();
                c = nullptr;
            }
        }
    }
    quint16 m_port;
    QByteArray m_prefix;
    std::atomic<bool> m_stop{false};
    std::atomic<int> m_phase{0};
    mutable std::mutex m_mutex;
    QHash<int, int> m_byStatus;
    QSet<QString> m_acknowledged; // keys a sender got a 2xx for: their completion is durable
    std::vector<std::thread> m_threads;
};

} // namespace

class TestOutage : public QObject
{
    Q_OBJECT
    QTemporaryDir m_dir;

    void stormThroughOutage(const QString &storeUrl, const std::function<void()> &stopStore,
                            const std::function<void()> &startStore)
    {
        CountingDownstream down;
        auto config = Config::parse("{\"endpoints\": [{\"name\": \"orders\", \"forward_to\": \""
                                        + down.url().toString().toUtf8() + "\"}]}",
                                    u"test"_qs);
        auto pool = openStorePool(storeUrl);
        QVERIFY2(pool.ok(), pool.ok() ? "" : qPrintable(pool.error().message));
        Receiver receiver(*config, *pool);
        ListenAddress any;
        any.port = 0;
        const quint16 port = receiver.start(any)->port;

        Storm storm(port, "o");
        QTRY_VERIFY_WITH_TIMEOUT(storm.count(200) > 200, 10000);

        stopStore();
        QTRY_VERIFY_WITH_TIMEOUT(storm.count(503) > 20, 10000);
        QVERIFY(!(*pool)->health().healthy);
        // Claims granted just before the stop may still be forwarded; after that, nothing.
        QTest::qWait(300);
        storm.nextPhase();
        const int forwardedBefore = down.total();
        storm.resetCounts();
        QTest::qWait(1500);
        QCOMPARE(down.total(), forwardedBefore);
        QCOMPARE(storm.count(200), 0);
        QVERIFY(storm.count(503) > 0);

        storm.nextPhase(); // new keys from now on: each must be processed exactly once
        startStore();
        QTRY_VERIFY_WITH_TIMEOUT(storm.count(200) > 100, 20000);
        QTRY_VERIFY_WITH_TIMEOUT((*pool)->health().healthy, 5000);
        storm.stop();

        // No key reached the downstream twice, across the whole storm.
        QHash<QByteArray, int> perKey;
        for (const HttpRequest &r : down.requests())
            perKey[r.header("Idempotency-Key")] += 1;
        for (auto it = perKey.begin(); it != perKey.end(); ++it)
            QVERIFY2(it.value() == 1, it.key().constData());
        int afterRecovery = 0;
        for (auto it = perKey.begin(); it != perKey.end(); ++it)
            afterRecovery += it.key().contains("-p2-");
        QVERIFY(afterRecovery > 0);
        qInfo("forwarded %d keys, %d of them after the store came back", down.total(), afterRecovery);
        // Every completion acknowledged to a sender survived the store's restart.
        const QSet<QString> acknowledged = storm.acknowledged();
        QVERIFY(!acknowledged.isEmpty());
        for (const QString &key : acknowledged) {
            auto record = (*pool)->run<std::optional<KeyRecord>>([&](IdempotencyStore &s) { return s.key(key); });
            QVERIFY2(record.ok() && record->has_value() && (*record)->state == KeyState::Completed, qPrintable(key));
        }
    }

private Q_SLOTS:
    void redisGoesAwayAndComesBack()
    {
        RedisServer redis(m_dir.path());
        QVERIFY(redis.start());
        stormThroughOutage(redis.url(), [&] { redis.stop(true); }, [&] { QVERIFY(redis.start()); });
    }

    void postgresGoesAwayAndComesBack()
    {
        PgCluster pg(m_dir.filePath(u"pg"_qs));
        QVERIFY2(pg.init(), qPrintable(pg.lastError()));
        QVERIFY2(pg.start(), qPrintable(pg.lastError()));
        stormThroughOutage(pg.url(), [&] { QVERIFY2(pg.stop(), qPrintable(pg.lastError())); },
                           [&] { QVERIFY2(pg.start(), qPrintable(pg.lastError())); });
    }
};

QTEST_GUILESS_MAIN(TestOutage)
#include "tst_outage.moc"
