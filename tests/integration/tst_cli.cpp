// The admin CLI against every store: keys list/show/reset/retry/delete/purge-expired, stats, storm.
#include "http/blockingclient.h"
#include "support/downstream.h"
#include "support/serveprocess.h"
#include "util/clock.h"

#include <QCryptographicHash>
#include <QDateTime>
#include <QDir>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QRandomGenerator>
#include <QRegularExpression>
#include <QTemporaryDir>
#include <QTest>
#include <QUrl>

#include <sqlite3.h>

#include <csignal>
#include <sys/stat.h>
#include <thread>

using namespace idem;

namespace {

struct Run
{
    int rc = -1;
    QByteArray out;
    QByteArray err;
};

Run idemdesk(const QStringList &args)
{
    QProcess p;
    p.start(QStringLiteral(IDEMDESK_BIN), args);
    p.waitForFinished(60000);
    return {p.exitStatus() == QProcess::NormalExit ? p.exitCode() : -2, p.readAllStandardOutput(), p.readAllStandardError()};
}

qint64 msOf(const QJsonValue &isoTime)
{
    const QDateTime t = QDateTime::fromString(isoTime.toString(), Qt::ISODateWithMs);
    return t.isValid() ? t.toMSecsSinceEpoch() : 0;
}

QList<QJsonObject> jsonLines(const QByteArray &out)
{
    QList<QJsonObject> lines;
    for (const QByteArray &line : out.split('\n'))
        if (!line.trimmed().isEmpty())
            lines << QJsonDocument::fromJson(line).object();
    return lines;
}

QByteArray opensslOut(const QStringList &args)
{
    QProcess p;
    p.start(u"openssl"_qs, args);
    p.waitForFinished(30000);
    return p.readAllStandardOutput();
}

QString writeFile(const QTemporaryDir &dir, const QString &name, const QByteArray &content)
{
    QFile f(dir.filePath(name));
    if (!f.open(QIODevice::WriteOnly) || f.write(content) != content.size())
        qFatal("cannot write %s", qPrintable(f.fileName()));
    return f.fileName();
}

QByteArray jsonString(const QByteArray &text)
{
    return QJsonDocument(QJsonArray{QString::fromUtf8(text)})
        .toJson(QJsonDocument::Compact)
        .mid(1)
        .chopped(1);
}

} // namespace

