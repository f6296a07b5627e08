// `idemdesk serve` as a user runs it: a real process, signals, restarts, exit codes.
#include "store/sqlitestore.h"
#include "support/serveprocess.h"
#include "http/blockingclient.h"
#include "support/names.h"
#include "util/clock.h"

#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QRegularExpression>
#include <QTemporaryDir>
#include <QTest>

#include <csignal>
#include <thread>

using namespace idem;
using namespace idem::test;

namespace {

struct Served
{
    std::unique_ptr<QProcess> process;
    quint16 port = 0;
    QByteArray stderrText;
};

} // namespace

class TestServe : public QObject
{
    Q_OBJECT
    QTemporaryDir m_dir;

    QString write(const QString &name, const QByteArray &content)
    {
        QFile f(m_dir.filePath(name));
        f.open(QIODevice::WriteOnly);
        f.write(content);
        return f.fileName();
    }

    // Starts serve on a free port; the bound address is read from its first stderr line.
    Served serve(const QStringList &args)
    {
        Served s;
        s.process = startServe(QStringLiteral(IDEMDESK_BIN), args, s.port, &s.stderrText, true);
        return s;
    }
    static int stop(Served &s, int signal = SIGTERM)
    {
        ::kill(pid_t(s.process->processId()), signal);
        if (!s.process->waitForFinished(20000))
            return -1;
        return s.process->exitStatus() == QProcess::NormalExit ? s.process->exitCode() : -2;
    }
    static std::pair<int, QByteArray> runToEnd(const QStringList &args)
    {
        QProcess p;
        p.start(QStringLiteral(IDEMDESK_BIN), args);
        p.waitForFinished(20000);
        return {p.exitCode(), p.readAllStandardError()};
    }

private Q_SLOTS:
    void usageAndConfigErrorsExit2()
    {
        const QString bad = write(u"bad.json"_qs, "{\"endpoints\": [{\"name\": \"x\", \"nme\": 1}]}");
        auto [rc, err] = runToEnd({u"serve"_qs, u"--config"_qs, bad});
        QCOMPARE(rc, 2);
        QVERIFY2(err.contains("bad.json: endpoints[0].nme: unknown field"), err.constData());
        std::tie(rc, err) = runToEnd({u"serve"_qs, u"--store"_qs, u"mysql://x"_qs});
        QCOMPARE(rc, 2);
        QVERIFY(err.contains("unknown scheme"));
        std::tie(rc, err) = runToEnd({u"serve"_qs, u"--listen"_qs, u"0.0.0.0:8080"_qs});
        QCOMPARE(rc, 2);
        QVERIFY(err.contains("--allow-remote"));
        std::tie(rc, err) = runToEnd({u"serve"_qs, u"--log-format"_qs, u"xml"_qs});
        QCOMPARE(rc, 2);
        std::tie(rc, err) = runToEnd({u"frobnicate"_qs});
        QCOMPARE(rc, 2);
        QVERIFY(err.contains("unknown command 'frobnicate'"));
        std::tie(rc, err) = runToEnd({u"serve"_qs, u"--no-such-option"_qs});
        QCOMPARE(rc, 2);
        QCOMPARE(runToEnd({u"serve"_qs, u"--help"_qs}).first, 0);
    }

    void unusableStoreExits1()
    {
        write(u"file"_qs, "x");
        auto [rc, err] = runToEnd({u"serve"_qs, u"--store"_qs, u"sqlite:"_qs + m_dir.filePath(u"file/sub/x.db"_qs)});
        QCOMPARE(rc, 1);
        QVERIFY2(err.contains("idemdesk: "), err.constData());
    }

    void completedRecordsSurviveARestart()
    {
        const QString store = u"sqlite:"_qs + m_dir.filePath(u"restart.db"_qs);
        Served first = serve({u"--store"_qs, store});
        QVERIFY2(first.port, first.stderrText.constData());
        const ClientResponse a = post(first.port, "/hooks/generic", "{\"a\":1}", {{"Idempotency-Key", "k1"}});
        QCOMPARE(a.header("Idempotency-Outcome"), QByteArray("processed"));
        QCOMPARE(stop(first), 0);
        const QByteArray log = first.process->readAllStandardOutput();
        QVERIFY2(log.contains(" generic generic:k1 processed 200 "), log.constData());

        Served second = serve({u"--store"_qs, store, u"--log-format"_qs, u"json"_qs});
        QVERIFY(second.port);
        const ClientResponse b = post(second.port, "/hooks/generic", "{\"a\":1}", {{"Idempotency-Key", "k1"}});
        QCOMPARE(b.header("Idempotency-Outcome"), QByteArray("replayed"));
        QCOMPARE(b.body, a.body);
        QCOMPARE(stop(second, SIGINT), 0);
        const QList<QByteArray> lines = second.process->readAllStandardOutput().trimmed().split('\n');
        QCOMPARE(lines.size(), 1);
        const QJsonObject line = QJsonDocument::fromJson(lines.first()).object();
        QCOMPARE(line.value(u"outcome").toString(), u"replayed"_qs);
        QCOMPARE(line.value(u"key").toString(), u"generic:k1"_qs);
        QCOMPARE(line.value(u"status").toInt(), 200);
    }

    void sigtermFinishesInFlightDeliveries()
    {
        const QString db = m_dir.filePath(u"graceful.db"_qs);
        const QString config = write(u"slow.json"_qs,
                                     "{\"endpoints\": [{\"name\": \"slow\", \"simulate\": {\"delay_ms\": 1500}}]}");
        Served s = serve({u"--store"_qs, u"sqlite:"_qs + db, u"--config"_qs, config});
        QVERIFY(s.port);
        ClientResponse answer;
        std::thread sender([&] { answer = post(s.port, "/hooks/slow", "{}", {{"Idempotency-Key", "g"}}); });
        // Another process's view of the same store: the claim is there, processing.
        auto watcher = SqliteStore::open(db);
        QVERIFY(watcher.ok());
        QTRY_VERIFY_WITH_TIMEOUT((*watcher)->key(u"slow:g"_qs)->has_value(), 5000);
        QCOMPARE(name((*(*watcher)->key(u"slow:g"_qs))->state), name(KeyState::Processing));
        ::kill(pid_t(s.process->processId()), SIGTERM);
        sender.join();
        QCOMPARE(answer.status, 200);
        QCOMPARE(answer.header("Idempotency-Outcome"), QByteArray("processed"));
        QVERIFY(s.process->waitForFinished(10000));
        QCOMPARE(s.process->exitCode(), 0);
        QCOMPARE(name((*(*watcher)->key(u"slow:g"_qs))->state), name(KeyState::Completed));
        // And no new connection is accepted once stopping began.
        QCOMPARE(post(s.port, "/hooks/slow", "{}", {{"Idempotency-Key", "h"}}).status, 0);
    }
};

QTEST_GUILESS_MAIN(TestServe)
#include "tst_serve.moc"
