// `idemdesk serve` killed (SIGKILL) while a delivery is being processed, then restarted on the
// same store: a retry within the lease gets 409; after the lease end the store reports, the key
// is recovered under a higher token and processed once more; completed records survive. SQLite,
// PostgreSQL, and Redis with appendfsync always.
#include "http/blockingclient.h"
#include "support/downstream.h"
#include "support/serveprocess.h"
#include "support/servers.h"
#include "util/clock.h"

#include <QDateTime>
#include <QDir>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QRandomGenerator>
#include <QRegularExpression>
#include <QSet>
#include <QTemporaryDir>
#include <QTest>

#include <atomic>
#include <csignal>
#include <mutex>
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
    // The key as the store has it (`idemdesk keys show KEY --json`, another process).
    static QJsonObject show(const QString &config, const QString &key)
    {
        QProcess p;
        p.start(QStringLiteral(IDEMDESK_BIN), {u"keys"_qs, u"show"_qs, key, u"--json"_qs, u"--config"_qs, config});
        p.waitForFinished(30000);
        return QJsonDocument::fromJson(p.readAllStandardOutput()).object();
    }
    static qint64 msOf(const QJsonValue &isoTime)
    {
        const QDateTime t = QDateTime::fromString(isoTime.toString(), Qt::ISODateWithMs);
        return t.isValid() ? t.toMSecsSinceEpoch() : 0;
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
        const QString endpoint = u"c%1"_qs.arg(QRandomGenerator::global()->bounded(1u << 30), 0, 36);
        const QString config = m_dir.filePath(endpoint + u".json"_qs);
        QFile f(config);
        QVERIFY(f.open(QIODevice::WriteOnly));
        // The shortest legal lease: the forward's deadline plus the 2 s margin.
        f.write(QStringLiteral("{\"store\": \"%1\", \"endpoints\": [{\"name\": \"%2\", \"lease_seconds\": 3,"
                               " \"forward_timeout_seconds\": 1, \"forward_to\": \"%3\"}]}")
                    .arg(store, endpoint, down.url().toString()).toUtf8());
        f.close();
        const QByteArray path = "/hooks/" + endpoint.toUtf8();
        const QString slow = endpoint + u":slow"_qs;

        quint16 port = 0;
        auto first = serve(config, port);
        QVERIFY(port);
        // A completed record before the crash.
        QCOMPARE(post(port, path, "{\"done\":1}", {{"Idempotency-Key", "done"}}).status, 200);
        // The next delivery is held at the downstream, and its worker killed while it waits there
        // (well within its 1 s forward deadline: the kill follows the arrival at once).
        down.closeGate();
        std::thread stuck([&] { post(port, path, "{\"slow\":1}", {{"Idempotency-Key", "slow"}}); });
        QTRY_COMPARE_WITH_TIMEOUT(down.count(slow.toUtf8()), 1, 10000); // it is being processed
        ::kill(pid_t(first->processId()), SIGKILL);
        QVERIFY(first->waitForFinished(5000));
        stuck.join();
        down.openGate(); // its answer goes nowhere: the connection died with the process

        // The dead worker's claim, as the store has it.
        const QJsonObject claimed = show(config, slow);
        QVERIFY2(claimed.value(u"state"_qs).toString() == u"processing"_qs,
                 qPrintable(u"the killed worker's key is %1, not processing"_qs.arg(claimed.value(u"state"_qs).toString())));
        const qint64 leaseEnd = msOf(claimed.value(u"lease_until"_qs));
        const qint64 deadToken = claimed.value(u"token"_qs).toInteger();
        // The lease the config asked for, from the claim (its last update) on.
        const qint64 leaseMs = leaseEnd - msOf(claimed.value(u"updated_at"_qs));
        QVERIFY2(leaseMs >= 2900 && leaseMs <= 3100, qPrintable(u"a lease of %1 ms"_qs.arg(leaseMs)));

        auto second = serve(config, port);
        QVERIFY(port);
        // Within the lease: the dead worker's claim still holds.
        QVERIFY2(wallMs() < leaseEnd - 200, "the restart took longer than the 3 s lease: the within-lease retry cannot be sent");
        const ClientResponse within = post(port, path, "{\"slow\":1}", {{"Idempotency-Key", "slow"}});
        QCOMPARE(within.status, 409);
        QCOMPARE(within.header("Idempotency-Outcome"), QByteArray("in-progress"));
        QVERIFY(within.header("Retry-After").toInt() >= 1);
        QCOMPARE(down.count(slow.toUtf8()), 1);
        // Once the lease the store holds has ended: recovered under a new token, processed once more.
        QTRY_VERIFY_WITH_TIMEOUT(wallMs() > leaseEnd, 10000);
        const ClientResponse after = post(port, path, "{\"slow\":1}", {{"Idempotency-Key", "slow"}});
        QCOMPARE(after.status, 200);
        QCOMPARE(after.header("Idempotency-Outcome"), QByteArray("recovered"));
        QCOMPARE(down.count(slow.toUtf8()), 2);
        const QJsonObject recovered = show(config, slow);
        QCOMPARE(recovered.value(u"state"_qs).toString(), u"completed"_qs);
        QVERIFY(recovered.value(u"token"_qs).toInteger() > deadToken);
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

    // Whatever is killed mid-traffic — the desk, or Redis itself (appendfsync always) — every
    // record the store holds is listed, counted and exported, and every delivery answered
    // "processed" has one: a record's index entries are written in the same step as the record.
    void everyRecordIsFoundAfterAKill_data()
    {
        QTest::addColumn<QString>("backend");
        QTest::addColumn<bool>("killRedis");
        QTest::newRow("redis, the desk killed") << u"redis"_qs << false;
        QTest::newRow("redis, Redis killed") << u"redis"_qs << true;
        QTest::newRow("cluster, the desk killed") << u"cluster"_qs << false;
    }
    void everyRecordIsFoundAfterAKill()
    {
        QFETCH(QString, backend);
        QFETCH(bool, killRedis);
        const QString endpoint =
            u"ix%1"_qs.arg(QRandomGenerator::global()->bounded(1u << 30), 0, 36);
        std::unique_ptr<RedisServer> redis;
        QString store;
        QList<int> scanPorts;
        if (backend == u"redis"_qs) {
            const QString dir = m_dir.filePath(endpoint);
            QDir().mkpath(dir);
            redis = std::make_unique<RedisServer>(dir);
            QVERIFY(redis->start());
            store = redis->url();
            scanPorts << redis->port();
        } else {
            const QString seeds = qEnvironmentVariable("IDEM_TEST_REDIS_CLUSTER_URL");
            if (seeds.isEmpty())
                QFAIL("IDEM_TEST_REDIS_CLUSTER_URL is not set: run through ./dev test");
            store = seeds + u"?prefix="_qs + endpoint + u":"_qs;
            for (const QString &port :
                 qEnvironmentVariable("IDEM_TEST_REDIS_CLUSTER_PORTS").split(u','))
                scanPorts << port.toInt();
        }
        const QString config = m_dir.filePath(endpoint + u".json"_qs);
        QFile f(config);
        QVERIFY(f.open(QIODevice::WriteOnly));
        f.write(QStringLiteral("{\"store\": \"%1\", \"endpoints\": [{\"name\": \"%2\"}]}")
                    .arg(store, endpoint)
                    .toUtf8());
        f.close();
        quint16 port = 0;
        auto desk = serve(config, port);
        QVERIFY(port);

        // Eight senders, a new key each time, until the kill and a moment after.
        std::atomic<bool> stop{false};
        std::mutex mutex;
        QSet<QByteArray> processed;
        std::vector<std::thread> senders;
        const QByteArray path = "/hooks/" + endpoint.toUtf8();
        for (int t = 0; t < 8; ++t)
            senders.emplace_back([&, t] {
                for (int i = 0; !stop; ++i) {
                    const QByteArray id = QByteArray::number(t) + '-' + QByteArray::number(i);
                    const ClientResponse r = post(port, path, "{}", {{"Idempotency-Key", id}});
                    if (r.status == 0 && !killRedis)
                        return; // the desk is gone
                    if (r.status == 200 && r.header("Idempotency-Outcome") == "processed") {
                        std::lock_guard lock(mutex);
                        processed.insert(endpoint.toUtf8() + ':' + id);
                    }
                }
            });
        QTRY_VERIFY_WITH_TIMEOUT(
            [&] {
                std::lock_guard lock(mutex);
                return processed.size() > 300;
            }(),
            20'000);
        if (killRedis) {
            redis->stop(true);
            QVERIFY(redis->start());
            QTest::qWait(300);
        } else {
            ::kill(pid_t(desk->processId()), SIGKILL);
        }
        stop = true;
        for (auto &s : senders)
            s.join();
        if (killRedis) {
            ::kill(pid_t(desk->processId()), SIGTERM);
            QVERIFY(desk->waitForFinished(10'000));
        } else {
            QVERIFY(desk->waitForFinished(5000));
        }

        // What the store holds, read by redis-cli (every node of a cluster: SCAN is per node).
        QSet<QByteArray> held;
        const QByteArray marker = ":r:" + endpoint.toUtf8() + ':';
        for (int p : std::as_const(scanPorts)) {
            QProcess cli;
            cli.start(u"redis-cli"_qs, {u"-p"_qs, QString::number(p), u"--scan"_qs, u"--pattern"_qs,
                                        u"*"_qs + QString::fromUtf8(marker) + u"*"_qs});
            QVERIFY(cli.waitForFinished(30'000));
            for (const QByteArray &name : cli.readAllStandardOutput().split('\n'))
                if (const qsizetype at = name.indexOf(marker); at >= 0)
                    held.insert(name.mid(at + 3));
        }
        for (const QByteArray &key : std::as_const(processed))
            QVERIFY2(held.contains(key), key.constData());

        QProcess exported;
        exported.start(QStringLiteral(IDEMDESK_BIN),
                       {u"keys"_qs, u"export"_qs, u"--config"_qs, config});
        QVERIFY(exported.waitForFinished(60'000));
        QCOMPARE(exported.exitCode(), 0);
        QSet<QByteArray> inExport;
        for (const QByteArray &line : exported.readAllStandardOutput().split('\n'))
            if (!line.isEmpty())
                inExport.insert(QJsonDocument::fromJson(line)
                                    .object()
                                    .value(u"record"_qs)
                                    .toObject()
                                    .value(u"key"_qs)
                                    .toString()
                                    .toUtf8());
        QCOMPARE(inExport.size(), held.size());
        QVERIFY(inExport == held);

        QProcess stats;
        stats.start(QStringLiteral(IDEMDESK_BIN),
                    {u"stats"_qs, u"--json"_qs, u"--config"_qs, config});
        QVERIFY(stats.waitForFinished(60'000));
        const QJsonObject counted = QJsonDocument::fromJson(stats.readAllStandardOutput()).object();
        QCOMPARE(counted.value(u"keys"_qs).toObject().value(u"total"_qs).toInteger(),
                 qint64(held.size()));

        QProcess listed;
        listed.start(QStringLiteral(IDEMDESK_BIN),
                     {u"keys"_qs, u"list"_qs, u"--json"_qs, u"--limit"_qs,
                      QString::number(held.size() + 10), u"--config"_qs, config});
        QVERIFY(listed.waitForFinished(60'000));
        QCOMPARE(listed.readAllStandardOutput().count('\n'), held.size()); // JSON Lines
    }
};

QTEST_GUILESS_MAIN(TestCrash)
#include "tst_crash.moc"
