// Several `idemdesk serve` processes sharing one Redis, Redis Cluster or PostgreSQL keep the guarantee:
// 64 concurrent identical deliveries per key, spread over two processes, for 200 keys,
// reach a counting downstream exactly 200 times.
#include "support/downstream.h"
#include "support/serveprocess.h"
#include "http/blockingclient.h"

#include <QProcess>
#include <QRandomGenerator>
#include <QRegularExpression>
#include <QTemporaryDir>
#include <QTest>

#include <barrier>
#include <csignal>
#include <thread>

using namespace idem;
using namespace idem::test;

class TestMultiInstance : public QObject
{
    Q_OBJECT
    QTemporaryDir m_dir;

    static std::unique_ptr<QProcess> serve(const QStringList &args, quint16 &port)
    {
        return startServe(QStringLiteral(IDEMDESK_BIN), args, port);
    }

private Q_SLOTS:
    void twoProcessesOneStore_data()
    {
        QTest::addColumn<QString>("variable");
        QTest::newRow("redis") << u"IDEM_TEST_REDIS_URL"_qs;
        QTest::newRow("redis cluster") << u"IDEM_TEST_REDIS_CLUSTER_URL"_qs;
        QTest::newRow("postgres") << u"IDEM_TEST_POSTGRES_URL"_qs;
    }
    void twoProcessesOneStore()
    {
        QFETCH(QString, variable);
        const QString store = qEnvironmentVariable(variable.toLatin1().constData());
        if (store.isEmpty())
            QFAIL(qPrintable(variable + u" is not set: run through ./dev test"_qs));
        CountingDownstream down;
        // A fresh endpoint name per run keeps earlier runs' keys on the shared server apart.
        const QString endpoint = u"mi%1"_qs.arg(QRandomGenerator::global()->bounded(1u << 30), 0, 36);
        QFile config(m_dir.filePath(endpoint + u".json"_qs));
        QVERIFY(config.open(QIODevice::WriteOnly));
        config.write("{\"endpoints\": [{\"name\": \"" + endpoint.toUtf8() + "\", \"forward_to\": \""
                     + down.url().toString().toUtf8() + "\"}]}");
        config.close();
        quint16 ports[2] = {0, 0};
        auto a = serve({u"--store"_qs, store, u"--config"_qs, config.fileName()}, ports[0]);
        auto b = serve({u"--store"_qs, store, u"--config"_qs, config.fileName()}, ports[1]);
        QVERIFY(ports[0] && ports[1]);

        constexpr int kCopies = 64;
        constexpr int kKeys = 200;
        const QByteArray path = "/hooks/" + endpoint.toUtf8();
        std::barrier sync(kCopies);
        std::atomic<int> processed{0}, replayed{0}, inProgress{0}, other{0};
        std::vector<std::thread> senders;
        for (int i = 0; i < kCopies; ++i) {
            senders.emplace_back([&, i] {
                RawConnection c(ports[i % 2]); // half the copies to each process, kept alive
                for (int k = 0; k < kKeys; ++k) {
                    sync.arrive_and_wait(); // all 64 copies of key k leave together
                    const QByteArray key = "order-" + QByteArray::number(k);
                    const QByteArray body = "{\"order\":" + QByteArray::number(k) + "}";
                    c.send(buildPost(path, body, {{"Idempotency-Key", key}}, false));
                    const ClientResponse r = c.readResponse();
                    const QByteArray outcome = r.header("Idempotency-Outcome");
                    if (outcome == "processed" && r.status == 200)
                        ++processed;
                    else if (outcome == "replayed" && r.status == 200)
                        ++replayed;
                    else if (outcome == "in-progress" && r.status == 409)
                        ++inProgress;
                    else
                        ++other;
                }
            });
        }
        for (auto &t : senders)
            t.join();
        qInfo("%d processed, %d replayed, %d in-progress, %d other", processed.load(), replayed.load(),
              inProgress.load(), other.load());
        QCOMPARE(other.load(), 0);
        QCOMPARE(processed.load(), kKeys);
        QCOMPARE(down.total(), kKeys);
        for (int k = 0; k < kKeys; ++k)
            QCOMPARE(down.count((endpoint + u":order-"_qs).toUtf8() + QByteArray::number(k)), 1);
        for (auto *p : {a.get(), b.get()}) {
            ::kill(pid_t(p->processId()), SIGTERM);
            QVERIFY(p->waitForFinished(15000));
            QCOMPARE(p->exitCode(), 0);
        }
    }
};

QTEST_GUILESS_MAIN(TestMultiInstance)
#include "tst_multi_instance.moc"
