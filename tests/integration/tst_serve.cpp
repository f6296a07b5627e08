// `idemdesk serve` as a user runs it: a real process, signals, restarts, exit codes.
#include "http/blockingclient.h"
#include "store/sqlitestore.h"
#include "support/downstream.h"
#include "support/names.h"
#include "support/serveprocess.h"
#include "support/servers.h"
#include "util/clock.h"

#include <QDeadlineTimer>
#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QRandomGenerator>
#include <QRegularExpression>
#include <QScopeGuard>
#include <QTemporaryDir>
#include <QTest>
#include <QUrl>

#include <sqlite3.h>

#include <csignal>
#include <fcntl.h>
#include <poll.h>
#include <thread>
#include <unistd.h>

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
    // Starts serve with its stdout and stderr both on `fd` (`serve 2>&1 | reader`), on a port
    // chosen here (the line naming it goes to `fd` too); port 0 if it does not answer /healthz.
    Served serveInto(int fd, const QStringList &args)
    {
        Served s;
        const quint16 port = freePort();
        s.process = std::make_unique<QProcess>();
        s.process->setChildProcessModifier([fd] {
            ::dup2(fd, STDOUT_FILENO);
            ::dup2(fd, STDERR_FILENO);
        });
        s.process->start(QStringLiteral(IDEMDESK_BIN),
                         QStringList{u"serve"_qs, u"--listen"_qs, u"127.0.0.1:%1"_qs.arg(port)} +
                             args);
        if (s.process->waitForStarted(5000) && QTest::qWaitFor(
                                                   [&] {
                                                       return s.process->state() !=
                                                                  QProcess::Running ||
                                                              get(port, "/healthz").status == 200;
                                                   },
                                                   20000))
            s.port = s.process->state() == QProcess::Running ? port : 0;
        return s;
    }
    static int stop(Served &s, int signal = SIGTERM)
    {
        ::kill(pid_t(s.process->processId()), signal);
        if (!s.process->waitForFinished(20000))
            return -1;
        return s.process->exitStatus() == QProcess::NormalExit ? s.process->exitCode() : -2;
    }
    // A GET on a new connection; status 0 when the connection is refused or closed unanswered.
    static ClientResponse get(quint16 port, const QByteArray &path,
                              const QByteArray &method = "GET")
    {
        RawConnection c(port, 2000);
        if (!c.isOpen() ||
            !c.send(method + " " + path +
                    " HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"))
            return {};
        return c.readResponse();
    }
    // A HEAD on a new connection: its body is what followed the headers until the server closed
    // the connection (nothing, when the server keeps to RFC 9110).
    static ClientResponse head(quint16 port, const QByteArray &path)
    {
        RawConnection c(port, 2000);
        if (!c.isOpen() ||
            !c.send("HEAD " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
            return {};
        ClientResponse r = c.readResponse(true);
        r.body = c.readBytes(1 << 20);
        return r;
    }
    // A HEAD is answered as a GET is, without the body: the same status and Content-Length.
    static void checkHead(quint16 port, const QByteArray &path)
    {
        const ClientResponse get = TestServe::get(port, path);
        const ClientResponse head = TestServe::head(port, path);
        QCOMPARE(head.status, get.status);
        QCOMPARE(head.header("Content-Type"), get.header("Content-Type"));
        QCOMPARE(head.header("Content-Length"), QByteArray::number(get.body.size()));
        QVERIFY2(head.body.isEmpty(), head.body.left(200).constData());
    }
    static std::pair<int, QByteArray> runToEnd(const QStringList &args)
    {
        QProcess p;
        p.start(QStringLiteral(IDEMDESK_BIN), args);
        p.waitForFinished(20000);
        return {p.exitCode(), p.readAllStandardError()};
    }

private Q_SLOTS:
    // /metrics on its own listener in the Prometheus text format (checked by promtool), /readyz
    // on the webhook listener following the store's schema (docs/operations.md#health).
    void metricsAndReadiness()
    {
        const QString config = write(u"metrics.json"_qs, R"({"endpoints": [
            {"name": "ok", "provider": "generic"},
            {"name": "bad", "provider": "generic", "simulate": {"fail_rate": 1.0}}]})");
        const QString db = m_dir.filePath(u"metrics.db"_qs);
        Served s = serve({u"--config"_qs, config, u"--store"_qs, u"sqlite:"_qs + db,
                          u"--metrics-listen"_qs, u"127.0.0.1:0"_qs});
        QVERIFY2(s.port, s.stderrText.constData());
        const auto metricsPortOf = [](const Served &served) {
            return quint16(
                QRegularExpression(u"metrics at http://127\\.0\\.0\\.1:(\\d+)/metrics"_qs)
                    .match(QString::fromUtf8(served.stderrText))
                    .captured(1)
                    .toUInt());
        };
        quint16 metricsPort = metricsPortOf(s);
        QVERIFY2(metricsPort, s.stderrText.constData());

        QCOMPARE(post(s.port, "/hooks/ok", "{}", {{"Idempotency-Key", "k1"}})
                     .header("Idempotency-Outcome"),
                 QByteArray("processed"));
        QCOMPARE(post(s.port, "/hooks/ok", "{}", {{"Idempotency-Key", "k1"}})
                     .header("Idempotency-Outcome"),
                 QByteArray("replayed"));
        QCOMPARE(post(s.port, "/hooks/bad", "{}", {{"Idempotency-Key", "k2"}}).status, 500);
        QCOMPARE(post(s.port, "/hooks/nope", "{}", {{"Idempotency-Key", "k3"}}).status, 404);
        QCOMPARE(get(s.port, "/metrics").status, 404); // never on the webhook listener
        QCOMPARE(get(s.port, "/readyz").status, 200);
        checkHead(s.port, "/readyz");
        QCOMPARE(get(s.port, "/healthz").status, 200);
        const ClientResponse healthHead = head(s.port, "/healthz");
        QCOMPARE(healthHead.status, 200);
        QVERIFY(healthHead.header("Content-Length").toInt() > 0);
        QVERIFY(healthHead.body.isEmpty());

        // The store is pinged and counted on a schedule, never for a scrape: many scrapes
        // make no count (the next is 15 s after the one at start).
        QByteArray text;
        QTRY_VERIFY_WITH_TIMEOUT(
            (text = get(metricsPort, "/metrics").body).contains("idemdesk_store_up 1\n"), 10000);
        for (int i = 0; i < 20; ++i)
            QCOMPARE(get(metricsPort, "/metrics").status, 200);
        const ClientResponse metricsHead = head(metricsPort, "/metrics");
        QCOMPARE(metricsHead.status, 200);
        QVERIFY2(metricsHead.body.isEmpty(),
                 metricsHead.body.left(200).constData()); // headers only
        // The Content-Length a GET sends (taken one after the other: a ping or count between
        // them may change a value, so until they agree).
        QTRY_COMPARE_WITH_TIMEOUT(head(metricsPort, "/metrics").header("Content-Length"),
                                  QByteArray::number(get(metricsPort, "/metrics").body.size()),
                                  10000);
        text = get(metricsPort, "/metrics").body;
        const auto counts = QRegularExpression(u"\nidemdesk_key_counts_total (\\d+)\n"_qs)
                                .match(QString::fromUtf8(text));
        QVERIFY2(counts.hasMatch() && counts.captured(1).toInt() <= 2, text.constData());
        QVERIFY2(text.contains("\nidemdesk_key_count_duration_seconds "), text.constData());
        // No processor ran for a path that matched no endpoint: no such series.
        QVERIFY2(!text.contains("idemdesk_processor_runs_total{endpoint=\"\"}") &&
                     !text.contains("idemdesk_processor_duration_seconds_count{endpoint=\"\"}"),
                 text.constData());
        for (const char *line :
             {"idemdesk_deliveries_total{endpoint=\"ok\",outcome=\"processed\"} 1\n",
              "idemdesk_deliveries_total{endpoint=\"ok\",outcome=\"replayed\"} 1\n",
              "idemdesk_deliveries_total{endpoint=\"\",outcome=\"rejected\"} 2\n", // /hooks/nope,
                                                                                   // GET /metrics
              "idemdesk_deliveries_total{endpoint=\"bad\",outcome=\"processed\"} 1\n",
              "idemdesk_processor_runs_total{endpoint=\"bad\"} 1\n",
              "idemdesk_processor_failures_total{endpoint=\"bad\"} 1\n",
              "idemdesk_processor_failures_total{endpoint=\"ok\"} 0\n",
              "idemdesk_delivery_duration_seconds_count{endpoint=\"ok\"} 2\n",
              "idemdesk_processor_duration_seconds_count{endpoint=\"ok\"} 1\n",
              "idemdesk_lease_recoveries_total 0\n", "idemdesk_finish_retries_total 0\n",
              "idemdesk_store_errors_total 0\n", "idemdesk_in_flight 0\n", "idemdesk_store_up 1\n"})
            QVERIFY2(text.contains(line), (QByteArray(line) + " not in:\n" + text).constData());
        QVERIFY(QRegularExpression(u"\nidemdesk_store_round_trips_total [1-9]"_qs)
                    .match(QString::fromUtf8(text))
                    .hasMatch());
        // A webhook path (after the counts above: these are deliveries too) answers HEAD as GET:
        // 405 with a problem+json body.
        QCOMPARE(get(s.port, "/hooks/ok").status, 405);
        checkHead(s.port, "/hooks/ok");
        QCOMPARE(stop(s), 0);

        // The count made at start: a desk started again over the same store shows its keys.
        s = serve({u"--config"_qs, config, u"--store"_qs, u"sqlite:"_qs + db,
                   u"--metrics-listen"_qs, u"127.0.0.1:0"_qs});
        QVERIFY2(s.port, s.stderrText.constData());
        metricsPort = metricsPortOf(s);
        QVERIFY2(metricsPort, s.stderrText.constData());
        QTRY_VERIFY_WITH_TIMEOUT(
            (text = get(metricsPort, "/metrics").body)
                .contains("idemdesk_keys{endpoint=\"bad\",state=\"failed\"} 1\n"),
            10000);
        QVERIFY2(text.contains("idemdesk_keys{endpoint=\"ok\",state=\"completed\"} 1\n"),
                 text.constData());

        // promtool (Debian's prometheus) reads it as Prometheus would.
        QProcess promtool;
        promtool.start(u"promtool"_qs, {u"check"_qs, u"metrics"_qs});
        QVERIFY2(promtool.waitForStarted(), "promtool is missing (Debian package prometheus)");
        promtool.write(text);
        promtool.closeWriteChannel();
        QVERIFY(promtool.waitForFinished(20000));
        QVERIFY2(promtool.exitCode() == 0, promtool.readAll().constData());

        // A store migrated past this build's schema is not ready.
        sqlite3 *handle = nullptr;
        QCOMPARE(sqlite3_open(db.toUtf8().constData(), &handle), SQLITE_OK);
        QCOMPARE(sqlite3_exec(handle, "PRAGMA user_version = 99", nullptr, nullptr, nullptr),
                 SQLITE_OK);
        sqlite3_close(handle);
        const ClientResponse notReady = get(s.port, "/readyz");
        QCOMPARE(notReady.status, 503);
        // Why is for the log, not for whoever can reach the webhook port.
        QCOMPARE(notReady.body, QByteArray(R"({"status":"not ready"})"));
        QCOMPARE(head(s.port, "/readyz").status, 503);
        QByteArray log;
        QTRY_VERIFY2((log += s.process->readAllStandardError())
                         .contains("/readyz: store not ready: the SQLite schema is at version 99"),
                     log.constData());
        QVERIFY2(!log.sliced(log.indexOf("/readyz")).mid(1).contains("/readyz"),
                 log.constData()); // once, not per probe
        // Probes answer GET and HEAD only.
        for (const QByteArray path : {"/readyz", "/healthz"}) {
            const ClientResponse posted = get(s.port, path, "POST");
            QCOMPARE(posted.status, 405);
            QCOMPARE(posted.header("Allow"), QByteArray("GET, HEAD"));
        }
        QCOMPARE(stop(s), 0);

        // Loopback only unless --allow-remote; never the webhook port.
        auto [rc, err] = runToEnd({u"serve"_qs, u"--metrics-listen"_qs, u"0.0.0.0:9464"_qs});
        QCOMPARE(rc, 2);
        QVERIFY2(err.contains("refusing to serve metrics on 0.0.0.0:9464") &&
                     err.contains("--allow-remote"),
                 err.constData());
        std::tie(rc, err) = runToEnd({u"serve"_qs, u"--listen"_qs, u"127.0.0.1:8799"_qs,
                                      u"--metrics-listen"_qs, u"127.0.0.1:8799"_qs});
        QCOMPARE(rc, 2);
        QVERIFY2(err.contains("never served on the webhook listener"), err.constData());
        // The same port on another host is the same mistake (0.0.0.0 covers 127.0.0.1).
        std::tie(rc, err) = runToEnd({u"serve"_qs, u"--listen"_qs, u"127.0.0.1:8799"_qs,
                                      u"--metrics-listen"_qs, u"127.0.0.2:8799"_qs});
        QCOMPARE(rc, 2);
        QVERIFY2(err.contains("never served on the webhook listener"), err.constData());
        const QString same = write(
            u"same.json"_qs, R"({"listen": "127.0.0.1:8799", "metrics_listen": "127.0.0.1:8799"})");
        std::tie(rc, err) = runToEnd({u"serve"_qs, u"--config"_qs, same});
        QCOMPARE(rc, 2);
        QVERIFY2(err.contains("metrics_listen: must differ from \"listen\""), err.constData());
    }

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

    // Past the open-file limit accept() failed with EMFILE, which Qt retries at once: the
    // receiver spun on it and answered no one. It now takes no more connections than the limit
    // allows (two descriptors each, a reserve kept) and answers the rest 503 at once.
    void connectionsStayWithinTheOpenFileLimit()
    {
        Served s;
        s.process = startServe(QStringLiteral(IDEMDESK_BIN),
                               {u"--store"_qs, u"sqlite:"_qs + m_dir.filePath(u"files.db"_qs)},
                               s.port, &s.stderrText, true, {}, 64);
        QVERIFY2(s.port, s.stderrText.constData());
        QVERIFY2(s.stderrText.contains("max_connections 4096 lowered to 24"),
                 s.stderrText.constData());
        std::vector<std::unique_ptr<RawConnection>> idle;
        for (int i = 0; i < 60; ++i) {
            idle.push_back(std::make_unique<RawConnection>(s.port, 5000));
            QVERIFY(idle.back()->isOpen());
        }
        const ClientResponse refused =
            post(s.port, "/hooks/generic", "{}", {{"Idempotency-Key", "f1"}});
        QCOMPARE(refused.status, 503);
        QVERIFY2(refused.body.contains("connection limit"), refused.body.constData());
        idle.clear();
        ClientResponse after; // the connections closed: served again
        QVERIFY(QTest::qWaitFor(
            [&] {
                after = post(s.port, "/hooks/generic", "{}", {{"Idempotency-Key", "f1"}});
                return after.status != 503;
            },
            5000));
        QCOMPARE(after.status, 200);
        QCOMPARE(stop(s), 0);
    }

    // A network store that is not there yet at start (a boot where Redis comes up after the desk)
    // is waited for, each try said on stderr, and served once it answers — serve used to exit
    // and wait for a supervisor to start it again.
    void serveWaitsForItsStoreAtStart()
    {
        RedisServer redis(m_dir.path());
        QProcess process;
        process.setStandardOutputFile(QProcess::nullDevice());
        process.start(QStringLiteral(IDEMDESK_BIN),
                      {u"serve"_qs, u"--listen"_qs, u"127.0.0.1:0"_qs, u"--store"_qs, redis.url()});
        QVERIFY(process.waitForStarted(5000));
        const auto guard = qScopeGuard([&process] {
            process.kill();
            process.waitForFinished(5000);
        });
        QByteArray err;
        auto readUntil = [&](const QRegularExpression &re, int ms) {
            QRegularExpressionMatch m;
            for (QDeadlineTimer deadline(ms);
                 !deadline.hasExpired() && process.state() == QProcess::Running;) {
                process.waitForReadyRead(100);
                err += process.readAllStandardError();
                if ((m = re.match(QString::fromUtf8(err))).hasMatch())
                    break;
            }
            return m;
        };
        QVERIFY2(
            readUntil(QRegularExpression(
                          u"cannot connect to Redis.*waiting for the store: next try in 1 s"_qs),
                      10'000)
                .hasMatch(),
            err.constData());
        QVERIFY(redis.start());
        const auto receiving = readUntil(
            QRegularExpression(u"receiving webhooks at http://127\\.0\\.0\\.1:(\\d+)/"_qs), 30'000);
        QVERIFY2(receiving.hasMatch(), err.constData());
        const quint16 port = quint16(receiving.captured(1).toUInt());
        QCOMPARE(get(port, "/healthz").status, 200);
        QCOMPARE(post(port, "/hooks/generic", "{}", {{"Idempotency-Key", "late-store"}}).status,
                 200);
        ::kill(pid_t(process.processId()), SIGTERM);
        QVERIFY(process.waitForFinished(20'000));
        QCOMPARE(process.exitCode(), 0);

        // What the server says about the URL itself does not pass by waiting: exit 1 at once.
        QProcess wrongDb;
        wrongDb.start(QStringLiteral(IDEMDESK_BIN),
                      {u"serve"_qs, u"--listen"_qs, u"127.0.0.1:0"_qs, u"--store"_qs,
                       redis.url().replace(u"/0"_qs, u"/99"_qs)});
        QVERIFY(wrongDb.waitForFinished(10'000));
        QCOMPARE(wrongDb.exitCode(), 1);
        QVERIFY2(wrongDb.readAllStandardError().contains("out of range"), "DB index");
    }

    // Each delivery's line is written while serve runs, the receiver then idle: its writer is
    // woken once a turn of the receiver's loop, not once a line, and a quiet receiver still turns.
    // (Without the wake the lines waited for the stop, or for 64 KiB of others.)
    void eachDeliveryIsLoggedWhileServeRuns()
    {
        Served s = serve({u"--store"_qs, u"sqlite:"_qs + m_dir.filePath(u"live.db"_qs)});
        QVERIFY2(s.port, s.stderrText.constData());
        QByteArray log;
        for (const QByteArray key : {"live1", "live2"}) {
            const ClientResponse r =
                post(s.port, "/hooks/generic", "{}", {{"Idempotency-Key", key}});
            QCOMPARE(r.status, 200);
            QVERIFY2(QTest::qWaitFor(
                         [&] {
                             log += s.process->readAllStandardOutput();
                             return log.contains(" generic:" + key + " processed 200 ");
                         },
                         20000),
                     log.constData());
        }
        QCOMPARE(s.process->state(), QProcess::Running);
        QCOMPARE(stop(s), 0);
    }

    void logLinesCarryNoBidiOrC1Control_data()
    {
        QTest::addColumn<QString>("format");
        QTest::newRow("json") << u"json"_qs;
        QTest::newRow("text") << u"text"_qs;
    }
    void logLinesCarryNoBidiOrC1Control()
    {
        // An unknown endpoint's percent-decoded name reaches the log line: U+202E (right-to-left
        // override), U+009B (a terminal's CSI), U+2028 and U+2029 (line breaks to JavaScript)
        // are written as \uXXXX, never raw. JSON stays JSON and reads back the same text.
        QFETCH(QString, format);
        Served s = serve({u"--store"_qs, u"sqlite:"_qs + m_dir.filePath(u"bidi.db"_qs),
                          u"--log-format"_qs, format});
        QVERIFY2(s.port, s.stderrText.constData());
        QCOMPARE(
            post(s.port, "/hooks/a%E2%80%AEb%C2%9B%5B2Jc%E2%80%A8d%E2%80%A9e%7Fz", "{}").status,
            404);
        QCOMPARE(stop(s), 0);
        const QByteArray log = s.process->readAllStandardOutput();
        QCOMPARE(log.count('\n'), 1);
        for (const QByteArray raw :
             {"\xe2\x80\xae", "\xc2\x9b", "\xe2\x80\xa8", "\xe2\x80\xa9", "\x7f"})
            QVERIFY2(!log.contains(raw), log.constData());
        QVERIFY2(log.contains("a\\u202eb\\u009b[2Jc\\u2028d\\u2029e\\u007fz"), log.constData());
        if (format == u"json"_qs) {
            QJsonParseError error;
            const QJsonObject line = QJsonDocument::fromJson(log, &error).object();
            QCOMPARE(error.error, QJsonParseError::NoError);
            QVERIFY2(line.value(u"detail"_qs)
                         .toString()
                         .contains(u"a\u202eb\u009b[2Jc\u2028d\u2029e\u007fz"_qs),
                     log.constData());
        }
    }

    void aStoresTextReachesStderrEscaped()
    {
        // A shared PostgreSQL another party can change: a trigger on the desk's table that
        // refuses every finish with a message holding terminal escapes (clear the screen, set
        // the window's title) and line breaks, after a NOTICE of the same kind. serve says so on
        // stderr through a Qt warning ("recording a result failed"), one line, escaped; the
        // notice never reaches it raw.
        const QString shared = qEnvironmentVariable("IDEM_TEST_POSTGRES_URL");
        if (shared.isEmpty())
            QFAIL("IDEM_TEST_POSTGRES_URL is not set: run through ./dev test");
        const QString db =
            u"hostile_"_qs + QString::number(QRandomGenerator::global()->bounded(1u << 30), 36);
        const auto psql = [](const QString &url, const QString &sql) {
            QProcess p;
            p.start(u"psql"_qs,
                    {u"-qX"_qs, u"-v"_qs, u"ON_ERROR_STOP=1"_qs, u"-d"_qs, url, u"-c"_qs, sql});
            p.waitForFinished(20000);
            return p.exitCode() == 0 ? QByteArray() : p.readAllStandardError() + "(psql failed)";
        };
        QCOMPARE(psql(shared, u"CREATE DATABASE "_qs + db), QByteArray());
        auto dropped = qScopeGuard([&] { psql(shared, u"DROP DATABASE IF EXISTS "_qs + db); });
        QUrl url(shared);
        url.setPath(u"/"_qs + db);
        const QString config = write(u"pg-hostile.json"_qs,
                                     "{\"store\": \"" + url.toString().toUtf8() +
                                         "\", \"endpoints\": [{\"name\": \"e\", "
                                         "\"forward_timeout_seconds\": 1, \"lease_seconds\": 3}]}");
        Served s = serve({u"--config"_qs, config});
        QVERIFY2(s.port, s.stderrText.constData());
        QCOMPARE(psql(url.toString(),
                      uR"(CREATE FUNCTION hostile() RETURNS trigger LANGUAGE plpgsql AS $$
                          BEGIN
                            RAISE NOTICE E'\x1b]0;owned by a notice\x07';
                            RAISE EXCEPTION E'\x1b[2J\x1b]0;owned\x07\r\n2030-01-01 forged line';
                          END $$;
                          CREATE TRIGGER hostile BEFORE UPDATE ON idem_keys
                            FOR EACH ROW WHEN (NEW.state = 'completed')
                            EXECUTE FUNCTION hostile();)"_qs),
                 QByteArray());
        const ClientResponse r = post(s.port, "/hooks/e", "{}", {{"Idempotency-Key", "k1"}});
        QCOMPARE(r.status, 504); // the result could not be recorded within the lease
        QCOMPARE(stop(s), 0);
        const QByteArray err = s.stderrText + s.process->readAllStandardError();
        QVERIFY2(err.contains("recording a result failed"), err.constData());
        QVERIFY2(
            err.contains("\\u001b[2J\\u001b]0;owned\\u0007\\u000d\\u000a2030-01-01 forged line"),
            err.constData());
        for (const char c : err)
            QVERIFY2(uchar(c) >= 0x20 || c == '\n', err.constData());
        for (const QByteArray &line : err.split('\n'))
            QVERIFY2(!line.startsWith("2030-01-01"), err.constData());
        // The same through Qt's own handler (every command but serve): keys retry, once the
        // lease of serve's run has ended.
        QByteArray retryErr;
        const QDeadlineTimer deadline(20000);
        do {
            QProcess retry;
            retry.start(QStringLiteral(IDEMDESK_BIN), {u"keys"_qs, u"retry"_qs, u"e:k1"_qs,
                                                       u"--force"_qs, u"--config"_qs, config});
            QVERIFY(retry.waitForFinished(30000));
            retryErr = retry.readAllStandardError();
        } while (retryErr.contains("its lease has not ended") && !deadline.hasExpired());
        QVERIFY2(retryErr.contains("recording a result failed") &&
                     retryErr.contains("\\u001b[2J\\u001b]0;owned\\u0007"),
                 retryErr.constData());
        for (const char c : retryErr)
            QVERIFY2(uchar(c) >= 0x20 || c == '\n', retryErr.constData());
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

    void sigtermFinishesInFlightDeliveries_data()
    {
        QTest::addColumn<int>("signal");
        QTest::newRow("SIGTERM") << SIGTERM;
        QTest::newRow("SIGHUP") << SIGHUP; // a closed terminal: it killed serve at once
    }
    void sigtermFinishesInFlightDeliveries()
    {
        QFETCH(int, signal);
        CountingDownstream down;
        const QString db = m_dir.filePath(u"graceful%1.db"_qs.arg(signal));
        const QString config = write(u"slow.json"_qs, "{\"endpoints\": [{\"name\": \"slow\", \"forward_to\": \""
                                                          + down.url().toString().toUtf8() + "\"}]}");
        Served s = serve({u"--store"_qs, u"sqlite:"_qs + db, u"--config"_qs, config});
        QVERIFY(s.port);
        QCOMPARE(get(s.port, "/healthz").status, 200); // it accepts connections before the signal
        // A delivery held at the downstream: in flight for as long as the test keeps the gate shut.
        down.closeGate();
        ClientResponse answer;
        std::jthread sender([&] { answer = post(s.port, "/hooks/slow", "{}", {{"Idempotency-Key", "g"}}); });
        QTRY_COMPARE_WITH_TIMEOUT(down.count("slow:g"), 1, 5000);
        // Another process's view of the same store: the claim is there, processing.
        auto watcher = SqliteStore::open(db);
        QVERIFY(watcher.ok());
        QCOMPARE(name((*(*watcher)->key(u"slow:g"_qs))->state), name(KeyState::Processing));

        // Senders' keep-alive connections open before the signal: one idle after an answer, one
        // whose request is still arriving (its body is not sent yet).
        RawConnection idle(s.port, 5000);
        QVERIFY(idle.send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"));
        QCOMPARE(idle.readResponse().status, 200);
        RawConnection arriving(s.port, 5000);
        const QByteArray late =
            buildPost("/hooks/slow", "{}", {{"Idempotency-Key", "late"}}, false);
        QVERIFY(arriving.send(late.left(late.size() - 2)));

        ::kill(pid_t(s.process->processId()), signal);
        // Stopping began: no new connection is served, while the delivery is still in flight.
        QTRY_COMPARE_WITH_TIMEOUT(get(s.port, "/healthz").status, 0, 10000);
        QCOMPARE(s.process->state(), QProcess::Running);
        QCOMPARE(down.held(), 1);
        QCOMPARE(answer.status, 0);
        QCOMPARE(name((*(*watcher)->key(u"slow:g"_qs))->state), name(KeyState::Processing));
        // Nor does an open connection take another delivery: the idle one is closed, the request
        // that completes now is refused unstarted (503, the sender sends it again), nothing
        // claimed. (Before, keep-alive senders went on being served for the whole grace, and
        // what was in flight when it ran out was cut off, to be processed a second time.)
        QVERIFY(idle.waitClosed(5000));
        QVERIFY(arriving.send(late.right(2)));
        const ClientResponse refused = arriving.readResponse();
        QCOMPARE(refused.status, 503);
        QCOMPARE(refused.header("Connection"), QByteArray("close"));
        QVERIFY(refused.header("Retry-After").toInt() > 0);
        QVERIFY(arriving.waitClosed(5000));
        QVERIFY(!(*(*watcher)->key(u"slow:late"_qs)).has_value());
        QCOMPARE(down.count("slow:late"), 0);

        // The in-flight delivery still gets its answer, is recorded, and then the process exits 0.
        down.openGate();
        sender.join();
        QCOMPARE(answer.status, 200);
        QCOMPARE(answer.header("Idempotency-Outcome"), QByteArray("processed"));
        QVERIFY(s.process->waitForFinished(10000));
        QCOMPARE(s.process->exitStatus(), QProcess::NormalExit);
        QCOMPARE(s.process->exitCode(), 0);
        QCOMPARE(name((*(*watcher)->key(u"slow:g"_qs))->state), name(KeyState::Completed));
        QCOMPARE(down.total(), 1);
    }

    // A stdout nobody reads (`serve | less` paused, a stuck log shipper) stalls neither the
    // deliveries nor serve's stop: lines past the log's buffer are dropped and counted, told on
    // stderr at the first drop and on stdout once it takes lines again; at the stop what stdout
    // does not take is said lost. Every line is accounted for: read, dropped or lost. (Before,
    // the main thread blocked in fwrite: the lines piled up in memory without bound and SIGTERM
    // was never handled.)
    void aStalledStdoutStallsNothing()
    {
        int out[2];
        QVERIFY(::pipe2(out, O_CLOEXEC) == 0); // 64 KB, as pipes are by default
        auto closeRead = qScopeGuard([&out] { ::close(out[0]); });
        Served s;
        s.process = startServe(QStringLiteral(IDEMDESK_BIN),
                               {u"--store"_qs, u"sqlite:"_qs + m_dir.filePath(u"stalled.db"_qs)},
                               s.port, &s.stderrText, true, {}, 0, out[1]);
        ::close(out[1]);
        QVERIFY2(s.port, s.stderrText.constData());
        // An unknown endpoint's line quotes its name: ~2 KB a line, so 1000 of them fill the pipe
        // 30 times over and the log's buffer (1 MiB) twice. Each answered, one after the other.
        const QByteArray unknown = "/hooks/" + QByteArray(2000, 'u');
        RawConnection sender(s.port, 20000);
        int sent = 0;
        auto deliver = [&](int pairs) {
            for (int i = 0; i < pairs; ++i, sent += 2) {
                if (!sender.send(buildPost("/hooks/generic", "{}",
                                           {{"Idempotency-Key", "k" + QByteArray::number(sent)}},
                                           false)) ||
                    sender.readResponse().status != 200 ||
                    !sender.send(buildPost(unknown, "{}", {}, false)) ||
                    sender.readResponse().status != 404)
                    return false;
            }
            return true;
        };
        QVERIFY(deliver(1000));
        QCOMPARE(get(s.port, "/healthz").status, 200);
        QTRY_VERIFY_WITH_TIMEOUT((s.stderrText += s.process->readAllStandardError())
                                     .contains("stdout takes no more log lines"),
                                 10000);

        // Read: what waited comes, then the count of what was dropped, then what followed.
        static const QRegularExpression notice(u"idemdesk: (\\d+) log lines dropped: "_qs);
        QByteArray log;
        qint64 lines = 0, dropped = 0;
        auto readLog = [&](int timeoutMs) { // until the descriptor is quiet for timeoutMs
            pollfd in{out[0], POLLIN, 0};
            char chunk[65536];
            for (ssize_t n = 1; n > 0 && ::poll(&in, 1, timeoutMs) == 1;)
                if ((n = ::read(out[0], chunk, sizeof chunk)) > 0)
                    log.append(chunk, n);
            lines = dropped = 0;
            for (const QByteArray &line : log.split('\n'))
                if (const auto m = notice.match(QString::fromUtf8(line)); m.hasMatch())
                    dropped += m.captured(1).toLongLong();
                else if (line.contains(" rejected 404 ") || line.contains(" processed 200 "))
                    ++lines;
        };
        QTRY_VERIFY_WITH_TIMEOUT((readLog(100), lines + dropped == sent), 20000);
        QVERIFY2(dropped > 0 && dropped < sent - 100, qPrintable(QString::number(dropped)));
        QCOMPARE(log.count("log lines dropped"), 1); // one gap, told once
        QCOMPARE(s.stderrText.count("stdout takes no more log lines"), 1);

        // Stalled again, then stopped: serve stops (exit 0) and says what stdout did not take.
        QVERIFY(deliver(500));
        QCOMPARE(stop(s), 0);
        s.stderrText += s.process->readAllStandardError();
        static const QRegularExpression lostLine(
            u"idemdesk: (\\d+) log lines lost: stdout did not take them"_qs);
        const auto lost = lostLine.match(QString::fromUtf8(s.stderrText));
        QVERIFY2(lost.hasMatch(), s.stderrText.constData());
        readLog(0);
        qInfo("%d lines sent: %lld read, %lld dropped, %s lost", sent, lines, dropped,
              qPrintable(lost.captured(1)));
        QCOMPARE(lines + dropped + lost.captured(1).toLongLong(), qint64(sent));
        QVERIFY(log.endsWith('\n')); // whole lines only
    }

    // `serve 2>&1 | reader` with the reader stalled (journald too: stdout and stderr on one
    // socket): a stop still stops, and what was in flight is finished and recorded. Before, the
    // stop's own "stopping" line blocked the main thread in the full pipe: SIGTERM was never acted
    // on, deliveries went on being taken, and a supervisor's SIGKILL then left keys processing.
    void aStalledStderrStallsNoStop()
    {
        int out[2];
        QVERIFY(::pipe2(out, O_CLOEXEC) == 0);
        auto closeRead = qScopeGuard([&out] { ::close(out[0]); });
        CountingDownstream down;
        const QString db = m_dir.filePath(u"stalled-stderr.db"_qs);
        const QString config = write(u"stalled-stderr.json"_qs,
                                     "{\"endpoints\": [{\"name\": \"slow\", \"forward_to\": \"" +
                                         down.url().toString().toUtf8() + "\"}]}");
        Served s = serveInto(out[1], {u"--store"_qs, u"sqlite:"_qs + db, u"--config"_qs, config});
        ::close(out[1]);
        QVERIFY(s.port);
        down.closeGate();
        ClientResponse answer;
        std::jthread inFlight([&] {
            answer = post(s.port, "/hooks/slow", "{}", {{"Idempotency-Key", "g"}});
        });
        auto openGate =
            qScopeGuard([&down] { down.openGate(); }); // on failure too, before the join
        QTRY_COMPARE_WITH_TIMEOUT(down.count("slow:g"), 1, 5000);
        // The pipe filled to its last byte (a write of a few bytes would otherwise still fit in
        // its last page), through a file of the test's own: O_NONBLOCK there is not serve's.
        const int filler =
            ::open(QByteArray("/proc/self/fd/" + QByteArray::number(out[0])).constData(),
                   O_WRONLY | O_NONBLOCK | O_CLOEXEC);
        QVERIFY(filler >= 0);
        const QByteArray page(4096, 'f');
        while (::write(filler, page.constData(), size_t(page.size())) > 0) {
        }
        while (::write(filler, "f", 1) > 0) {
        }
        ::close(filler);

        ::kill(pid_t(s.process->processId()), SIGTERM);
        QTRY_COMPARE_WITH_TIMEOUT(get(s.port, "/healthz").status, 0, 10000); // no longer taking
        down.openGate();
        inFlight.join();
        QCOMPARE(answer.status, 200);
        QVERIFY(s.process->waitForFinished(20000));
        QCOMPARE(s.process->exitStatus(), QProcess::NormalExit);
        QCOMPARE(s.process->exitCode(), 0);
        auto store = SqliteStore::open(db);
        QVERIFY(store.ok());
        QCOMPARE(name((*(*store)->key(u"slow:g"_qs))->state), name(KeyState::Completed));
    }

    // `serve 2>&1 | head -1` once head is gone: stdout and stderr both closed (EPIPE). serve goes
    // on serving and stops cleanly. Before, SIGPIPE was ignored only after the first stderr lines
    // (the address, warnings), and such a serve died of it at start.
    void aClosedStdoutAndStderrAreIgnored()
    {
        int out[2];
        QVERIFY(::pipe2(out, O_CLOEXEC) == 0);
        ::close(out[0]);
        Served s =
            serveInto(out[1], {u"--store"_qs, u"sqlite:"_qs + m_dir.filePath(u"closed2.db"_qs)});
        ::close(out[1]);
        QVERIFY2(s.port, qPrintable(u"exit %1"_qs.arg(s.process->exitCode())));
        for (int i = 0; i < 50; ++i)
            QCOMPARE(
                post(s.port, "/hooks/generic", "{}", {{"Idempotency-Key", QByteArray::number(i)}})
                    .status,
                200);
        QCOMPARE(stop(s), 0);
    }

    // `serve | head`: once stdout is closed (EPIPE), its lines go without a word and the
    // deliveries go on.
    void aClosedStdoutIsIgnored()
    {
        int out[2];
        QVERIFY(::pipe2(out, O_CLOEXEC) == 0);
        Served s;
        s.process = startServe(QStringLiteral(IDEMDESK_BIN),
                               {u"--store"_qs, u"sqlite:"_qs + m_dir.filePath(u"closed.db"_qs)},
                               s.port, &s.stderrText, true, {}, 0, out[1]);
        ::close(out[1]);
        ::close(out[0]);
        QVERIFY2(s.port, s.stderrText.constData());
        for (int i = 0; i < 200; ++i)
            QCOMPARE(
                post(s.port, "/hooks/generic", "{}", {{"Idempotency-Key", QByteArray::number(i)}})
                    .status,
                200);
        QCOMPARE(get(s.port, "/healthz").status, 200);
        QCOMPARE(stop(s), 0);
        s.stderrText += s.process->readAllStandardError();
        QVERIFY2(!s.stderrText.contains("log lines"), s.stderrText.constData());
    }
};

QTEST_GUILESS_MAIN(TestServe)
#include "tst_serve.moc"