class TestCli : public QObject
{
    Q_OBJECT
    QTemporaryDir m_dir;

private Q_SLOTS:
    void everyCommand_data()
    {
        QTest::addColumn<QString>("store");
        QTest::newRow("sqlite") << u"sqlite:"_qs + m_dir.filePath(u"cli.db"_qs);
        QTest::newRow("redis") << qEnvironmentVariable("IDEM_TEST_REDIS_URL");
        QTest::newRow("postgres") << qEnvironmentVariable("IDEM_TEST_POSTGRES_URL");
    }
    void everyCommand()
    {
        QFETCH(QString, store);
        if (store.isEmpty())
            QFAIL("IDEM_TEST_REDIS_URL / IDEM_TEST_POSTGRES_URL are not set: run through ./dev test");
        const QString run = QString::number(QRandomGenerator::global()->bounded(1u << 30), 36);
        // A store of its own (a Redis prefix, a PostgreSQL database): `keys purge-expired`
        // counts what expired in the whole store, and other tests' keys expire in the shared one.
        if (store.startsWith(u"redis"_qs)) {
            store += u"?prefix=cli"_qs + run + u":"_qs;
        } else if (store.startsWith(u"postgres"_qs)) {
            QProcess psql;
            psql.start(u"psql"_qs, {u"-q"_qs, u"-d"_qs, store, u"-c"_qs, u"CREATE DATABASE cli_"_qs + run});
            QVERIFY(psql.waitForFinished(20'000));
            QVERIFY2(psql.exitCode() == 0, psql.readAllStandardError().constData());
            QUrl url(store);
            url.setPath(u"/cli_"_qs + run);
            store = url.toString();
        }
        const QString ok = u"ok"_qs + run, bad = u"bad"_qs + run, fwd = u"fwd"_qs + run, brief = u"brief"_qs + run;
        idem::test::CountingDownstream down; // storms are graded here, where the processor's work lands
        const QString config = m_dir.filePath(run + u".json"_qs);
        QFile f(config);
        QVERIFY(f.open(QIODevice::WriteOnly));
        // `brief` keeps its keys for the shortest legal TTL: 3 s (not below the lease, which is
        // not below the forward deadline plus 2 s).
        f.write(QStringLiteral("{\"store\": \"%1\", \"endpoints\": [{\"name\": \"%2\", \"simulate\": {\"delay_ms\": 20}},"
                               " {\"name\": \"%3\", \"simulate\": {\"fail_rate\": 1}},"
                               " {\"name\": \"%4\", \"forward_to\": \"%5\"},"
                               " {\"name\": \"%6\", \"ttl_seconds\": 3, \"lease_seconds\": 3, \"forward_timeout_seconds\": 1}]}")
                    .arg(store, ok, bad, fwd, down.url().toString(), brief).toUtf8());
        f.close();
        const QStringList common{u"--config"_qs, config};

        quint16 port = 0;
        QByteArray err;
        auto serve = idem::test::startServe(QStringLiteral(IDEMDESK_BIN), common, port, &err);
        QVERIFY2(port, err.constData());
        auto deliver = [&](const QString &endpoint, const QByteArray &key, const HeaderList &extra = {}) {
            HeaderList headers{{"Idempotency-Key", key}};
            headers += extra;
            return post(port, "/hooks/" + endpoint.toUtf8(), "{\"n\":1}", headers);
        };
        QCOMPARE(deliver(ok, "k1").status, 200);
        QCOMPARE(deliver(ok, "k1").header("Idempotency-Outcome"), QByteArray("replayed"));
        QCOMPARE(deliver(bad, "b1", {{"Authorization", "Bearer s3cr3t"}}).status, 500);
        QCOMPARE(deliver(bad, "b2").status, 500);
        const QString k1 = ok + u":k1"_qs, b1 = bad + u":b1"_qs, b2 = bad + u":b2"_qs;

        // purge-expired with nothing expired: 0, and every key still there. (The first purge
        // clears what earlier tests left expired in a shared store.)
        Run r = idemdesk(QStringList{u"keys"_qs, u"purge-expired"_qs} + common);
        QCOMPARE(r.rc, 0);
        auto ourKeys = [&] {
            QStringList keys;
            for (const QString &endpoint : {ok, bad})
                for (const QJsonObject &line : jsonLines(idemdesk(QStringList{u"keys"_qs, u"list"_qs, u"--endpoint"_qs, endpoint, u"--json"_qs} + common).out))
                    keys << line.value(u"key").toString();
            keys.sort();
            return keys;
        };
        const QStringList before = ourKeys();
        QCOMPARE(before, QStringList({b1, b2, k1}));
        r = idemdesk(QStringList{u"keys"_qs, u"purge-expired"_qs} + common);
        QCOMPARE(r.rc, 0);
        QVERIFY2(r.out.contains("removed 0 expired keys"), r.out.constData());
        QCOMPARE(ourKeys(), before);

        // keys list
        r = idemdesk(QStringList{u"keys"_qs, u"list"_qs, u"--endpoint"_qs, ok, u"--json"_qs} + common);
        QCOMPARE(r.rc, 0);
        auto lines = jsonLines(r.out);
        QCOMPARE(lines.size(), 1);
        QCOMPARE(lines[0].value(u"key").toString(), k1);
        QCOMPARE(lines[0].value(u"state").toString(), u"completed"_qs);
        QCOMPARE(lines[0].value(u"deliveries").toInt(), 2);
        QVERIFY(lines[0].value(u"ttl_seconds").toInteger() > 600000);
        for (const char *field : {"endpoint", "provider", "expires_at", "created_at", "updated_at", "token", "fingerprint"})
            QVERIFY2(lines[0].contains(QLatin1String(field)), field);
        r = idemdesk(QStringList{u"keys"_qs, u"list"_qs, u"--state"_qs, u"failed"_qs, u"--endpoint"_qs, bad, u"--json"_qs} + common);
        QCOMPARE(jsonLines(r.out).size(), 2);
        r = idemdesk(QStringList{u"keys"_qs, u"list"_qs, u"--match"_qs, bad + u":b?"_qs} + common);
        QCOMPARE(r.rc, 0);
        QVERIFY(r.out.startsWith("KEY "));
        QVERIFY(r.out.contains(b1.toUtf8()) && r.out.contains(b2.toUtf8()) && !r.out.contains(k1.toUtf8()));
        QVERIFY(r.out.contains("failed"));
        r = idemdesk(QStringList{u"keys"_qs, u"list"_qs, u"--endpoint"_qs, bad, u"--limit"_qs, u"1"_qs} + common);
        QVERIFY(r.out.contains("more keys"));

        // keys show: masked secrets, history, the delivery timeline
        QJsonObject shown;
        QTRY_VERIFY_WITH_TIMEOUT((shown = QJsonDocument::fromJson(idemdesk(QStringList{u"keys"_qs, u"show"_qs, b1, u"--json"_qs} + common).out).object())
                                         .value(u"deliveries").toArray().size() == 1, 10000);
        QCOMPARE(shown.value(u"state").toString(), u"failed"_qs);
        QVERIFY(shown.value(u"error").toString().contains(u"simulated failure"));
        QCOMPARE(shown.value(u"result").toObject().value(u"status").toInt(), 500);
        QCOMPARE(shown.value(u"request").toObject().value(u"body").toString(), u"{\"n\":1}"_qs);
        const QByteArray headers = QJsonDocument(shown.value(u"request").toObject().value(u"headers").toArray()).toJson();
        QVERIFY(headers.contains("Authorization") && !headers.contains("s3cr3t"));
        QCOMPARE(shown.value(u"history").toArray().size(), 2);
        QCOMPARE(shown.value(u"deliveries").toArray().first().toObject().value(u"outcome").toString(), u"processed"_qs);
        r = idemdesk(QStringList{u"keys"_qs, u"show"_qs, b1} + common);
        QCOMPARE(r.rc, 0);
        QVERIFY(r.out.contains("fingerprint") && r.out.contains("masked") && !r.out.contains("s3cr3t"));
        r = idemdesk(QStringList{u"keys"_qs, u"show"_qs, u"k1"_qs} + common);
        QCOMPARE(r.rc, 1);
        QVERIFY(r.err.contains("<endpoint>:<key>"));

        // reset: refused for a completed key unless --force
        r = idemdesk(QStringList{u"keys"_qs, u"reset"_qs, k1} + common);
        QCOMPARE(r.rc, 1);
        QVERIFY(r.err.contains("is completed: not reset"));
        r = idemdesk(QStringList{u"keys"_qs, u"reset"_qs, k1, u"--force"_qs} + common);
        QCOMPARE(r.rc, 0);
        QVERIFY(r.out.contains("reset " + k1.toUtf8() + " (was completed)"));
        QCOMPARE(deliver(ok, "k1").header("Idempotency-Outcome"), QByteArray("reprocessed"));

        // retry: runs the stored request through the processor again — the desk's, so it needs
        // the desk's config: without it the built-in endpoints would simulate a completion.
        r = idemdesk(QStringList{u"keys"_qs, u"retry"_qs, b1, u"--store"_qs, store});
        QCOMPARE(r.rc, 2);
        QVERIFY2(r.err.contains("needs the desk's config"), r.err.constData());
        QCOMPARE(QJsonDocument::fromJson(
                     idemdesk(QStringList{u"keys"_qs, u"show"_qs, b1, u"--json"_qs} + common).out)
                     .object()
                     .value(u"state")
                     .toString(),
                 u"failed"_qs);
        r = idemdesk(QStringList{u"keys"_qs, u"retry"_qs, b1} + common);
        QCOMPARE(r.rc, 1);
        QVERIFY(r.out.contains("reprocessed, 500, failed"));
        r = idemdesk(QStringList{u"keys"_qs, u"retry"_qs, k1} + common);
        QCOMPARE(r.rc, 1);
        QVERIFY(r.err.contains("is completed: not retried"));
        r = idemdesk(QStringList{u"keys"_qs, u"retry"_qs, k1, u"--force"_qs} + common);
        QCOMPARE(r.rc, 0);
        QVERIFY(r.out.contains(k1.toUtf8() + ": reprocessed, 200, completed"));
        shown = QJsonDocument::fromJson(idemdesk(QStringList{u"keys"_qs, u"show"_qs, k1, u"--json"_qs} + common).out).object();
        QCOMPARE(shown.value(u"state").toString(), u"completed"_qs);
        QVERIFY(shown.value(u"token").toInteger() >= 3);

        // reset --all-failed
        r = idemdesk(QStringList{u"keys"_qs, u"reset"_qs, u"--all-failed"_qs, u"--endpoint"_qs, bad} + common);
        QCOMPARE(r.rc, 0);
        QVERIFY2(r.out.contains("reset 2 failed keys of " + bad.toUtf8()), r.out.constData());
        r = idemdesk(QStringList{u"keys"_qs, u"list"_qs, u"--state"_qs, u"reset"_qs,
                                 u"--endpoint"_qs, bad, u"--json"_qs} +
                     common);
        QCOMPARE(jsonLines(r.out).size(), 2);

        // delete
        r = idemdesk(QStringList{u"keys"_qs, u"delete"_qs, b2} + common);
        QCOMPARE(r.rc, 0);
        QCOMPARE(idemdesk(QStringList{u"keys"_qs, u"show"_qs, b2} + common).rc, 1);
        QCOMPARE(idemdesk(QStringList{u"keys"_qs, u"delete"_qs, b2} + common).rc, 1);

        // stats
        r = idemdesk(QStringList{u"stats"_qs, u"--json"_qs} + common);
        QCOMPARE(r.rc, 0);
        const QJsonObject stats = QJsonDocument::fromJson(r.out).object();
        QVERIFY(stats.value(u"store").toObject().value(u"healthy").toBool());
        QJsonObject okStats;
        for (const auto &e : stats.value(u"endpoints").toArray())
            if (e.toObject().value(u"name").toString() == ok)
                okStats = e.toObject();
        QVERIFY(okStats.value(u"deliveries").toInt() >= 3);
        QVERIFY(okStats.value(u"duplicate_ratio").toDouble() > 0);
        QCOMPARE(okStats.value(u"keys").toObject().value(u"completed").toInt(), 1);
        QVERIFY(!stats.value(u"warnings").toArray().isEmpty());
        r = idemdesk(QStringList{u"stats"_qs} + common);
        QCOMPARE(r.rc, 0);
        QVERIFY(r.out.contains("DUP RATIO") && r.out.contains(ok.toUtf8()));

        // storm: its verdict, and what the downstream behind the endpoint counted per key
        down.setDelayMs(50); // the copies arrive while the first of each key is being processed
        r = idemdesk(QStringList{u"storm"_qs, u"--endpoint"_qs, fwd, u"--copies"_qs, u"16"_qs, u"--concurrency"_qs, u"16"_qs,
                                 u"--keys"_qs, u"3"_qs, u"--url"_qs, u"http://127.0.0.1:%1"_qs.arg(port)} + common);
        QCOMPARE(r.rc, 0);
        QVERIFY2(r.out.contains("every key processed exactly once (3 of 3)"), r.out.constData());
        QVERIFY(r.out.contains("p99"));
        QHash<QByteArray, int> reached;
        for (const HttpRequest &request : down.requests())
            reached[request.header("Idempotency-Key")] += 1;
        QCOMPARE(reached.size(), 3);
        for (auto it = reached.cbegin(); it != reached.cend(); ++it) {
            QVERIFY2(it.key().startsWith(fwd.toUtf8() + ":storm-"), it.key().constData());
            QVERIFY2(it.value() == 1, it.key().constData());
        }
        // A failing downstream runs each copy again: not exactly once, and the downstream saw it.
        down.setStatus(500);
        r = idemdesk(QStringList{u"storm"_qs, u"--endpoint"_qs, fwd, u"--copies"_qs, u"2"_qs, u"--concurrency"_qs, u"1"_qs,
                                 u"--url"_qs, u"http://127.0.0.1:%1"_qs.arg(port)} + common);
        QCOMPARE(r.rc, 1);
        QVERIFY(r.out.contains("NOT exactly once"));
        QCOMPARE(down.total(), 3 + 2);
        QCOMPARE(down.requests().at(3).header("Idempotency-Key"), down.requests().at(4).header("Idempotency-Key"));
        QVERIFY(!reached.contains(down.requests().at(4).header("Idempotency-Key")));
        // Nothing processed (no receiver there, as when the store refuses every claim): said as
        // it is, not as a broken guarantee.
        r = idemdesk(QStringList{u"storm"_qs, u"--endpoint"_qs, fwd, u"--copies"_qs, u"2"_qs,
                                 u"--url"_qs, u"http://127.0.0.1:1"_qs} +
                     common);
        QCOMPARE(r.rc, 1);
        QVERIFY2(r.out.contains("none processed twice; 1 of 1 never processed (no answer ×2)") &&
                     !r.out.contains("NOT exactly once"),
                 r.out.constData());

        // A key that will expire, for purge-expired. From here until that purge nothing lists or
        // counts keys: on Redis a listing drops expired index entries on its way.
        QCOMPARE(deliver(brief, "e1").status, 200);
        const QString e1 = brief + u":e1"_qs;
        const qint64 e1Expires = msOf(QJsonDocument::fromJson(idemdesk(QStringList{u"keys"_qs, u"show"_qs, e1, u"--json"_qs} + common).out)
                                          .object().value(u"expires_at"));
        QVERIFY(e1Expires > 0);

        ::kill(pid_t(serve->processId()), SIGTERM);
        QVERIFY(serve->waitForFinished(15000));
        QCOMPARE(serve->exitCode(), 0);

        // purge-expired with something expired (serve is gone: its periodic purge cannot run
        // first).
        QTRY_VERIFY_WITH_TIMEOUT(wallMs() > e1Expires, 10000);
        r = idemdesk(QStringList{u"keys"_qs, u"purge-expired"_qs} + common);
        QCOMPARE(r.rc, 0);
        QVERIFY2(r.out.contains("removed 1 expired key\n"), r.out.constData());
        QCOMPARE(idemdesk(QStringList{u"keys"_qs, u"show"_qs, e1} + common).rc, 1);
        QCOMPARE(ourKeys(), QStringList({b1, k1})); // b2 deleted above; the others untouched
        r = idemdesk(QStringList{u"keys"_qs, u"purge-expired"_qs} + common);
        QVERIFY2(r.out.contains("removed 0 expired keys"), r.out.constData());
    }

    void sendSignsAsEachProviderSigns_data()
    {
        QTest::addColumn<QString>("provider");
        QTest::addColumn<QString>("templateName");
        for (const char *t : {"payment_intent.succeeded"})
            QTest::newRow(t) << u"stripe"_qs << QString::fromLatin1(t);
        QTest::newRow("github push") << u"github"_qs << u"push"_qs;
        QTest::newRow("github ping") << u"github"_qs << u"ping"_qs;
        QTest::newRow("shopify") << u"shopify"_qs << u"orders/create"_qs;
        QTest::newRow("sendgrid batch") << u"sendgrid"_qs << u"batch"_qs;
        QTest::newRow("slack slash-command") << u"slack"_qs << u"slash-command"_qs;
        QTest::newRow("slack event") << u"slack"_qs << u"event_callback"_qs;
        QTest::newRow("standard") << u"standard"_qs << u"invoice.paid"_qs;
        QTest::newRow("generic") << u"generic"_qs << u"json"_qs;
    }
    void sendSignsAsEachProviderSigns()
    {
        // The receiver (serve) verifies each signature as the provider's docs say (tst_providers
        // holds that against openssl): a send it accepts was signed exactly so.
        QFETCH(QString, provider);
        QFETCH(QString, templateName);
        const QByteArray privatePem = opensslOut({u"genpkey"_qs, u"-algorithm"_qs, u"EC"_qs,
                                                  u"-pkeyopt"_qs, u"ec_paramgen_curve:P-256"_qs});
        const QString keyFile = writeFile(
            m_dir,
            u"sg-%1.pem"_qs.arg(QString::fromLatin1(QTest::currentDataTag())).replace(u' ', u'-'),
            privatePem);
        QProcess pub;
        pub.start(u"openssl"_qs, {u"pkey"_qs, u"-in"_qs, keyFile, u"-pubout"_qs});
        QVERIFY(pub.waitForFinished(30000));
        const QByteArray publicPem = pub.readAllStandardOutput();
        QVERIFY(publicPem.contains("PUBLIC KEY"));
        const QByteArray secret =
            provider == u"standard"_qs
                ? "whsec_" + QByteArray("desk-test-secret-0123456789").toBase64()
                : "whsec_desk_test";
        auto configWith = [&](const QByteArray &endpointSecret, const QByteArray &extra) {
            const QByteArray signing = provider == u"sendgrid"_qs
                                           ? "\"public_key\": " + jsonString(publicPem)
                                           : "\"secret\": \"" + endpointSecret + "\"";
            return "{\"store\": \"sqlite:" + m_dir.filePath(u"send.db"_qs).toUtf8() +
                   "\", \"endpoints\": [{\"name\": \"t\", \"provider\": \"" + provider.toUtf8() +
                   "\", " + signing + extra + "}]}";
        };
        const QString config = writeFile(m_dir, u"send.json"_qs, configWith(secret, {}));
        quint16 port = 0;
        QByteArray err;
        auto serve = idem::test::startServe(QStringLiteral(IDEMDESK_BIN), {u"--config"_qs, config},
                                            port, &err);
        QVERIFY2(port, err.constData());
        const QStringList common{u"--config"_qs,   config,
                                 u"--url"_qs,      u"http://127.0.0.1:%1"_qs.arg(port),
                                 u"--endpoint"_qs, u"t"_qs};
        const QStringList key =
            provider == u"sendgrid"_qs ? QStringList{u"--sign-key"_qs, keyFile} : QStringList{};

        Run r = idemdesk(QStringList{u"send"_qs, u"--list-templates"_qs} + common);
        QCOMPARE(r.rc, 0);
        QVERIFY2(r.out.split('\n').contains(templateName.toUtf8()), r.out.constData());

        // Once, then three identical copies of a new event: one processed, the others duplicates.
        r = idemdesk(QStringList{u"send"_qs, u"--template"_qs, templateName} + common + key);
        QVERIFY2(r.rc == 0, r.out + r.err);
        QVERIFY2(r.out.contains("#1  200 processed"), r.out.constData());
        QVERIFY(r.out.contains("none rejected"));
        r = idemdesk(
            QStringList{u"send"_qs, u"--template"_qs, templateName, u"--copies"_qs, u"3"_qs} +
            common + key);
        QVERIFY2(r.rc == 0, r.out + r.err); // a replay is not a rejection
        QVERIFY2(r.out.contains("#1  200 processed") && r.out.contains("#3  200 replayed"),
                 r.out.constData());

        // Signed with another secret (or, for SendGrid, not signed at all): 401, exit 1 / 2.
        if (provider == u"sendgrid"_qs) {
            r = idemdesk(QStringList{u"send"_qs} + common);
            QCOMPARE(r.rc, 2);
            QVERIFY2(r.err.contains("private key") && r.err.contains("--sign-key"),
                     r.err.constData());
        } else {
            const QByteArray other =
                provider == u"standard"_qs
                    ? "whsec_" + QByteArray("another-secret-0123456789").toBase64()
                    : "whsec_other";
            const QString wrong = writeFile(m_dir, u"send-wrong.json"_qs, configWith(other, {}));
            QStringList args = common;
            args[1] = wrong;
            r = idemdesk(QStringList{u"send"_qs} + args);
            QCOMPARE(r.rc, 1);
            QVERIFY2(r.out.contains("#1  401 rejected"), r.out.constData());
        }
        ::kill(pid_t(serve->processId()), SIGTERM);
        QVERIFY(serve->waitForFinished(15000));
    }

    void sendExitCodes()
    {
        // 5xx and 422 are rejections (exit 1); a duplicate's 409 is not (exit 0).
        const QString config =
            writeFile(m_dir, u"codes.json"_qs,
                      "{\"store\": \"sqlite:" + m_dir.filePath(u"codes.db"_qs).toUtf8() +
                          "\", \"endpoints\": ["
                          "{\"name\": \"down\", \"simulate\": {\"fail_rate\": 1}},"
                          "{\"name\": \"slow\", \"provider\": \"stripe\", \"simulate\": "
                          "{\"delay_ms\": 4000}},"
                          "{\"name\": \"s\", \"provider\": \"stripe\"}]}");
        quint16 port = 0;
        QByteArray err;
        auto serve = idem::test::startServe(QStringLiteral(IDEMDESK_BIN), {u"--config"_qs, config},
                                            port, &err);
        QVERIFY2(port, err.constData());
        const QStringList common{u"--config"_qs, config, u"--url"_qs,
                                 u"http://127.0.0.1:%1"_qs.arg(port)};
        Run r = idemdesk(QStringList{u"send"_qs, u"--endpoint"_qs, u"down"_qs} + common);
        QCOMPARE(r.rc, 1);
        QVERIFY2(r.out.contains("#1  500 processed") && r.out.contains("1 rejected"),
                 r.out.constData());
        // The same stripe event id twice with different bodies: the second is a 422.
        const QString a = writeFile(m_dir, u"a.json"_qs, "{\"id\": \"evt_fixed_1\", \"n\": 1}");
        const QString b = writeFile(m_dir, u"b.json"_qs, "{\"id\": \"evt_fixed_1\", \"n\": 2}");
        r = idemdesk(QStringList{u"send"_qs, u"--endpoint"_qs, u"s"_qs, u"--file"_qs, a} + common);
        QCOMPARE(r.rc, 0);
        QVERIFY2(r.out.contains("key s:evt_fixed_1"), r.out.constData());
        r = idemdesk(QStringList{u"send"_qs, u"--endpoint"_qs, u"s"_qs, u"--file"_qs, b} + common);
        QCOMPARE(r.rc, 1);
        QVERIFY2(r.out.contains("#1  422 mismatch"), r.out.constData());
        // A duplicate while the first is still processed gets 409: not a rejection.
        const QString slowBody = writeFile(m_dir, u"slow.json"_qs, "{\"id\": \"evt_slow_1\"}");
        QProcess first;
        first.start(QStringLiteral(IDEMDESK_BIN),
                    QStringList{u"send"_qs, u"--endpoint"_qs, u"slow"_qs, u"--file"_qs, slowBody} +
                        common);
        QVERIFY(first.waitForStarted());
        // Sent again until the key answers (the first may not have claimed it yet).
        QVERIFY(QTest::qWaitFor(
            [&] {
                r = idemdesk(
                    QStringList{u"send"_qs, u"--endpoint"_qs, u"slow"_qs, u"--file"_qs, slowBody} +
                    common);
                return r.out.contains("key slow:evt_slow_1");
            },
            10000));
        QCOMPARE(r.rc, 0);
        QVERIFY(first.waitForFinished(20000));
        QCOMPARE(first.exitCode(), 0);
        const QByteArray both =
            r.out + first.readAllStandardOutput(); // either may have won the claim
        QVERIFY2(both.contains("#1  409 in-progress") && both.contains("#1  200 processed"),
                 both.constData());
        // --sign-key: a SendGrid endpoint's, and a P-256 private key only.
        const QString p384 = writeFile(m_dir, u"p384.pem"_qs,
                                       opensslOut({u"genpkey"_qs, u"-algorithm"_qs, u"EC"_qs,
                                                   u"-pkeyopt"_qs, u"ec_paramgen_curve:P-384"_qs}));
        r = idemdesk(QStringList{u"send"_qs, u"--endpoint"_qs, u"s"_qs, u"--sign-key"_qs, p384} +
                     common);
        QCOMPARE(r.rc, 2);
        QVERIFY2(r.err.contains("--sign-key is for a sendgrid endpoint"), r.err.constData());
        const QString sgConfig =
            writeFile(m_dir, u"codes-sg.json"_qs,
                      "{\"store\": \"sqlite:" + m_dir.filePath(u"codes.db"_qs).toUtf8() +
                          "\", \"endpoints\": [{\"name\": \"sg\", \"provider\": \"sendgrid\"}]}");
        r = idemdesk({u"send"_qs, u"--config"_qs, sgConfig, u"--url"_qs,
                      u"http://127.0.0.1:%1"_qs.arg(port), u"--endpoint"_qs, u"sg"_qs,
                      u"--sign-key"_qs, p384});
        QCOMPARE(r.rc, 2);
        QVERIFY2(r.err.contains("not an ECDSA P-256 private key"), r.err.constData());
        r = idemdesk(QStringList{u"send"_qs, u"--endpoint"_qs, u"nope"_qs} + common);
        QCOMPARE(r.rc, 2);
        QVERIFY2(r.err.contains("no endpoint 'nope'"), r.err.constData());
        r = idemdesk(
            QStringList{u"send"_qs, u"--endpoint"_qs, u"s"_qs, u"--template"_qs, u"push"_qs} +
            common);
        QCOMPARE(r.rc, 2);
        QVERIFY2(r.err.contains("no template 'push'"), r.err.constData());
        ::kill(pid_t(serve->processId()), SIGTERM);
        QVERIFY(serve->waitForFinished(15000));
    }

    void exportAndImportKeepTheRecord_data() { everyCommand_data(); }
    void typeAndSearchFromServeToKeysList_data()
    {
        QTest::addColumn<QString>("store");
        QTest::newRow("sqlite") << u"sqlite:"_qs + m_dir.filePath(u"types.db"_qs);
        QTest::newRow("redis") << qEnvironmentVariable("IDEM_TEST_REDIS_URL");
        QTest::newRow("cluster") << qEnvironmentVariable("IDEM_TEST_REDIS_CLUSTER_URL");
        QTest::newRow("postgres") << qEnvironmentVariable("IDEM_TEST_POSTGRES_URL");
    }
    void typeAndSearchFromServeToKeysList()
    {
        QFETCH(QString, store);
        if (store.isEmpty())
            QFAIL("IDEM_TEST_* are not set: run through ./dev test");
        const QString run = QString::number(QRandomGenerator::global()->bounded(1u << 30), 36);
        const QString stripe = u"s"_qs + run, github = u"g"_qs + run;
        const QString config =
            writeFile(m_dir, run + u"-types.json"_qs,
                      "{\"store\": \"" + store.toUtf8() + "\", \"endpoints\": [{\"name\": \"" +
                          stripe.toUtf8() + "\", \"provider\": \"stripe\"}, {\"name\": \"" +
                          github.toUtf8() + "\", \"provider\": \"github\"}]}");
        const QStringList common{u"--config"_qs, config};
        quint16 port = 0;
        QByteArray err;
        auto serve = idem::test::startServe(QStringLiteral(IDEMDESK_BIN), common, port, &err, true);
        QVERIFY2(port, err.constData());
        auto stripeEvent = [&](const QByteArray &id, const QByteArray &type,
                               const QByteArray &who) {
            return post(port, "/hooks/" + stripe.toUtf8(),
                        "{\"id\":\"" + id + "\",\"type\":\"" + type +
                            "\",\"data\":{\"object\":{\"customer\":\"" + who + "\"}}}",
                        {{"Content-Type", "application/json"}})
                .status;
        };
        QCOMPARE(stripeEvent("evt_1", "payment_intent.succeeded", "ACME Corp"), 200);
        QCOMPARE(stripeEvent("evt_2", "charge.refunded", "acme"), 200);
        QCOMPARE(stripeEvent("evt_3", "payment_intent.succeeded", "globex"), 200);
        QCOMPARE(post(port, "/hooks/" + github.toUtf8(), "{\"action\":\"opened\"}",
                      {{"X-GitHub-Event", "issues"},
                       {"X-GitHub-Hook-ID", "7"},
                       {"X-GitHub-Delivery", "d1"}})
                     .status,
                 200);
        ::kill(pid_t(serve->processId()), SIGTERM);
        QVERIFY(serve->waitForFinished(15000));
        // The serve log line names the type.
        const QByteArray log = serve->readAllStandardOutput();
        QVERIFY2(log.contains(stripe.toUtf8() + ":evt_2 processed 200") &&
                     log.contains("type=charge.refunded"),
                 log.constData());
        QVERIFY2(log.contains("type=issues.opened"), log.constData());

        const QString e1 = stripe + u":evt_1"_qs, e2 = stripe + u":evt_2"_qs,
                      e3 = stripe + u":evt_3"_qs;
        auto listed = [&](const QStringList &args) {
            QStringList keys;
            const Run r =
                idemdesk(QStringList{u"keys"_qs, u"list"_qs, u"--json"_qs} + args + common);
            for (const QJsonObject &line : jsonLines(r.out))
                keys << line.value(u"key").toString();
            return keys;
        };
        QCOMPARE(listed({u"--type"_qs, u"payment_intent.succeeded"_qs, u"--endpoint"_qs, stripe}),
                 (QStringList{e3, e1}));
        QCOMPARE(listed({u"--type"_qs, u"issues.opened"_qs, u"--endpoint"_qs, github}),
                 QStringList{github + u":hook-7/d1"_qs});
        QCOMPARE(listed({u"--search"_qs, u"acme"_qs, u"--endpoint"_qs, stripe}),
                 (QStringList{e2, e1}));
        QCOMPARE(listed({u"--search"_qs, u"acme"_qs, u"--type"_qs, u"charge.refunded"_qs,
                         u"--endpoint"_qs, stripe}),
                 QStringList{e2});
        // --json carries the type; a plain listing has a TYPE column.
        Run r = idemdesk(
            QStringList{u"keys"_qs, u"list"_qs, u"--json"_qs, u"--endpoint"_qs, stripe} + common);
        QCOMPARE(jsonLines(r.out).first().value(u"type").toString(),
                 u"payment_intent.succeeded"_qs);
        r = idemdesk(QStringList{u"keys"_qs, u"list"_qs, u"--endpoint"_qs, stripe} + common);
        QVERIFY2(r.out.contains("TYPE") && r.out.contains("charge.refunded"), r.out.constData());
        // Paged: the next page from where the last stopped.
        r = idemdesk(QStringList{u"keys"_qs, u"list"_qs, u"--search"_qs, u"evt_"_qs,
                                 u"--endpoint"_qs, stripe, u"--limit"_qs, u"2"_qs} +
                     common);
        QCOMPARE(r.rc, 0);
        const qsizetype at = r.out.indexOf("--after '");
        QVERIFY2(at > 0, r.out.constData());
        const QString after =
            QString::fromUtf8(r.out.mid(at + 9, r.out.indexOf('\'', at + 9) - at - 9));
        QCOMPARE(listed({u"--search"_qs, u"evt_"_qs, u"--endpoint"_qs, stripe, u"--limit"_qs,
                         u"2"_qs, u"--after"_qs, after}),
                 QStringList{e1});
        // Nothing found says so.
        r = idemdesk(QStringList{u"keys"_qs, u"list"_qs, u"--search"_qs, u"initech"_qs,
                                 u"--endpoint"_qs, stripe} +
                     common);
        QCOMPARE(r.rc, 0);
        QVERIFY2(r.out.contains("(no keys whose body contains 'initech')"), r.out.constData());
        r = idemdesk(QStringList{u"keys"_qs, u"list"_qs, u"--type"_qs, u"nope"_qs} + common);
        QVERIFY2(r.out.contains("(no keys of type 'nope')"), r.out.constData());
        // Usage errors.
        r = idemdesk(QStringList{u"keys"_qs, u"list"_qs, u"--after"_qs, after} + common);
        QCOMPARE(r.rc, 2);
        r = idemdesk(QStringList{u"keys"_qs, u"list"_qs, u"--search"_qs, u"x"_qs, u"--after"_qs,
                                 u"nowhere"_qs} +
                     common);
        QCOMPARE(r.rc, 2);
        QVERIFY2(r.err.contains("is not where a page"), r.err.constData());
    }

    void exportAndImportKeepTheType()
    {
        // Out of one SQLite desk into another: the type goes with the record; a line written
        // before types were kept (no record.type) still imports, as a key without a type.
        const QString run = QString::number(QRandomGenerator::global()->bounded(1u << 30), 36);
        const QString ep = u"t"_qs + run;
        const QString source =
            writeFile(m_dir, run + u"-tsrc.json"_qs,
                      "{\"store\": \"sqlite:" + m_dir.filePath(run + u"-tsrc.db"_qs).toUtf8() +
                          "\", \"endpoints\": [{\"name\": \"" + ep.toUtf8() +
                          "\", \"provider\": \"stripe\"}]}");
        quint16 port = 0;
        QByteArray err;
        auto serve = idem::test::startServe(QStringLiteral(IDEMDESK_BIN), {u"--config"_qs, source},
                                            port, &err);
        QVERIFY2(port, err.constData());
        for (const QByteArray &id : {QByteArray("evt_a"), QByteArray("evt_b")})
            QCOMPARE(post(port, "/hooks/" + ep.toUtf8(),
                          "{\"id\":\"" + id + "\",\"type\":\"invoice.paid\"}", {})
                         .status,
                     200);
        ::kill(pid_t(serve->processId()), SIGTERM);
        QVERIFY(serve->waitForFinished(15000));
        const QString file = m_dir.filePath(run + u"-types.jsonl"_qs);
        Run r = idemdesk({u"keys"_qs, u"export"_qs, u"--endpoint"_qs, ep, u"--output"_qs, file,
                          u"--config"_qs, source});
        QVERIFY2(r.rc == 0, r.err.constData());
        QFile exported(file);
        QVERIFY(exported.open(QIODevice::ReadOnly));
        QList<QByteArray> lines = exported.readAll().trimmed().split('\n');
        QCOMPARE(lines.size(), 2);
        QJsonObject old = QJsonDocument::fromJson(lines.at(1)).object();
        QCOMPARE(old.value(u"record").toObject().value(u"type").toString(), u"invoice.paid"_qs);
        QJsonObject record = old.value(u"record").toObject();
        record.remove(u"type"_qs);
        old.insert(u"record"_qs, record);
        lines[1] = QJsonDocument(old).toJson(QJsonDocument::Compact);
        const QString edited = writeFile(m_dir, run + u"-old.jsonl"_qs, lines.join('\n') + '\n');
        const QStringList target{u"--store"_qs,
                                 u"sqlite:"_qs + m_dir.filePath(run + u"-tdst.db"_qs)};
        r = idemdesk(QStringList{u"keys"_qs, u"import"_qs, edited} + target);
        QVERIFY2(r.rc == 0, r.err.constData());
        QMap<QString, QString> types;
        for (const QJsonObject &line :
             jsonLines(idemdesk(QStringList{u"keys"_qs, u"list"_qs, u"--json"_qs} + target).out))
            types.insert(line.value(u"key").toString(), line.value(u"type").isNull()
                                                            ? u"null"_qs
                                                            : line.value(u"type").toString());
        QCOMPARE(types.size(), 2);
        QVERIFY2(types.values().contains(u"invoice.paid"_qs) && types.values().contains(u"null"_qs),
                 qPrintable(QStringList(types.values()).join(u',')));
        // A type that is not a string is refused, naming the field.
        QJsonObject bad = QJsonDocument::fromJson(lines.at(0)).object();
        QJsonObject badRecord = bad.value(u"record").toObject();
        badRecord.insert(u"type"_qs, 42);
        bad.insert(u"record"_qs, badRecord);
        const QString wrong = writeFile(m_dir, run + u"-bad.jsonl"_qs,
                                        QJsonDocument(bad).toJson(QJsonDocument::Compact) + '\n');
        r = idemdesk(QStringList{u"keys"_qs, u"import"_qs, wrong, u"--store"_qs,
                                 u"sqlite:"_qs + m_dir.filePath(run + u"-tdst2.db"_qs)});
        QVERIFY2(r.err.contains("record.type must be a string"), r.err.constData());
    }

    void exportAndImportKeepTheRecord()
    {
        // Out of a colleague's SQLite desk, into this store: state, TTL, history and timeline.
        QFETCH(QString, store);
        if (store.isEmpty())
            QFAIL(
                "IDEM_TEST_REDIS_URL / IDEM_TEST_POSTGRES_URL are not set: run through ./dev test");
        const QString run = QString::number(QRandomGenerator::global()->bounded(1u << 30), 36);
        const QString ep = u"x"_qs + run;
        const QString source =
            writeFile(m_dir, run + u"-src.json"_qs,
                      "{\"store\": \"sqlite:" + m_dir.filePath(run + u"-src.db"_qs).toUtf8() +
                          "\", \"endpoints\": ["
                          "{\"name\": \"" +
                          ep.toUtf8() +
                          "\", \"ttl_seconds\": 7200, \"simulate\": {\"fail_rate\": 1}, "
                          "\"on_failed\": \"reject\"}]}");
        quint16 port = 0;
        QByteArray err;
        auto serve = idem::test::startServe(QStringLiteral(IDEMDESK_BIN), {u"--config"_qs, source},
                                            port, &err);
        QVERIFY2(port, err.constData());
        for (const QByteArray &key : {QByteArray("f1"), QByteArray("f2")}) {
            QCOMPARE(post(port, "/hooks/" + ep.toUtf8(), "{\"bytes\":\"\\u0000\"}",
                          {{"Idempotency-Key", key}})
                         .status,
                     500);
            QCOMPARE(post(port, "/hooks/" + ep.toUtf8(), "{\"bytes\":\"\\u0000\"}",
                          {{"Idempotency-Key", key}})
                         .header("Idempotency-Outcome"),
                     QByteArray("replayed"));
        }
        ::kill(pid_t(serve->processId()), SIGTERM); // flushes the delivery log
        QVERIFY(serve->waitForFinished(15000));
        const QString f1 = ep + u":f1"_qs;
        const QJsonObject before =
            QJsonDocument::fromJson(
                idemdesk({u"keys"_qs, u"show"_qs, f1, u"--json"_qs, u"--config"_qs, source}).out)
                .object();
        QCOMPARE(before.value(u"deliveries").toArray().size(), 2);

        const QString file = m_dir.filePath(run + u".jsonl"_qs);
        Run r = idemdesk({u"keys"_qs, u"export"_qs, u"--endpoint"_qs, ep, u"--state"_qs,
                          u"failed"_qs, u"--output"_qs, file, u"--config"_qs, source});
        QVERIFY2(r.rc == 0, r.err.constData());
        QVERIFY2(r.err.contains("exported 2 keys"), r.err.constData());
        QFile exported(file);
        QVERIFY(exported.open(QIODevice::ReadOnly));
        const QList<QByteArray> lines = exported.readAll().trimmed().split('\n');
        QCOMPARE(lines.size(), 2);
        const QJsonObject line = QJsonDocument::fromJson(lines.first()).object();
        for (const char *part : {"record", "request", "result", "history", "timeline"})
            QVERIFY2(line.contains(QLatin1String(part)), part);
        // Only the named key.
        r = idemdesk({u"keys"_qs, u"export"_qs, f1, u"--config"_qs, source});
        QCOMPARE(r.out.trimmed().count('\n'), 0);
        QVERIFY(r.out.contains(f1.toUtf8()));

        const QStringList into{u"--store"_qs, store};
        r = idemdesk(QStringList{u"keys"_qs, u"import"_qs, file} + into);
        QVERIFY2(r.rc == 0, r.out + r.err);
        QVERIFY2(r.out.contains("imported " + f1.toUtf8()) &&
                     r.out.contains("2 keys imported, 0 already here, 0 refused"),
                 r.out.constData());
        const QJsonObject after =
            QJsonDocument::fromJson(
                idemdesk(QStringList{u"keys"_qs, u"show"_qs, f1, u"--json"_qs} + into).out)
                .object();
        for (const char *field :
             {"state", "fingerprint", "error", "created_at", "updated_at", "request", "result"})
            QVERIFY2(after.value(QLatin1String(field)) == before.value(QLatin1String(field)),
                     field);
        QCOMPARE(after.value(u"state").toString(), u"failed"_qs);
        const qint64 ttl = after.value(u"ttl_seconds").toInteger();
        QVERIFY2(ttl > 7000 && ttl <= 7200,
                 qPrintable(QString::number(ttl))); // what was left, not the store's default
        // The timeline comes with the record, into its history (marked imported), never into
        // this store's delivery log: stats, Traffic and Live show this desk's deliveries only.
        QCOMPARE(after.value(u"deliveries").toArray().size(), 0);
        const QJsonArray history = after.value(u"history").toArray();
        const QJsonArray historyBefore = before.value(u"history").toArray();
        QCOMPARE(history.size(), historyBefore.size() + 2);
        for (const QJsonValue &entry : historyBefore)
            QVERIFY(history.contains(entry));
        int delivered = 0;
        for (const QJsonValue &entry : history)
            if (entry.toObject().value(u"event") == u"delivered"_qs) {
                ++delivered;
                QVERIFY2(entry.toObject().value(u"detail").toString().startsWith(u"imported: "_qs),
                         qPrintable(entry.toObject().value(u"detail").toString()));
            }
        QCOMPARE(delivered, 2);
        r = idemdesk(QStringList{u"stats"_qs, u"--json"_qs} + into);
        QVERIFY2(!r.out.contains(ep.toUtf8()), r.out.constData());

        // Again: every key exists, left alone and reported.
        r = idemdesk(QStringList{u"keys"_qs, u"import"_qs, file} + into);
        QCOMPARE(r.rc, 0);
        QVERIFY2(r.out.contains("exists   " + f1.toUtf8() + " (left alone)") &&
                     r.out.contains("0 keys imported, 2 already here"),
                 r.out.constData());
        QCOMPARE(QJsonDocument::fromJson(
                     idemdesk(QStringList{u"keys"_qs, u"show"_qs, f1, u"--json"_qs} + into).out)
                     .object()
                     .value(u"history")
                     .toArray()
                     .size(),
                 history.size());
        // A broken line is refused and named; the good ones still go in.
        const QString mixed =
            writeFile(m_dir, run + u"-mixed.jsonl"_qs, "not json\n" + lines.last() + "\n");
        r = idemdesk(QStringList{u"keys"_qs, u"import"_qs, mixed} + into);
        QCOMPARE(r.rc, 1);
        QVERIFY2(r.err.contains("line 1 refused: not JSON"), r.err.constData());
        QVERIFY2(r.out.contains("1 already here, 1 refused"), r.out.constData());
        // The imported failed key behaves like one: a reset makes it processable.
        r = idemdesk(QStringList{u"keys"_qs, u"reset"_qs, f1} + into);
        QVERIFY2(r.rc == 0, r.err.constData());
        for (const QString &key : {f1, ep + u":f2"_qs})
            QCOMPARE(idemdesk(QStringList{u"keys"_qs, u"delete"_qs, key} + into).rc, 0);
    }

    // A batch's records whose shared content is gone from the store: show says what is lost,
    // export leaves them out and fails, retry refuses to make up their headers; each exits 1.
    void recordsMissingTheirSharedContentFailClearly()
    {
        const QString run = QString::number(QRandomGenerator::global()->bounded(1u << 30), 36);
        const QString db = m_dir.filePath(run + u"-shared.db"_qs);
        const QString config = writeFile(
            m_dir, run + u"-shared.json"_qs,
            "{\"store\": \"sqlite:" + db.toUtf8() +
                "\", \"endpoints\": [{\"name\": \"sg\", \"provider\": \"sendgrid\"}]}");
        quint16 port = 0;
        QByteArray err;
        auto serve = idem::test::startServe(QStringLiteral(IDEMDESK_BIN), {u"--config"_qs, config},
                                            port, &err);
        QVERIFY2(port, err.constData());
        QCOMPARE(post(port, "/hooks/sg",
                      "[{\"event\":\"open\",\"sg_event_id\":\"x1\",\"timestamp\":1},"
                      "{\"event\":\"open\",\"sg_event_id\":\"x2\",\"timestamp\":1}]")
                     .status,
                 200);
        ::kill(pid_t(serve->processId()), SIGTERM);
        QVERIFY(serve->waitForFinished(15000));
        QVERIFY2(idemdesk({u"keys"_qs, u"show"_qs, u"sg:x1"_qs, u"--config"_qs, config}).rc == 0,
                 "the record reads whole while its shared content is there");
        sqlite3 *handle = nullptr;
        QCOMPARE(sqlite3_open(QFile::encodeName(db).constData(), &handle), SQLITE_OK);
        QCOMPARE(sqlite3_exec(handle, "DELETE FROM idem_shared", nullptr, nullptr, nullptr),
                 SQLITE_OK);
        QVERIFY(sqlite3_changes(handle) >= 1);
        sqlite3_close(handle);

        Run r = idemdesk({u"keys"_qs, u"show"_qs, u"sg:x1"_qs, u"--config"_qs, config});
        QCOMPARE(r.rc, 1);
        QVERIFY2(r.out.contains("lost") && r.out.contains("its request headers"), r.out.constData());
        QVERIFY2(r.err.contains("named shared content the store no longer has"), r.err.constData());
        r = idemdesk({u"keys"_qs, u"show"_qs, u"sg:x1"_qs, u"--json"_qs, u"--config"_qs, config});
        QCOMPARE(r.rc, 1);
        QVERIFY2(QJsonDocument::fromJson(r.out)[u"lost"_qs].toString().contains(u"request headers"_qs),
                 r.out.constData());
        const QString file = m_dir.filePath(run + u"-shared.jsonl"_qs);
        r = idemdesk({u"keys"_qs, u"export"_qs, u"--output"_qs, file, u"--config"_qs, config});
        QCOMPARE(r.rc, 1);
        QVERIFY2(r.err.contains("not exported: sg:x1: its request headers"), r.err.constData());
        QVERIFY2(r.err.contains("not exported: sg:x2: its request headers"), r.err.constData());
        r = idemdesk({u"keys"_qs, u"retry"_qs, u"sg:x1"_qs, u"--force"_qs, u"--config"_qs, config});
        QCOMPARE(r.rc, 1);
        QVERIFY2(r.err.contains("cannot be retried"), r.err.constData());
    }

    void anExportIsForItsOwnerAloneAndWritesThroughNoLink()
    {
        // The export holds every stored request and result: 0600 like the store, new or
        // replacing a file of another mode. A link planted where the file was expected (a
        // shared folder) is refused, the file it points to left alone; a pipe or /dev/null, even
        // through a link, is written in place; a directory is refused.
        const QStringList store{u"--store"_qs, u"sqlite:"_qs + m_dir.filePath(u"priv.db"_qs)};
        const auto exportTo = [&](const QString &path) {
            return idemdesk(QStringList{u"keys"_qs, u"export"_qs, u"--output"_qs, path} + store);
        };
        const auto mode = [](const QString &path) {
            struct stat st = {};
            return ::lstat(QFile::encodeName(path).constData(), &st) == 0 ? st.st_mode & 07777 : 0u;
        };
        const QString fresh = m_dir.filePath(u"priv-new.jsonl"_qs);
        Run r = exportTo(fresh);
        QVERIFY2(r.rc == 0, r.err.constData());
        QCOMPARE(mode(fresh), 0600u);
        const QString old = writeFile(m_dir, u"priv-old.jsonl"_qs, "old\n");
        QVERIFY(QFile::setPermissions(old, QFileDevice::ReadOwner | QFileDevice::WriteOwner |
                                               QFileDevice::ReadGroup | QFileDevice::ReadOther));
        r = exportTo(old);
        QVERIFY2(r.rc == 0, r.err.constData());
        QCOMPARE(mode(old), 0600u);

        const QString victim = writeFile(m_dir, u"priv-victim.txt"_qs, "mine\n");
        const QString link = m_dir.filePath(u"priv-link.jsonl"_qs);
        QVERIFY(QFile::link(victim, link));
        r = exportTo(link);
        QCOMPARE(r.rc, 2);
        QVERIFY2(r.err.contains("is a symbolic link: not followed"), r.err.constData());
        QFile mine(victim);
        QVERIFY(mine.open(QIODevice::ReadOnly));
        QCOMPARE(mine.readAll(), QByteArray("mine\n"));
        const QString dangling = m_dir.filePath(u"priv-dangling.jsonl"_qs);
        QVERIFY(QFile::link(m_dir.filePath(u"priv-nowhere.txt"_qs), dangling));
        QCOMPARE(exportTo(dangling).rc, 2);
        QVERIFY(!QFile::exists(m_dir.filePath(u"priv-nowhere.txt"_qs)));
        QVERIFY(QDir(m_dir.path()).mkdir(u"priv-dir"_qs));
        r = exportTo(m_dir.filePath(u"priv-dir"_qs));
        QCOMPARE(r.rc, 2);
        QVERIFY2(r.err.contains("is a directory"), r.err.constData());
        QCOMPARE(
            QDir(m_dir.path()).entryList({u"priv-*"_qs}, QDir::AllEntries | QDir::System).size(),
            6); // new, old, victim, link, dangling, dir: no temporary file left

        QCOMPARE(exportTo(u"/dev/null"_qs).rc, 0);
        const QString toNull = m_dir.filePath(u"priv-null"_qs);
        QVERIFY(QFile::link(u"/dev/null"_qs, toNull));
        QCOMPARE(exportTo(toNull).rc, 0);
        const QString fifo = m_dir.filePath(u"priv-fifo"_qs);
        QCOMPARE(::mkfifo(QFile::encodeName(fifo).constData(), 0600), 0);
        std::thread reader([&] {
            QFile f(fifo);
            if (f.open(QIODevice::ReadOnly))
                f.readAll();
        });
        r = exportTo(fifo);
        reader.join();
        QVERIFY2(r.rc == 0, r.err.constData());
    }

    void importChecksEachLineAsADelivery()
    {
        // Each line is checked as the receiver would check a delivery; a bad one is named and
        // refused, the others still go in, and a line too long is never held in memory whole.
        const QString run = QString::number(QRandomGenerator::global()->bounded(1u << 30), 36);
        const QString ep = u"v"_qs + run;
        const QString config =
            writeFile(m_dir, run + u"-imp.json"_qs,
                      "{\"store\": \"sqlite:" + m_dir.filePath(run + u"-imp.db"_qs).toUtf8() +
                          "\", \"endpoints\": [{\"name\": \"" + ep.toUtf8() +
                          "\", \"max_body_bytes\": 16, \"max_response_bytes\": 16}]}");
        const QByteArray fp = QCryptographicHash::hash("{}", QCryptographicHash::Sha256).toHex();
        auto line = [&](const QString &id,
                        const std::function<void(QJsonObject &, QJsonObject &, QJsonObject &,
                                                 QJsonObject &)> &edit) {
            QJsonObject rec{{u"key"_qs, ep + u":"_qs + id},
                            {u"endpoint"_qs, ep},
                            {u"provider"_qs, u"generic"_qs},
                            {u"state"_qs, u"completed"_qs},
                            {u"fingerprint"_qs, QString::fromLatin1(fp)},
                            {u"attempts"_qs, 1},
                            {u"created"_qs, qint64(1'700'000'000'000)},
                            {u"updated"_qs, qint64(1'700'000'000'100)},
                            {u"ttl_ms"_qs, 3'600'000},
                            {u"lease_ms"_qs, 0},
                            {u"error"_qs, QString()}};
            QJsonObject req{{u"method"_qs, u"POST"_qs},
                            {u"path"_qs, u"/hooks/"_qs + ep},
                            {u"headers"_qs, QJsonArray{QJsonArray{u"X-A"_qs, u"1"_qs}}},
                            {u"body_base64"_qs, u"e30="_qs}};
            QJsonObject res{{u"status"_qs, 200},
                            {u"headers"_qs, QJsonArray()},
                            {u"body_base64"_qs, u"b2s="_qs}};
            QJsonObject rest{
                {u"history"_qs, QJsonArray{QJsonObject{{u"at"_qs, qint64(1'700'000'000'000)},
                                                       {u"event"_qs, u"claimed"_qs},
                                                       {u"token"_qs, 1}}}},
                {u"timeline"_qs, QJsonArray()}};
            edit(rec, req, res, rest);
            rest.insert(u"record"_qs, rec);
            rest.insert(u"request"_qs, req);
            rest.insert(u"result"_qs, res);
            return QJsonDocument(rest).toJson(QJsonDocument::Compact);
        };
        using O = QJsonObject;
        const QList<QPair<QByteArray, QByteArray>> lines{
            {line(u"good"_qs, [](O &, O &, O &, O &) {}), "imported"},
            {line(u"a"_qs, [&](O &rec, O &, O &, O &) { rec[u"key"_qs] = u"other:a"_qs; }),
             "must be record.endpoint ':' key"},
            {line(u"b"_qs, [&](O &rec, O &, O &, O &) { rec[u"key"_qs] = ep + u":b\u00e9"_qs; }),
             "printable ASCII"},
            {line(u"c"_qs, [&](O &rec, O &, O &,
                               O &) { rec[u"key"_qs] = ep + u":"_qs + QString(300, u'c'); }),
             "longer than 255"},
            {line(u"d"_qs, [](O &rec, O &, O &, O &) { rec[u"state"_qs] = u"done"_qs; }),
             "record.state must be"},
            {line(u"e"_qs, [](O &rec, O &, O &, O &) { rec[u"fingerprint"_qs] = u"xyz"_qs; }),
             "record.fingerprint"},
            {line(u"e2"_qs,
                  [](O &rec, O &, O &, O &) { rec[u"fingerprint"_qs] = QString(64, u'a'); }),
             "not the SHA-256 of request.body"},
            {line(u"f"_qs, [](O &rec, O &, O &, O &) { rec[u"attempts"_qs] = 0; }),
             "record.attempts"},
            {line(u"g"_qs, [](O &, O &, O &res, O &) { res[u"status"_qs] = 0; }),
             "result.status must be 100"},
            {line(u"h"_qs, [](O &, O &, O &res, O &) { res[u"status"_qs] = 700; }),
             "result.status must be 100"},
            {line(u"i"_qs,
                  [](O &rec, O &, O &, O &) { rec[u"ttl_ms"_qs] = 20.0 * 365 * 24 * 3600 * 1000; }),
             "record.ttl_ms"},
            {line(u"j"_qs,
                  [](O &rec, O &, O &, O &) {
                      rec[u"state"_qs] = u"processing"_qs;
                      rec[u"ttl_ms"_qs] = 1000;
                      rec[u"lease_ms"_qs] = 5000;
                  }),
             "record.lease_ms"},
            {line(u"k"_qs,
                  [](O &, O &req, O &, O &) {
                      req[u"body_base64"_qs] = QString::fromLatin1(QByteArray(17, 'x').toBase64());
                  }),
             "a body is longer than the endpoint allows (request 17 of 16"},
            {line(u"l"_qs, [](O &, O &req, O &, O &) { req[u"path"_qs] = u"/hooks/x\nforged"_qs; }),
             "request.path"},
            {line(u"m"_qs, [](O &, O &, O &, O &rest) { rest[u"history"_qs] = u"no"_qs; }),
             "history and timeline must be arrays"},
            {line(u"n"_qs,
                  [](O &, O &req, O &, O &) {
                      req[u"headers"_qs] = QJsonArray{1, 2};
                  }),
             "headers must be"},
            {line(u"o"_qs, [](O &rec, O &, O &, O &) { rec[u"attempts"_qs] = u"3"_qs; }),
             "record.attempts"},
            {line(u"p"_qs,
                  [&](O &rec, O &, O &, O &) {
                      rec[u"endpoint"_qs] = ep + u":x"_qs; // its keys would be ep's
                      rec[u"key"_qs] = ep + u":x:p"_qs;
                  }),
             "is not an endpoint name"},
            {line(u"q"_qs, [](O &rec, O &, O &, O &) { rec[u"provider"_qs] = u"stripe"_qs; }),
             "but endpoint"},
            {line(u"r"_qs,
                  [](O &, O &, O &, O &rest) {
                      rest[u"history"_qs] =
                          QJsonArray{QJsonObject{{u"at"_qs, qint64(1'700'000'000'000)},
                                                 {u"event"_qs, u"claimed\nstate        forged"_qs},
                                                 {u"token"_qs, 1}}};
                  }),
             "a history entry is not"},
            {line(u"ctl"_qs, [](O &rec, O &, O &,
                                O &) { rec[u"error"_qs] = u"boom\nstate        forged"_qs; }),
             "imported"},
            {line(u"good"_qs, [](O &, O &, O &, O &) {}), "the same key as line 1"},
            {line(u"dup"_qs, [](O &rec, O &, O &, O &) { rec[u"ttl_ms"_qs] = 1; }), "imported"},
            {line(u"many"_qs,
                  [](O &, O &, O &, O &rest) {
                      // Its own story and another desk's 64 deliveries: the story is kept whole.
                      const qint64 t = 1'700'000'000'000;
                      rest[u"history"_qs] = QJsonArray{
                          QJsonObject{
                              {u"at"_qs, t}, {u"event"_qs, u"claimed"_qs}, {u"token"_qs, 1}},
                          QJsonObject{
                              {u"at"_qs, t + 1}, {u"event"_qs, u"completed"_qs}, {u"token"_qs, 1}}};
                      QJsonArray timeline;
                      for (int i = 0; i < 64; ++i)
                          timeline.append(QJsonObject{{u"at"_qs, t + 2 + i},
                                                      {u"outcome"_qs, u"replayed"_qs},
                                                      {u"status"_qs, 200}});
                      rest[u"timeline"_qs] = timeline;
                  }),
             "imported"},
            {line(u"dup"_qs, [](O &rec, O &, O &, O &) { rec[u"error"_qs] = u"SECOND"_qs; }),
             "the same key as line 23"},
            {line(u"tk1"_qs, [](O &rec, O &, O &, O &) { rec[u"token"_qs] = -1; }),
             "record.token must be an integer from 0 to 4503599627370496"},
            {line(u"tk2"_qs,
                  [](O &rec, O &, O &, O &) { rec[u"token"_qs] = qint64(4503599627370497); }),
             "record.token must be"},
            {line(u"tk3"_qs, [](O &rec, O &, O &, O &) { rec[u"token"_qs] = u"5"_qs; }),
             "record.token must be"},
            {line(u"moved"_qs,
                  [](O &rec, O &, O &, O &) { rec[u"token"_qs] = qint64(3'000'000'000'000'000); }),
             "imported"},
            {"{\"record\": {\"key\": \"" + QByteArray(12 * 1024 * 1024, 'z') + "\"}}",
             "longer than"},
            {line(u"after"_qs, [](O &, O &, O &, O &) {}), "imported"},
            // A method is an RFC 9110 token; a token may be shell syntax all the same (Copy as
            // curl quotes it: tst_ui).
            {line(u"m1"_qs,
                  [](O &, O &req, O &, O &) { req[u"method"_qs] = u"POST $(touch pwned)"_qs; }),
             "request.method 'POST $(touch pwned)' is not an HTTP method"},
            {line(u"m2"_qs, [](O &, O &req, O &, O &) { req[u"method"_qs] = u"PO\nST"_qs; }),
             "request.method 'PO\\u000aST' is not an HTTP method"},
            {line(u"m3"_qs,
                  [](O &, O &req, O &, O &) { req[u"method"_qs] = u"`touch$IFS.pwned`"_qs; }),
             "imported"},
        };
        QByteArray content;
        for (const auto &l : lines)
            content += l.first + '\n';
        const QString file = writeFile(m_dir, run + u"-imp.jsonl"_qs, content);
        Run r = idemdesk({u"keys"_qs, u"import"_qs, file, u"--config"_qs, config});
        QCOMPARE(r.rc, 1);
        for (int i = 0; i < lines.size(); ++i) {
            const QByteArray expected = lines.at(i).second;
            if (expected == "imported")
                continue;
            const QByteArray prefix = "line " + QByteArray::number(i + 1) + " refused: ";
            const qsizetype at = r.err.indexOf(prefix);
            QVERIFY2(at >= 0 && r.err.indexOf('\n', at) > r.err.indexOf(expected, at) &&
                         r.err.indexOf(expected, at) > at,
                     (prefix + expected + "\n--\n" + r.err.mid(at, 400)).constData());
        }
        QVERIFY2(r.out.contains("7 keys imported, 0 already here, 27 refused"), r.out.constData());
        QCOMPARE(idemdesk({u"keys"_qs, u"show"_qs, ep + u":after"_qs, u"--config"_qs, config}).rc,
                 0);
        // The token the app last saw for a key, where it was exported: this store's is above it.
        QCOMPARE_GT(QJsonDocument::fromJson(idemdesk({u"keys"_qs, u"show"_qs, ep + u":moved"_qs,
                                                      u"--json"_qs, u"--config"_qs, config})
                                                .out)
                        .object()
                        .value(u"token"_qs)
                        .toInteger(),
                    qint64(3'000'000'000'000'000));
        // The refused duplicate wrote nothing, even where the first line's record had expired
        // by then (TTL 1 ms): that key is gone, not replaced by the second line.
        Run shown = idemdesk({u"keys"_qs, u"show"_qs, ep + u":dup"_qs, u"--config"_qs, config});
        QVERIFY2(!shown.out.contains("SECOND"), shown.out.constData());
        shown = idemdesk(
            {u"keys"_qs, u"show"_qs, ep + u":many"_qs, u"--json"_qs, u"--config"_qs, config});
        const QJsonArray history =
            QJsonDocument::fromJson(shown.out).object().value(u"history"_qs).toArray();
        QCOMPARE(history.size(), 64);
        QCOMPARE(history.at(1).toObject().value(u"event"_qs).toString(), u"completed"_qs);
        QVERIFY(history.last()
                    .toObject()
                    .value(u"detail"_qs)
                    .toString()
                    .startsWith(u"imported: replayed"_qs));
        // A line break in a stored text cannot forge a line of `keys show`.
        shown = idemdesk({u"keys"_qs, u"show"_qs, ep + u":ctl"_qs, u"--config"_qs, config});
        QVERIFY2(shown.rc == 0 && !shown.out.contains("\nstate        forged") &&
                     shown.out.contains("boom\\u000astate"),
                 shown.out.constData());
    }

    void sendersCannotWriteToTheTerminal()
    {
        // A percent-decoded path and a stored body reach text output: serve's log and `keys
        // show`. Control characters are escaped there, so no forged log line, no escape sequence.
        const QString config = m_dir.filePath(u"esc.json"_qs);
        QFile f(config);
        QVERIFY(f.open(QIODevice::WriteOnly));
        f.write(QStringLiteral("{\"store\": \"sqlite:%1\", \"endpoints\": [{\"name\": \"esc\"}]}")
                    .arg(m_dir.filePath(u"esc.db"_qs)).toUtf8());
        f.close();
        const QStringList common{u"--config"_qs, config};
        quint16 port = 0;
        QByteArray err;
        auto serve = idem::test::startServe(QStringLiteral(IDEMDESK_BIN), common, port, &err, true);
        QVERIFY2(port, err.constData());
        const QByteArray forged = "2030-01-01T00:00:00.000Z esc esc:forged processed 200 1.0ms";
        const ClientResponse unknown = post(port, "/hooks/x%0a" + QByteArray(forged).replace(' ', "%20") + "%1b%5b2J%1b%5d0;owned%07", "{}");
        QCOMPARE(unknown.status, 404);
        const QByteArray body = "\x1b]0;owned\x07\x1b[2J\rprocessed fine\xc2\x9b"; // the last: U+009B, CSI
        QCOMPARE(post(port, "/hooks/esc", body, {{"Idempotency-Key", "ctl"}}).status, 200);

        Run r = idemdesk(QStringList{u"keys"_qs, u"show"_qs, u"esc:ctl"_qs} + common);
        QCOMPARE(r.rc, 0);
        for (const char c : r.out)
            QVERIFY2(uchar(c) >= 0x20 || c == '\n' || c == '\t', qPrintable(u"byte %1 in keys show"_qs.arg(int(uchar(c)))));
        QVERIFY2(r.out.contains("\\u001b]0;owned\\u0007\\u001b[2J\\u000dprocessed fine\\u009b"), r.out.constData());
        // JSON output was safe already, and keeps the bytes exactly.
        r = idemdesk(QStringList{u"keys"_qs, u"show"_qs, u"esc:ctl"_qs, u"--json"_qs} + common);
        QCOMPARE(QJsonDocument::fromJson(r.out).object().value(u"request"_qs).toObject().value(u"body"_qs).toString(),
                 QString::fromUtf8(body));

        ::kill(pid_t(serve->processId()), SIGTERM);
        QVERIFY(serve->waitForFinished(15000));
        const QByteArray log = serve->readAllStandardOutput();
        QVERIFY2(log.contains("\\u000a2030-01-01T00:00:00.000Z"), log.constData());
        QVERIFY(log.contains("\\u001b[2J"));
        for (const QByteArray &line : log.split('\n')) {
            QVERIFY2(!line.startsWith("2030-01-01"), line.constData()); // no line of the sender's making
            for (const char c : line)
                QVERIFY2(uchar(c) >= 0x20, line.constData());
        }
        QCOMPARE(log.count('\n'), 2); // two deliveries, two lines
    }

    void remoteListenNeedsSignatures()
    {
        // Reachable from the network, every endpoint must verify a signature unless the
        // operator says --allow-unsigned; SendGrid's public key counts as one.
        const QString store = u"sqlite:"_qs + m_dir.filePath(u"remote.db"_qs);
        const QStringList remote{u"--listen"_qs, u"0.0.0.0:0"_qs, u"--allow-remote"_qs, u"--store"_qs, store};
        Run r = idemdesk(QStringList{u"serve"_qs} + remote);
        QCOMPARE(r.rc, 2);
        QVERIFY2(r.err.contains("verify no signature") && r.err.contains("--allow-unsigned") && r.err.contains("generic"), r.err.constData());
        // The built-in sendgrid endpoint among them: unsigned, one small batch of many events
        // would make many records (docs/security.md).
        QVERIFY2(r.err.contains("sendgrid"), r.err.constData());
        QCOMPARE(r.err.count('\n'), 1);
        {
            // The window refuses the same, on stderr and in a message box (modal: the test reads
            // stderr, then closes the process). Qt's own -platform option is not the desk's.
            QProcess gui;
            gui.start(QStringLiteral(IDEMDESK_BIN),
                      {u"gui"_qs, u"--listen"_qs, u"0.0.0.0:0"_qs, u"--allow-remote"_qs, u"--store"_qs, store,
                       u"-platform"_qs, u"offscreen"_qs});
            QByteArray err;
            QTRY_VERIFY2_WITH_TIMEOUT((err += gui.readAllStandardError()).contains("--allow-unsigned"), err.constData(), 30'000);
            QVERIFY2(!err.contains("Unknown option"), err.constData());
            gui.kill();
            gui.waitForFinished(10'000);
        }

        QProcess keygen;
        keygen.start(u"openssl"_qs, {u"genpkey"_qs, u"-algorithm"_qs, u"EC"_qs, u"-pkeyopt"_qs, u"ec_paramgen_curve:P-256"_qs});
        QVERIFY(keygen.waitForFinished(20000));
        QProcess pub;
        pub.start(u"openssl"_qs, {u"pkey"_qs, u"-pubout"_qs, u"-outform"_qs, u"DER"_qs});
        pub.write(keygen.readAllStandardOutput());
        pub.closeWriteChannel();
        QVERIFY(pub.waitForFinished(20000));
        const QByteArray publicKey = pub.readAllStandardOutput().toBase64();
        QVERIFY(!publicKey.isEmpty());
        const QString config = m_dir.filePath(u"signed.json"_qs);
        QFile f(config);
        QVERIFY(f.open(QIODevice::WriteOnly));
        f.write("{\"endpoints\": [{\"name\": \"stripe\", \"provider\": \"stripe\", \"secret\": \"whsec_remote\"},"
                " {\"name\": \"sendgrid\", \"provider\": \"sendgrid\", \"public_key\": \"" + publicKey + "\"}]}");
        f.close();
        f.setPermissions(QFileDevice::ReadOwner | QFileDevice::WriteOwner);
        r = idemdesk(QStringList{u"stats"_qs, u"--json"_qs, u"--config"_qs, config, u"--store"_qs, store});
        QCOMPARE(r.rc, 0);
        const QJsonArray warnings = QJsonDocument::fromJson(r.out).object().value(u"warnings"_qs).toArray();
        QVERIFY2(warnings.isEmpty(), QJsonDocument(warnings).toJson().constData()); // no "sendgrid: no secret"

        // Signed endpoints only: --allow-remote is enough. Unsigned ones: with --allow-unsigned.
        for (const QStringList &args : {QStringList{u"--config"_qs, config}, QStringList{u"--allow-unsigned"_qs}}) {
            QProcess serve;
            serve.setStandardOutputFile(QProcess::nullDevice());
            serve.start(QStringLiteral(IDEMDESK_BIN), QStringList{u"serve"_qs} + remote + args);
            QByteArray text;
            QTRY_VERIFY_WITH_TIMEOUT((text += serve.readAllStandardError()).contains("receiving webhooks at http://0.0.0.0:")
                                         || serve.state() == QProcess::NotRunning, 15000);
            QVERIFY2(serve.state() == QProcess::Running, text.constData());
            ::kill(pid_t(serve.processId()), SIGTERM);
            QVERIFY(serve.waitForFinished(15000));
            QCOMPARE(serve.exitCode(), 0);
        }
    }

    void postgresTlsSettingsReachLibpq()
    {
        // sslmode and friends in the store URL go to libpq: the test server has no TLS, so
        // requiring it must fail, and disabling it must not.
        const QString url = qEnvironmentVariable("IDEM_TEST_POSTGRES_URL");
        if (url.isEmpty())
            QFAIL("IDEM_TEST_POSTGRES_URL is not set: run through ./dev test");
        Run r = idemdesk({u"stats"_qs, u"--store"_qs, url + u"?sslmode=require"_qs});
        QCOMPARE(r.rc, 1);
        QVERIFY2(r.err.contains("SSL"), r.err.constData());
        r = idemdesk({u"stats"_qs, u"--store"_qs, url + u"?sslmode=disable"_qs});
        QVERIFY2(r.rc == 0, r.err.constData());
        r = idemdesk({u"stats"_qs, u"--store"_qs, url + u"?sslmode=sometimes"_qs});
        QCOMPARE(r.rc, 2);
    }

    void usageAndRuntimeErrors()
    {
        QCOMPARE(idemdesk({u"keys"_qs, u"show"_qs}).rc, 2);
        QCOMPARE(idemdesk({u"keys"_qs, u"frob"_qs}).rc, 2);
        QCOMPARE(idemdesk({u"keys"_qs, u"list"_qs, u"--limit"_qs, u"zero"_qs}).rc, 2);
        QCOMPARE(idemdesk({u"keys"_qs, u"reset"_qs}).rc, 2);
        QCOMPARE(idemdesk({u"storm"_qs, u"--copies"_qs, u"3"_qs}).rc, 2);
        QCOMPARE(idemdesk({u"storm"_qs, u"--endpoint"_qs, u"nope"_qs}).rc, 2);
        QCOMPARE(idemdesk({u"stats"_qs, u"--since"_qs, u"-1"_qs}).rc, 2);
        QCOMPARE(idemdesk({u"stats"_qs, u"--since"_qs, u"99999999999999999"_qs}).rc, 2);
        const Run down = idemdesk({u"keys"_qs, u"list"_qs, u"--store"_qs, u"redis://127.0.0.1:1/0"_qs});
        QCOMPARE(down.rc, 1);
        QVERIFY2(down.err.startsWith("idemdesk: cannot connect to Redis"), down.err.constData());
        QCOMPARE(down.err.count('\n'), 1); // one line
        QCOMPARE(idemdesk({u"stats"_qs, u"--store"_qs, u"postgresql://idem@127.0.0.1:1/x"_qs}).rc, 1);
        // A store path onto a file that is not a database: refused naming the file, and the
        // file left as it was (it was made 0600 before the refusal: /etc/passwd, as root).
        QFile other(m_dir.filePath(u"notes.txt"_qs));
        QVERIFY(other.open(QIODevice::WriteOnly) && other.write("not a database\n") > 0);
        other.close();
        QVERIFY(other.setPermissions(QFileDevice::ReadOwner | QFileDevice::WriteOwner |
                                     QFileDevice::ReadOther));
        const Run notADatabase =
            idemdesk({u"keys"_qs, u"list"_qs, u"--store"_qs, u"sqlite:"_qs + other.fileName()});
        QCOMPARE(notADatabase.rc, 1);
        QVERIFY2(notADatabase.err.contains(other.fileName().toUtf8()),
                 notADatabase.err.constData());
        QVERIFY(other.permissions() & QFileDevice::ReadOther);
        QCOMPARE(idemdesk({u"keys"_qs, u"list"_qs, u"--store"_qs, u"sqlite:"_qs}).rc,
                 2); // no file named
        // Another program's SQLite database: left as it is (the desk's tables and WAL were added).
        const QString foreign = m_dir.filePath(u"app.db"_qs);
        {
            sqlite3 *db = nullptr;
            QCOMPARE(sqlite3_open(QFile::encodeName(foreign).constData(), &db), SQLITE_OK);
            QCOMPARE(sqlite3_exec(db, "CREATE TABLE users (id INTEGER)", nullptr, nullptr, nullptr),
                     SQLITE_OK);
            sqlite3_close(db);
        }
        auto contents = [&foreign] {
            QFile f(foreign);
            return f.open(QIODevice::ReadOnly) ? f.readAll() : QByteArray();
        };
        const QByteArray before = contents();
        const Run theirs =
            idemdesk({u"keys"_qs, u"list"_qs, u"--store"_qs, u"sqlite:"_qs + foreign});
        QCOMPARE(theirs.rc, 1);
        QVERIFY2(theirs.err.contains("another program's SQLite database"), theirs.err.constData());
        QCOMPARE(contents(), before);
        // A store URL's password is not echoed, whatever is wrong with the URL.
        const Run scheme = idemdesk({u"stats"_qs, u"--store"_qs, u"mysql://root:hunter2@db/x"_qs});
        QCOMPARE(scheme.rc, 2);
        QVERIFY2(scheme.err.contains("unknown scheme") && !scheme.err.contains("hunter2"), scheme.err.constData());
        const Run unreachable = idemdesk({u"stats"_qs, u"--store"_qs, u"postgresql://idem:hunter2@127.0.0.1:1/x"_qs});
        QCOMPARE(unreachable.rc, 1);
        QVERIFY2(!unreachable.err.contains("hunter2"), unreachable.err.constData());
        // An empty address is no address; attach mode has no receiver to measure.
        const Run emptyMetrics = idemdesk({u"serve"_qs, u"--metrics-listen"_qs, QString()});
        QCOMPARE(emptyMetrics.rc, 2);
        QVERIFY2(emptyMetrics.err.contains("--metrics-listen needs HOST:PORT"),
                 emptyMetrics.err.constData());
        QCOMPARE(idemdesk({u"serve"_qs, u"--listen"_qs, QString()}).rc, 2);
        const Run attachMetrics =
            idemdesk({u"gui"_qs, u"--no-receiver"_qs, u"--store"_qs,
                      u"sqlite:"_qs + m_dir.filePath(u"attach.db"_qs), u"--metrics-listen"_qs,
                      u"127.0.0.1:0"_qs}); // QT_QPA_PLATFORM=offscreen
        QCOMPARE(attachMetrics.rc, 2);
        QVERIFY2(attachMetrics.err.contains("--metrics-listen") &&
                     attachMetrics.err.contains("--no-receiver"),
                 attachMetrics.err.constData());
        // --version after a command too: the same report as `idemdesk --version`.
        const Run version = idemdesk({u"serve"_qs, u"--version"_qs});
        QCOMPARE(version.rc, 0);
        QCOMPARE(version.out, idemdesk({u"--version"_qs}).out);
        // The commit as a hash (never a tag's name), "-dirty" when the tree was: nothing else.
        QVERIFY2(
            QRegularExpression(
                u"^idemdesk \\d+\\.\\d+\\.\\d+ \\(commit ([0-9a-f]{7,40}(-dirty)?|unknown)\\)\n"_qs)
                .match(QString::fromUtf8(version.out))
                .hasMatch(),
            version.out.constData());
        for (const QStringList &help : {QStringList{u"keys"_qs, u"list"_qs, u"--help"_qs}, {u"keys"_qs, u"show"_qs, u"--help"_qs},
                                        {u"keys"_qs, u"reset"_qs, u"--help"_qs}, {u"keys"_qs, u"retry"_qs, u"--help"_qs},
                                        {u"keys"_qs, u"delete"_qs, u"--help"_qs}, {u"keys"_qs, u"purge-expired"_qs, u"--help"_qs},
                                        {u"stats"_qs, u"--help"_qs}, {u"storm"_qs, u"--help"_qs}, {u"keys"_qs, u"--help"_qs}}) {
            const Run r = idemdesk(help);
            QCOMPARE(r.rc, 0);
            QVERIFY(r.out.contains("Usage"));
        }
    }
};

QTEST_GUILESS_MAIN(TestCli)
#include "tst_cli.moc"
