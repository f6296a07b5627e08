// The store goes away during a storm: answers turn 503, nothing is forwarded while it is down,
// the receiver recovers by itself when it returns, and no key is processed twice — not even when
// the sender retries, after the outage, every key it ever sent.
#include "http/blockingclient.h"
#include "receiver/receiver.h"
#include "store/storefactory.h"
#include "store/storeurl.h"
#include "support/downstream.h"
#include "support/servers.h"
#include "util/clock.h"

#include <QSet>
#include <QTemporaryDir>
#include <QTest>

#include <thread>

using namespace idem;
using namespace idem::test;

namespace {

QByteArray bodyOf(const QByteArray &key)
{
    return "{\"k\":\"" + key + "\"}";
}

// Keeps sending deliveries of a rotating set of keys from a few threads until told to stop.
// Keys carry the phase they were made in, and answers are counted per phase: a key of a phase
// is only sent during that phase.
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
    void nextPhase() { ++m_phase; }
    int count(int phase, int status) const
    {
        std::lock_guard lock(m_mutex);
        return m_byStatus.value({phase, status});
    }
    int answered(int phase) const
    {
        std::lock_guard lock(m_mutex);
        int n = 0;
        for (auto it = m_byStatus.cbegin(); it != m_byStatus.cend(); ++it)
            n += it.key().first == phase ? it.value() : 0;
        return n;
    }
    QSet<QString> acknowledged() const
    {
        std::lock_guard lock(m_mutex);
        return m_acknowledged;
    }
    QSet<QByteArray> sent() const
    {
        std::lock_guard lock(m_mutex);
        return m_sent;
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
            const int phase = m_phase.load();
            const QByteArray key = m_prefix + "-p" + QByteArray::number(phase) + "-k" + QByteArray::number((i + t) % 40);
            {
                std::lock_guard lock(m_mutex);
                m_sent.insert(key);
            }
            c->send(buildPost("/hooks/orders", bodyOf(key), {{"Idempotency-Key", key}}, false));
            const ClientResponse r = c->readResponse();
            if (r.status == 0) {
                owner.reset();
                c = nullptr;
                continue;
            }
            std::lock_guard lock(m_mutex);
            m_byStatus[{phase, r.status}] += 1;
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
    QHash<std::pair<int, int>, int> m_byStatus; // (phase, status) -> answers
    QSet<QString> m_acknowledged; // keys a sender got a 2xx for: their completion is durable
    QSet<QByteArray> m_sent;
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
        // A lease that outlasts the outage: a result in doubt while the store was away is
        // settled once it is back, and the re-sent key is replayed, not processed again.
        auto config = Config::parse("{\"endpoints\": [{\"name\": \"orders\", \"lease_seconds\": 10,"
                                    " \"forward_timeout_seconds\": 5, \"forward_to\": \""
                                        + down.url().toString().toUtf8() + "\"}]}",
                                    u"test"_qs);
        QVERIFY2(config.ok(), config.ok() ? "" : qPrintable(config.error().message));
        auto pool = openStorePool(storeUrl);
        QVERIFY2(pool.ok(), pool.ok() ? "" : qPrintable(pool.error().message));
        Receiver receiver(*config, *pool);
        ListenAddress any;
        any.port = 0;
        const quint16 port = receiver.start(any)->port;
        auto reachedDownstream = [&] {
            QHash<QByteArray, int> perKey;
            for (const HttpRequest &r : down.requests())
                perKey[r.header("Idempotency-Key")] += 1;
            return perKey;
        };

        Storm storm(port, "o");
        QTRY_VERIFY_WITH_TIMEOUT(storm.count(0, 200) > 200, 10000);

        // Phase 1: the deliveries in flight when the store goes are held at the downstream
        // (processed there) until it is gone, so their results are in doubt: the hardest case
        // for a retry. (Held for well under the forward deadline, so none of them times out.)
        storm.nextPhase();
        const int forwardedBeforeGate = down.total();
        down.closeGate();
        QTRY_VERIFY_WITH_TIMEOUT(down.held() > 0, 10000);
        stopStore();
        QSet<QByteArray> inDoubt;
        for (const HttpRequest &r : down.requests().mid(forwardedBeforeGate))
            inDoubt.insert(r.header("Idempotency-Key"));
        QVERIFY(!inDoubt.isEmpty());
        down.openGate();

        // Phase 2: keys first sent while the store is down are refused (503), never processed.
        // The test sends some itself: the storm's senders may all be waiting for the results in
        // doubt above.
        storm.nextPhase();
        QSet<QByteArray> refused;
        for (int i = 0; i < 50; ++i) {
            const QByteArray key = "o-p2-t" + QByteArray::number(i);
            const ClientResponse r = post(port, "/hooks/orders", bodyOf(key), {{"Idempotency-Key", key}});
            QCOMPARE(r.status, 503);
            QCOMPARE(r.header("Idempotency-Outcome"), QByteArray("unavailable"));
            // The sender learns nothing of the store (its kind, host, port): the log does.
            const StoreUrl store = *StoreUrl::parse(storeUrl);
            QVERIFY2(!r.body.contains(":" + QByteArray::number(store.port)) &&
                         !r.body.contains("Redis") && !r.body.contains("PostgreSQL"),
                     r.body.constData());
            refused.insert(key);
        }
        QVERIFY(!(*pool)->health().healthy);
        QCOMPARE(storm.answered(2), storm.count(2, 503));
        const QHash<QByteArray, int> duringOutage = reachedDownstream();
        for (auto it = duringOutage.cbegin(); it != duringOutage.cend(); ++it)
            QVERIFY2(!it.key().contains("-p2-"), it.key().constData());

        // Phase 3: new keys once the store is back: each processed exactly once.
        storm.nextPhase();
        startStore();
        QTRY_VERIFY_WITH_TIMEOUT(storm.count(3, 200) > 100, 20000);
        QTRY_VERIFY_WITH_TIMEOUT((*pool)->health().healthy, 5000);
        storm.stop();

        // No key reached the downstream twice, across the whole storm.
        QHash<QByteArray, int> perKey = reachedDownstream();
        for (auto it = perKey.cbegin(); it != perKey.cend(); ++it)
            QVERIFY2(it.value() == 1, it.key().constData());
        int afterRecovery = 0;
        for (auto it = perKey.cbegin(); it != perKey.cend(); ++it)
            afterRecovery += it.key().contains("-p3-");
        QVERIFY(afterRecovery > 0);
        qInfo("forwarded %d keys, %d of them after the store came back", down.total(), afterRecovery);
        // Every completion acknowledged to a sender survived the store's restart.
        const QSet<QString> acknowledged = storm.acknowledged();
        QVERIFY(!acknowledged.isEmpty());
        for (const QString &key : acknowledged) {
            // A pool worker whose connection died with the store fails its next call once
            // (then connects again): read until the store answers.
            Result<std::optional<KeyRecord>> record = makeError(ErrorCode::Unavailable, u"not read"_qs);
            (void)QTest::qWaitFor([&] {
                record = (*pool)->run<std::optional<KeyRecord>>([&](IdempotencyStore &s) { return s.key(key); });
                return record.ok();
            }, 5000);
            QVERIFY2(record.ok() && record->has_value() && (*record)->state == KeyState::Completed,
                     qPrintable(key + u": "_qs + (!record.ok() ? record.error().message
                                                  : !record->has_value() ? u"absent"_qs : toString((*record)->state))));
        }

        // The sender retries every key it ever sent, those whose result was in doubt during the
        // outage included (processed, but the finish did not reach the store): each gets its
        // answer, and none reaches the downstream a second time.
        const QSet<QByteArray> sent = storm.sent() + refused;
        QVERIFY(sent.size() > 90);
        QHash<QByteArray, QByteArray> outcomes;
        for (const QByteArray &key : sent) {
            ClientResponse answer; // in progress (409) until a result in doubt is settled
            (void)QTest::qWaitFor([&] {
                answer = post(port, "/hooks/orders", bodyOf(key), {{"Idempotency-Key", key}});
                return answer.status != 409 && answer.status != 503;
            }, 20000);
            QVERIFY2(answer.status == 200, qPrintable(u"%1: %2 %3"_qs.arg(QString::fromLatin1(key)).arg(answer.status)
                                                           .arg(QString::fromLatin1(answer.header("Idempotency-Outcome")))));
            outcomes.insert("orders:" + key, answer.header("Idempotency-Outcome"));
        }
        perKey = reachedDownstream();
        for (const QByteArray &key : sent) {
            const QByteArray stored = "orders:" + key;
            QVERIFY2(perKey.value(stored) == 1,
                     qPrintable(u"%1 reached the downstream %2 times (in doubt during the outage: %3; re-sent: %4)"_qs
                                    .arg(QString::fromLatin1(stored)).arg(perKey.value(stored))
                                    .arg(inDoubt.contains(stored) ? u"yes"_qs : u"no"_qs, QString::fromLatin1(outcomes.value(stored)))));
        }
        QCOMPARE(perKey.size(), sent.size());
        qInfo("re-sent %lld keys, %lld of them in doubt during the outage", qlonglong(sent.size()), qlonglong(inDoubt.size()));
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

    // The SQLite file taken from under a running desk (deleted, renamed, replaced): its
    // connections wrote on into a file no one else sees (a second desk on the path claimed the
    // same keys from token 1). Now claims are refused (503, the store unhealthy) while the file
    // is not at its path, nothing is made there, and putting it back ends it.
    void sqliteFileMovedWhileOpenIsRefused()
    {
        CountingDownstream down;
        auto config = Config::parse("{\"endpoints\": [{\"name\": \"orders\", \"forward_to\": \"" +
                                        down.url().toString().toUtf8() + "\"}]}",
                                    u"test"_qs);
        QVERIFY2(config.ok(), config.ok() ? "" : qPrintable(config.error().message));
        const QString path = m_dir.filePath(u"moved.db"_qs);
        auto pool = openStorePool(u"sqlite:"_qs + path);
        QVERIFY2(pool.ok(), pool.ok() ? "" : qPrintable(pool.error().message));
        Receiver receiver(*config, *pool);
        ListenAddress any;
        any.port = 0;
        const quint16 port = receiver.start(any)->port;
        auto deliver = [port] {
            return post(port, "/hooks/orders", "{}", {{"Idempotency-Key", "k1"}});
        };
        QCOMPARE(deliver().status, 200);
        QVERIFY(QFile::rename(path, path + u".moved"_qs));
        const ClientResponse refused = deliver();
        QCOMPARE(refused.status, 503);
        QCOMPARE(down.total(), 1);
        QVERIFY(!QFile::exists(path));
        QVERIFY(!(*pool)->health().healthy);
        QVERIFY2((*pool)->health().lastError.contains(u"no longer at its path"_qs),
                 qPrintable((*pool)->health().lastError));
        QVERIFY(QFile::rename(path + u".moved"_qs, path));
        const ClientResponse back = deliver();
        QCOMPARE(back.header("Idempotency-Outcome"), QByteArray("replayed"));
        QCOMPARE(down.total(), 1);
        QVERIFY((*pool)->health().healthy);
    }

    // Connections the server closed while they sat in the pool (idle_session_timeout,
    // pg_terminate_backend) are replaced before the next call, not found dead by it: that call
    // was a delivery answered 503 ("not connected"), one per pooled connection.
    void postgresConnectionsClosedWhileIdleAreReplaced()
    {
        PgCluster pg(m_dir.filePath(u"pg-idle"_qs));
        QVERIFY2(pg.init(), qPrintable(pg.lastError()));
        QVERIFY2(pg.start(), qPrintable(pg.lastError()));
        auto pool = openStorePool(pg.url());
        QVERIFY2(pool.ok(), pool.ok() ? "" : qPrintable(pool.error().message));
        auto clock = [&] {
            return (*pool)->run<qint64>([](IdempotencyStore &s) { return s.clockMs(); });
        };
        const QString desks = u"FROM pg_stat_activity WHERE application_name = 'idemdesk'"_qs;
        for (int i = 0; i < 20; ++i) // every worker's connection open
            QVERIFY(clock().ok());
        const int open = pg.sql(u"SELECT count(*) "_qs + desks).toInt();
        QVERIFY2(open >= 2, qPrintable(pg.lastError()));
        QCOMPARE(pg.sql(u"SELECT count(*) FROM (SELECT pg_terminate_backend(pid) "_qs + desks +
                        u") t"_qs)
                     .toInt(),
                 open);
        QTRY_COMPARE(pg.sql(u"SELECT count(*) "_qs + desks), u"0"_qs);
        for (int i = 0; i < 20; ++i) {
            const Result<qint64> now = clock();
            QVERIFY2(now.ok(), now.ok() ? "" : qPrintable(now.error().message));
        }
        QVERIFY((*pool)->health().healthy);
    }
};

QTEST_GUILESS_MAIN(TestOutage)
#include "tst_outage.moc"
