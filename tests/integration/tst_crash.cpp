// `idemdesk serve` killed (SIGKILL) while a delivery is being processed, then restarted on the
// same store: a retry within the lease gets 409; after it, the key is recovered and processed
// once more; completed records survive. SQLite, PostgreSQL, and Redis with appendfsync always.
#include "http/blockingclient.h"
#include "support/downstream.h"
#include "support/serveprocess.h"
#include "support/servers.h"

#include <QProcess>
#include <QRandomGenerator>
#include <QRegularExpression>
#include <QTemporaryDir>
#include <QTest>

#include <csignal>
#include <thread>

using namespace idem;
using namespace idem::test;

class TestCrash : public QObject
{
    Q_OBJECT
    QTemporaryDir m_dir;

    static std::unique_ptr<QProcess> serve(const QString &config, quint16 &port)
    {
        return startServe(QStringLiteral(IDEMDESK_BIN), {u"--config"_qs, config}, port);
    }

private Q_SLOTS:
    void killedWhileProcessing_data()
    {
        QTest::addColumn<QString>("backend");
        QTest::newRow("sqlite") << u"sqlite"_qs;
        QTest::newRow("postgres") << u"postgres"_qs;
        QTest::newRow("redis-aof") << u"redis"_qs;
    }
    void killedWhileProcessing()
    {
        QFETCH(QString, backend);
        std::unique_ptr<RedisServer> redis;
        QString store;
        if (backend == u"sqlite"_qs) {
            store = u"sqlite:"_qs + m_dir.filePath(u"crash.db"_qs);
        } else if (backend == u"postgres"_qs) {
            store = qEnvironmentVariable("IDEM_TEST_POSTGRES_URL");
            if (store.isEmpty())
                QFAIL("IDEM_TEST_POSTGRES_URL is not set: run through ./dev test");
        } else {
            QDir().mkpath(m_dir.filePath(u"redis"_qs));
            redis = std::make_unique<RedisServer>(m_dir.filePath(u"redis"_qs));
            QVERIFY(redis->start());
            store = redis->url();
        }
        CountingDownstream down;
        down.setDelayMs(4000);
        const QString endpoint = u"c%1"_qs.arg(QRandomGenerator::global()->bounded(1u << 30), 0, 36);
        const QString config = m_dir.filePath(endpoint + u".json"_qs);
        QFile f(config);
        QVERIFY(f.open(QIODevice::WriteOnly));
        f.write(QStringLiteral("{\"store\": \"%1\", \"endpoints\": [{\"name\": \"%2\", \"lease_seconds\": 2,"
                               " \"forward_timeout_seconds\": 10, \"forward_to\": \"%3\"}]}")
                    .arg(store, endpoint, down.url().toString()).toUtf8());
        f.close();
        const QByteArray path = "/hooks/" + endpoint.toUtf8();

        quint16 port = 0;
        auto first = serve(config, port);
        QVERIFY(port);
        // A completed record before the crash.
        down.setDelayMs(0);
        QCOMPARE(post(port, path, "{\"done\":1}", {{"Idempotency-Key", "done"}}).status, 200);
        down.setDelayMs(4000);
        std::thread stuck([&] { post(port, path, "{\"slow\":1}", {{"Idempotency-Key", "slow"}}); });
        QTRY_COMPARE_WITH_TIMEOUT(down.count((endpoint + u":slow"_qs).toUtf8()), 1, 10000); // it is being processed
        ::kill(pid_t(first->processId()), SIGKILL);
        QVERIFY(first->waitForFinished(5000));
        stuck.join();

        auto second = serve(config, port);
        QVERIFY(port);
        down.setDelayMs(0);
        // Within the lease: the dead worker's claim still holds.
        const ClientResponse within = post(port, path, "{\"slow\":1}", {{"Idempotency-Key", "slow"}});
        QCOMPARE(within.status, 409);
        QCOMPARE(within.header("Idempotency-Outcome"), QByteArray("in-progress"));
        QVERIFY(within.header("Retry-After").toInt() >= 1);
        // After the lease: recovered, and processed once more.
        ClientResponse after;
        QVERIFY(QTest::qWaitFor([&] {
            after = post(port, path, "{\"slow\":1}", {{"Idempotency-Key", "slow"}});
            return after.header("Idempotency-Outcome") != "in-progress";
        }, 10000));
        QCOMPARE(after.status, 200);
        QCOMPARE(after.header("Idempotency-Outcome"), QByteArray("recovered"));
        QCOMPARE(down.count((endpoint + u":slow"_qs).toUtf8()), 2);
        QCOMPARE(post(port, path, "{\"slow\":1}", {{"Idempotency-Key", "slow"}}).header("Idempotency-Outcome"), QByteArray("replayed"));
        // The record completed before the crash survived it.
        const ClientResponse done = post(port, path, "{\"done\":1}", {{"Idempotency-Key", "done"}});
        QCOMPARE(done.header("Idempotency-Outcome"), QByteArray("replayed"));
        QCOMPARE(down.count((endpoint + u":done"_qs).toUtf8()), 1);
        ::kill(pid_t(second->processId()), SIGKILL);
        QVERIFY(second->waitForFinished(5000));
        if (redis) {
            // Redis itself killed too: with appendfsync always, acknowledged completions survive.
            redis->stop(true);
            QVERIFY(redis->start());
        }
        auto third = serve(config, port);
        QVERIFY(port);
        QCOMPARE(post(port, path, "{\"slow\":1}", {{"Idempotency-Key", "slow"}}).header("Idempotency-Outcome"), QByteArray("replayed"));
        QCOMPARE(post(port, path, "{\"done\":1}", {{"Idempotency-Key", "done"}}).header("Idempotency-Outcome"), QByteArray("replayed"));
        QCOMPARE(down.total(), 3);
        ::kill(pid_t(third->processId()), SIGTERM);
        QVERIFY(third->waitForFinished(10000));
    }
};

QTEST_GUILESS_MAIN(TestCrash)
#include "tst_crash.moc"
