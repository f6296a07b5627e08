#include "config/config.h"
#include "providers/provider.h"
#include "store/storeurl.h"
#include "util/crypto.h"
#include "util/format.h"

#include <QCryptographicHash>
#include <QDateTime>

#include <QJsonDocument>
#include <QTemporaryDir>
#include <QTest>

using namespace idem;

class TestConfig : public QObject
{
    Q_OBJECT
private Q_SLOTS:
    void timesAndFingerprintsAsQtMakesThem()
    {
        // formatTime() caches the second's text per thread; sha256Hex() is libcrypto's: both
        // give what QDateTime and QCryptographicHash give, across second boundaries too.
        for (const qint64 ms :
             {qint64(0), qint64(999), qint64(1'000), qint64(1'796'278'959'706),
              qint64(1'796'278'959'999), qint64(1'796'278'960'000), qint64(1'796'278'960'007),
              qint64(1'796'278'959'706), qint64(-1'500)})
            QCOMPARE(formatTime(ms),
                     QDateTime::fromMSecsSinceEpoch(ms, Qt::UTC).toString(Qt::ISODateWithMs));
        for (const QByteArray &data : {QByteArray(), QByteArray("{}"), QByteArray(5000, 'x')})
            QCOMPARE(sha256Hex(data),
                     QCryptographicHash::hash(data, QCryptographicHash::Sha256).toHex());
    }

    void headersJsonIsQJsonsText()
    {
        // headersJson() remembers pairs per thread: the same text as QJson's whole array, on
        // first sight, when remembered, and after it forgot them (past 512).
        const HeaderList odd{{"Content-Type", "application/json"},
                             {"X-Quote", "say \"hi\"\\ \x01\t"},
                             {"X-Latin", "caf\xe9"},
                             {"Host", "127.0.0.1:8080"}};
        for (int round = 0; round < 3; ++round) {
            QCOMPARE(headersJson(odd), compactJson(headersToJson(odd)));
            QCOMPARE(headersJson({}), QByteArray("[]"));
            for (int i = 0; i < 400; ++i) {
                const HeaderList one{{"Idempotency-Key", QByteArray::number(round * 400 + i)},
                                     odd.first()};
                QCOMPARE(headersJson(one), compactJson(headersToJson(one)));
            }
        }
    }

    void builtinHasOneEndpointPerProvider()
    {
        const Config c = Config::builtin();
        QCOMPARE(c.endpoints.size(), builtinProviders().size());
        QVERIFY(c.endpoint(u"generic"));
        QCOMPARE(c.listen.toString(), QStringLiteral("127.0.0.1:8787"));
        QCOMPARE(c.endpoints.first().settings.ttlSeconds, 604800);
    }

    void fullConfig()
    {
        const QByteArray json = "{" "          \"listen\": \"127.0.0.1:9999\", \"store\": \"sqlite:/tmp/x.db\"," "          \"defaults\": {\"ttl_seconds\": 100, \"lease_seconds\": 5, \"forward_timeout_seconds\": 3, \"in_progress_status\": 202," "                       \"on_failed\": \"reject\", \"on_mismatch\": \"ignore\", \"on_missing_key\": \"passthrough\"}," "          \"endpoints\": [" "            {\"name\": \"orders\", \"provider\": \"generic\"," "             \"key\": {\"header\": \"X-Key\", \"json_pointer\": \"/id\", \"composite\": [\"/type\", \"/data/order_id\"]}," "             \"simulate\": {\"delay_ms\": 200, \"fail_rate\": 0.1}, \"lease_seconds\": 9}," "            {\"name\": \"fwd\", \"forward_to\": \"http://127.0.0.1:3000/x\", \"secret\": [\"a\", \"b\"]}" "          ]}";
        auto c = Config::parse(json, QStringLiteral("c.json"));
        QVERIFY2(c.ok(), c.ok() ? "" : qPrintable(c.error().message));
        QCOMPARE(c->listen.port, 9999);
        QCOMPARE(c->store, QStringLiteral("sqlite:/tmp/x.db"));
        const EndpointConfig *orders = c->endpoint(u"orders");
        QVERIFY(orders);
        QCOMPARE(orders->settings.leaseSeconds, 9);     // endpoint override
        QCOMPARE(orders->settings.ttlSeconds, 100);     // from defaults
        QCOMPARE(orders->settings.inProgressStatus, 202);
        QCOMPARE(orders->settings.onFailed, OnFailed::Reject);
        QCOMPARE(orders->settings.onMismatch, OnMismatch::Ignore);
        QVERIFY(orders->settings.passthroughMissingKey);
        QCOMPARE(orders->key.header, QByteArray("X-Key"));
        QCOMPARE(orders->key.composite.size(), 2);
        QCOMPARE(orders->simulate.delayMs, 200);
        const EndpointConfig *fwd = c->endpoint(u"fwd");
        QCOMPARE(fwd->secrets, QStringList({QStringLiteral("a"), QStringLiteral("b")}));
        QCOMPARE(fwd->forwardTo.port(), 3000);
    }

    void errorsNameTheField_data()
    {
        QTest::addColumn<QByteArray>("json");
        QTest::addColumn<QString>("expected");
        QTest::newRow("not json") << QByteArray("{") << QStringLiteral("c.json: not valid JSON");
        QTest::newRow("unknown top") << QByteArray("{\"lisen\": \"x\"}") << QStringLiteral("c.json: lisen: unknown field");
        QTest::newRow("unknown default") << QByteArray("{\"defaults\": {\"ttl\": 1}}") << QStringLiteral("c.json: defaults.ttl: unknown field");
        QTest::newRow("bad ttl") << QByteArray("{\"defaults\": {\"ttl_seconds\": \"7d\"}}") << QStringLiteral("c.json: defaults.ttl_seconds: must be an integer");
        QTest::newRow("bad policy") << QByteArray("{\"defaults\": {\"on_failed\": \"retry\"}}") << QStringLiteral("c.json: defaults.on_failed: must be one of");
        QTest::newRow("bad status") << QByteArray("{\"defaults\": {\"in_progress_status\": 200}}") << QStringLiteral("c.json: defaults.in_progress_status: must be 409, 202");
        QTest::newRow("missing name") << QByteArray("{\"endpoints\": [{\"provider\": \"generic\"}]}") << QStringLiteral("c.json: endpoints[0].name: is required");
        QTest::newRow("dup name") << QByteArray("{\"endpoints\": [{\"name\": \"a\"}, {\"name\": \"a\"}]}") << QStringLiteral("c.json: endpoints[1].name: \"a\" is used");
        QTest::newRow("bad provider") << QByteArray("{\"endpoints\": [{\"name\": \"a\", \"provider\": \"paypal\"}]}") << QStringLiteral("c.json: endpoints[0].provider: must be one of");
        QTest::newRow("bad forward") << QByteArray("{\"endpoints\": [{\"name\": \"a\", \"forward_to\": \"ftp://x\"}]}") << QStringLiteral("c.json: endpoints[0].forward_to: must be an http");
        QTest::newRow("bad fail rate") << QByteArray("{\"endpoints\": [{\"name\": \"a\", \"simulate\": {\"fail_rate\": 2}}]}") << QStringLiteral("c.json: endpoints[0].simulate.fail_rate: must be a number");
        QTest::newRow("bad pointer") << QByteArray("{\"endpoints\": [{\"name\": \"a\", \"key\": {\"json_pointer\": \"id\"}}]}") << QStringLiteral("c.json: endpoints[0].key.json_pointer: must start with '/'");
        QTest::newRow("unknown key field") << QByteArray("{\"endpoints\": [{\"name\": \"a\", \"key\": {\"jsonpointer\": \"/id\"}}]}") << QStringLiteral("c.json: endpoints[0].key.jsonpointer: unknown field");
        QTest::newRow("bad listen") << QByteArray("{\"listen\": \"8787\"}") << QStringLiteral("c.json: listen: '8787' is not HOST:PORT");
        QTest::newRow("bad metrics listen")
            << QByteArray("{\"metrics_listen\": \"9464\"}")
            << QStringLiteral("c.json: metrics_listen: '9464' is not HOST:PORT");
        QTest::newRow("metrics on the webhook port")
            << QByteArray(
                   "{\"listen\": \"127.0.0.1:9000\", \"metrics_listen\": \"127.0.0.1:9000\"}")
            << QStringLiteral("c.json: metrics_listen: must differ from \"listen\"");
        QTest::newRow("metrics on the webhook port, other host")
            << QByteArray("{\"listen\": \"0.0.0.0:9000\", \"metrics_listen\": \"127.0.0.1:9000\"}")
            << QStringLiteral("c.json: metrics_listen: must differ from \"listen\"");
        QTest::newRow("metrics on the default webhook port")
            << QByteArray("{\"metrics_listen\": \"localhost:8787\"}")
            << QStringLiteral("c.json: metrics_listen: must differ from \"listen\"");
        QTest::newRow("lease under forward timeout") << QByteArray("{\"defaults\": {\"lease_seconds\": 5, \"forward_timeout_seconds\": 30}}")
                                                     << QStringLiteral("c.json: defaults.lease_seconds: must be at least forward_timeout_seconds + 2 (30 + 2 = 32)");
        QTest::newRow("lease within the margin") << QByteArray("{\"endpoints\": [{\"name\": \"a\", \"lease_seconds\": 31}]}")
                                                 << QStringLiteral("c.json: endpoints[0].lease_seconds: must be at least forward_timeout_seconds + 2");
        QTest::newRow("endpoint forward timeout over the default lease") << QByteArray("{\"endpoints\": [{\"name\": \"a\", \"forward_timeout_seconds\": 59}]}")
                                                                         << QStringLiteral("c.json: endpoints[0].lease_seconds: must be at least forward_timeout_seconds + 2 (59 + 2 = 61)");
        QTest::newRow("ttl under lease") << QByteArray("{\"defaults\": {\"ttl_seconds\": 30}}")
                                         << QStringLiteral("c.json: defaults.ttl_seconds: must be at least lease_seconds (60)");
        QTest::newRow("bad max response") << QByteArray("{\"defaults\": {\"max_response_bytes\": 0}}")
                                          << QStringLiteral("c.json: defaults.max_response_bytes: must be an integer");
        QTest::newRow("batch cap too high") << QByteArray("{\"defaults\": {\"max_batch_elements\": 100001}}")
                                            << QStringLiteral("c.json: defaults.max_batch_elements: must be an integer from 1 to 100000");
        QTest::newRow("empty secret") << QByteArray("{\"endpoints\": [{\"name\": \"a\", \"secret\": \"\"}]}") << QStringLiteral("c.json: endpoints[0].secret: must be a non-empty");
        QTest::newRow("budget under the largest body")
            << QByteArray(
                   "{\"max_buffered_request_bytes\": 65536, \"defaults\": {\"max_body_bytes\": "
                   "1000}, \"endpoints\": [{\"name\": \"a\"}, {\"name\": \"b\", "
                   "\"max_body_bytes\": 70000}]}")
            << QStringLiteral("c.json: max_buffered_request_bytes: must be at least the largest "
                              "max_body_bytes (70000)");
        QTest::newRow("no connection per client")
            << QByteArray("{\"max_connections_per_client\": 0}")
            << QStringLiteral("c.json: max_connections_per_client: must be an integer from 1");
        QTest::newRow("negative upload rate")
            << QByteArray("{\"min_upload_bytes_per_second\": -1}")
            << QStringLiteral("c.json: min_upload_bytes_per_second: must be an integer from 0");
        QTest::newRow("no idle time")
            << QByteArray("{\"idle_timeout_seconds\": 0}")
            << QStringLiteral("c.json: idle_timeout_seconds: must be an integer from 1");
        // A member named twice: JSON parsers keep one of the two without a word.
        QTest::newRow("top member twice") << QByteArray("{\"store\": \"a\", \"listen\": \"127.0.0.1:1\", \"store\": \"b\"}") << QStringLiteral("c.json: store: given twice");
        QTest::newRow("secret twice") << QByteArray("{\"endpoints\": [{\"name\": \"a\"}, {\"name\": \"b\", \"secret\": \"s1\", \"secret\": \"s2\"}]}")
                                      << QStringLiteral("c.json: endpoints[1].secret: given twice");
        QTest::newRow("twice, once escaped") << QByteArray("{\"defaults\": {\"ttl_seconds\": 90000, \"ttl_second\\u0073\": 1}}")
                                             << QStringLiteral("c.json: defaults.ttl_seconds: given twice");
        QTest::newRow("twice, deep in an array") << QByteArray("{\"endpoints\": [{\"name\": \"a\", \"secret\": [\"x\", \"y\"], \"key\": {\"header\": \"A\", \"header\": \"B\"}}]}")
                                                 << QStringLiteral("c.json: endpoints[0].key.header: given twice");
    }
    // The same name in different objects, and names, braces and commas inside strings, are not
    // a member given twice.
    void sameNameInOtherObjectsIsNotTwice()
    {
        const QByteArray json =
            "{\"endpoints\": [{\"name\": \"a\", \"secret\": \"s,{\\\"name\\\": ]\"},"
            " {\"name\": \"b\", \"secret\": \"name\"}], \"defaults\": {\"ttl_seconds\": 90000}}";
        auto c = Config::parse(json, QStringLiteral("c.json"));
        QVERIFY2(c.ok(), c.ok() ? "" : qPrintable(c.error().message));
        QCOMPARE(c->endpoints.size(), 2);
        QCOMPARE(c->endpoints.at(0).secrets.value(0), QStringLiteral("s,{\"name\": ]"));
    }
    void errorsNameTheField()
    {
        QFETCH(QByteArray, json);
        QFETCH(QString, expected);
        auto c = Config::parse(json, QStringLiteral("c.json"));
        QVERIFY(!c.ok());
        QVERIFY2(c.error().message.startsWith(expected), qPrintable(c.error().message));
    }

    void jsonRoundTrip()
    {
        const QByteArray json =
            "{\"listen\": \"127.0.0.1:9000\", \"metrics_listen\": \"127.0.0.1:9464\", "
            "\"endpoints\": [{\"name\": \"o\", \"secret\": [\"a\", \"b\"], \"lease_seconds\": 7, "
            "\"forward_timeout_seconds\": 5,"
            " \"on_failed\": \"reject\", \"key\": {\"json_pointer\": \"/id\"}, \"simulate\": "
            "{\"delay_ms\": 5, \"fail_rate\": 0.5}},"
            " {\"name\": \"f\", \"forward_to\": \"http://127.0.0.1:1/x\", \"in_progress_status\": "
            "202}, {\"name\": \"sg\", \"provider\": \"sendgrid\", \"max_batch_elements\": 50},"
            " {\"name\": \"gh\", \"provider\": \"github\", \"key\": {\"composite\": [\"\"]}}]}";
        auto first = Config::parse(json, QStringLiteral("a"));
        QVERIFY(first.ok());
        QVERIFY(!first->connections.idleTimeoutSeconds); // unset: the receiver's default
        QVERIFY(!first->toJson().contains(u"idle_timeout_seconds"_qs));
        auto second = Config::parse(QJsonDocument(first->toJson()).toJson(), QStringLiteral("b"));
        QVERIFY2(second.ok(), second.ok() ? "" : qPrintable(second.error().message));
        QCOMPARE(QJsonDocument(second->toJson()).toJson(), QJsonDocument(first->toJson()).toJson());
        QCOMPARE(second->endpoint(u"o")->settings.leaseSeconds, 7);
        QCOMPARE(second->endpoint(u"o")->secrets.size(), 2);
        QCOMPARE(second->endpoint(u"o")->simulate.failRate, 0.5);
        QCOMPARE(second->endpoint(u"f")->settings.inProgressStatus, 202);
        QCOMPARE(second->endpoint(u"sg")->settings.maxBatchElements, 50);
        QCOMPARE(second->endpoint(u"f")->settings.maxBatchElements, 5000);
        QCOMPARE(second->endpoint(u"gh")->key.composite, QStringList{QString()});
        QCOMPARE(second->metricsListen->toString(), u"127.0.0.1:9464"_qs);
        QVERIFY(!Config::builtin().metricsListen); // off by default
        QCOMPARE(second->listen.port, 9000);
    }

    void connectionSettingsRoundTrip()
    {
        const QByteArray json =
            "{\"max_connections_per_client\": 8, \"max_buffered_request_bytes\": 2097152, "
            "\"min_upload_bytes_per_second\": 0, \"idle_timeout_seconds\": 5, "
            "\"request_timeout_seconds\": 12}";
        auto first = Config::parse(json, QStringLiteral("a"));
        QVERIFY2(first.ok(), first.ok() ? "" : qPrintable(first.error().message));
        auto second = Config::parse(QJsonDocument(first->toJson()).toJson(), QStringLiteral("b"));
        QVERIFY(second.ok());
        const ConnectionSettings &c = second->connections;
        QCOMPARE(*c.maxConnectionsPerClient, 8);
        QCOMPARE(*c.maxBufferedRequestBytes, 2097152);
        QCOMPARE(*c.minUploadBytesPerSecond, 0); // set to 0: no minimum, not unset
        QCOMPARE(*c.idleTimeoutSeconds, 5);
        QCOMPARE(*c.requestTimeoutSeconds, 12);
    }

    void secretsInAReadableFileAreWarnedAbout()
    {
        QTemporaryDir dir;
        const QString path = dir.filePath(QStringLiteral("c.json"));
        QFile f(path);
        QVERIFY(f.open(QIODevice::WriteOnly));
        f.write("{\"max_connections\": 10, \"endpoints\": [{\"name\": \"s\", \"provider\": \"stripe\", \"secret\": \"whsec_x\"}]}");
        f.close();
        QFile::setPermissions(path, QFileDevice::ReadOwner | QFileDevice::WriteOwner | QFileDevice::ReadOther);
        auto open = Config::load(path);
        QVERIFY(open.ok());
        QCOMPARE(open->maxConnections, 10);
        QCOMPARE(open->loadWarnings.size(), 1);
        QVERIFY(open->loadWarnings.first().contains(QStringLiteral("chmod 600")));
        QFile::setPermissions(path, QFileDevice::ReadOwner | QFileDevice::WriteOwner);
        QVERIFY(Config::load(path)->loadWarnings.isEmpty());
    }

    void storeUrls()
    {
        auto sqlite = StoreUrl::parse(QStringLiteral("sqlite:/tmp/a.db"));
        QVERIFY(sqlite.ok());
        QCOMPARE(sqlite->path, QStringLiteral("/tmp/a.db"));
        auto redis = StoreUrl::parse(QStringLiteral("redis://u:secret@127.0.0.1:6380/2"));
        QVERIFY(redis.ok());
        QCOMPARE(redis->kind, StoreUrl::Kind::Redis);
        QCOMPARE(redis->port, 6380);
        QCOMPARE(redis->database, QStringLiteral("2"));
        QVERIFY(!redis->display().contains(u"secret"));
        auto pg = StoreUrl::parse(QStringLiteral("postgresql://idem:pw@localhost:5433/desk"));
        QVERIFY(pg.ok());
        QCOMPARE(pg->database, QStringLiteral("desk"));
        QVERIFY(!pg->display().contains(u"pw"));
        QVERIFY(!StoreUrl::parse(QStringLiteral("mysql://x")).ok());
        QVERIFY(!StoreUrl::parse(QStringLiteral("postgresql://localhost:5432")).ok());
        QVERIFY(StoreUrl::parse(QString()).ok()); // default: the user's data folder
        // A sqlite: URL naming no file (a template's variable unset) is an error, not the default.
        for (const char *empty : {"sqlite:", "sqlite://", "sqlite:?synchronous=full"}) {
            const auto parsed = StoreUrl::parse(QString::fromLatin1(empty));
            QVERIFY2(!parsed.ok() && parsed.error().message.contains(u"names no file"), empty);
        }
    }

    void aRedisPrefixWithABraceIsRefused()
    {
        for (const char *url : {"redis-cluster://h:1,h:2?prefix=x%7B%7D", "redis://h:1/0?prefix=a{b}:",
                                "redis://h:1/0?prefix=a}"}) {
            const auto parsed = StoreUrl::parse(QString::fromLatin1(url));
            QVERIFY2(!parsed.ok() && parsed.error().message.contains(u"prefix must not contain {"),
                     url);
        }
        QVERIFY(StoreUrl::parse(u"redis-cluster://h:1,h:2?prefix=desk-1:"_qs).ok());
    }

    void postgresTlsSettingsComeFromTheUrl()
    {
        auto pg = StoreUrl::parse(QStringLiteral("postgresql://idem:pw@db:5432/desk?sslmode=verify-full&sslrootcert=/etc/ca.pem"
                                                 "&sslcert=/etc/c.pem&sslkey=/etc/k.pem"));
        QVERIFY(pg.ok());
        const QList<QPair<QString, QString>> expected{{u"sslmode"_qs, u"verify-full"_qs}, {u"sslrootcert"_qs, u"/etc/ca.pem"_qs},
                                                      {u"sslcert"_qs, u"/etc/c.pem"_qs}, {u"sslkey"_qs, u"/etc/k.pem"_qs}};
        QCOMPARE(pg->postgresTls, expected);
        QVERIFY(pg->display().endsWith(u"/desk?sslmode=verify-full&sslrootcert=/etc/ca.pem&sslcert=/etc/c.pem&sslkey=/etc/k.pem"));
        auto bad = StoreUrl::parse(QStringLiteral("postgresql://idem:pw@db/desk?sslmode=sometimes"));
        QVERIFY(!bad.ok());
        QVERIFY2(bad.error().message.contains(u"sslmode must be one of"), qPrintable(bad.error().message));
        auto unknown = StoreUrl::parse(QStringLiteral("postgresql://idem:pw@db/desk?sslmod=require"));
        QVERIFY(!unknown.ok());
        QVERIFY2(unknown.error().message.contains(u"unknown parameter 'sslmod'"), qPrintable(unknown.error().message));
    }

    void storeUrlErrorsHideCredentials_data()
    {
        QTest::addColumn<QString>("url");
        QTest::newRow("unknown scheme") << QStringLiteral("mysql://root:hunter2@db/x");
        QTest::newRow("no database") << QStringLiteral("postgresql://idem:hunter2@db:5432");
        QTest::newRow("redis database") << QStringLiteral("redis://:hunter2@cache:6379/zero");
        QTest::newRow("bad sslmode") << QStringLiteral("postgresql://idem:hunter2@db/x?sslmode=bogus");
        QTest::newRow("password with a slash") << QStringLiteral("postgresql://idem:hun/ter2@db/x");
        QTest::newRow("password as a parameter")
            << QStringLiteral("postgresql://u@127.0.0.1:1/db?password=hunter2");
        QTest::newRow("redis password parameter")
            << QStringLiteral("redis://cache:6379/0?password=hunter2");
        QTest::newRow("redis bad option value")
            << QStringLiteral("redis://:hunter2@cache:6379/0?wait_replicas=x");
        QTest::newRow("cluster password parameter")
            << QStringLiteral("redis-cluster://a:1,b:2?password=hunter2");
        QTest::newRow("cluster bad node") << QStringLiteral("redis-cluster://:hunter2@a:1,b");
        QTest::newRow("sqlite option") << QStringLiteral("sqlite:/tmp/x.db?key=hunter2");
        QTest::newRow("no slashes") << QStringLiteral("postgresql:idem:hunter2@db/x");
        QTest::newRow("unknown scheme, no slashes") << QStringLiteral("mysql:root:hunter2@db");
        // A '?', '/' or '#' in the password, unencoded: it would cut the URL there.
        QTest::newRow("cluster ? in password")
            << QStringLiteral("redis-cluster://:hunter2?x@h1:7000,h2:7001");
        QTest::newRow("redis ? in password") << QStringLiteral("redis://:hunter2?x@cache:6379/0");
        QTest::newRow("postgres / in password") << QStringLiteral("postgresql://u:hunter2/x@db/x");
        QTest::newRow("postgres # in password") << QStringLiteral("postgresql://u:hun#ter2@db/x");
    }
    void storeUrlErrorsHideCredentials()
    {
        QFETCH(QString, url);
        auto parsed = StoreUrl::parse(url);
        QVERIFY(!parsed.ok());
        QVERIFY2(!parsed.error().message.contains(u"hunter2") && !parsed.error().message.contains(u"ter2"),
                 qPrintable(parsed.error().message));
        QVERIFY(parsed.error().message.contains(u"store URL"));
    }

    void displayUrlsWithoutUserInfo()
    {
        QCOMPARE(displayUrl(QUrl(u"http://user:pass@app.internal:3000/hooks?x=1"_qs)), u"http://app.internal:3000/hooks?x=1"_qs);
        QCOMPARE(displayUrl(QUrl(u"https://token@app/h"_qs)), u"https://app/h"_qs);
        QCOMPARE(displayUrl(QUrl(u"http://127.0.0.1:3000/h"_qs)), u"http://127.0.0.1:3000/h"_qs);
        QCOMPARE(displayUrl(u"redis://:secret@cache:6379/0"_qs), u"redis://cache:6379/0"_qs);
        QCOMPARE(displayUrl(u"sqlite:/var/lib/a@b.db"_qs), u"sqlite:/var/lib/a@b.db"_qs);
    }

    void urlPasswordsAsText()
    {
        // Found where displayUrl finds the user information; everything else kept as written.
        const QString cluster =
            u"redis-cluster://desk:s%40cret@10.0.0.1:7000,10.0.0.2:7000?prefix=a:"_qs;
        QCOMPARE(urlPassword(cluster), u"s%40cret"_qs);
        QCOMPARE(withUrlPassword(cluster, u"***"_qs),
                 u"redis-cluster://desk:***@10.0.0.1:7000,10.0.0.2:7000?prefix=a:"_qs);
        QCOMPARE(withUrlPassword(withUrlPassword(cluster, u"***"_qs), urlPassword(cluster)),
                 cluster);
        QCOMPARE(urlPassword(u"redis-cluster://:p@h:1,h:2"_qs), u"p"_qs);
        QVERIFY(urlPassword(u"redis-cluster://h:1,h:2"_qs).isNull());
        QVERIFY(urlPassword(u"postgresql://user@h/db"_qs).isNull()); // a user, no password
        QCOMPARE(urlPassword(u"http://u:@h/"_qs), u""_qs);
        // An '@' in a path is no user information.
        QVERIFY(urlPassword(u"sqlite:///var/lib/a:b@c.db"_qs).isNull());
        QCOMPARE(withUrlPassword(u"sqlite:///var/lib/a:b@c.db"_qs, u"***"_qs),
                 u"sqlite:///var/lib/a:b@c.db"_qs);
    }

    void controlCharactersAreEscaped()
    {
        QCOMPARE(escapeControls(u"a\nb\r\x1b[2J\tc\x7f"_qs), u"a\\u000ab\\u000d\\u001b[2J\tc\\u007f"_qs);
        QCOMPARE(escapeControls(u"a\nb\r"_qs, true), u"a\nb\\u000d"_qs);
        QCOMPARE(escapeControls(QString(QChar(0x9b)) + u"31m"_qs), u"\\u009b31m"_qs);       // C1 CSI
        QCOMPARE(escapeControls(QString(QChar(0x202e)) + u"txt.exe"_qs), u"\\u202etxt.exe"_qs); // bidi override
        QCOMPARE(escapeControls(u"caf\u00e9 \u2713 {\"k\":\"v\"}"_qs), u"caf\u00e9 \u2713 {\"k\":\"v\"}"_qs);
    }

    void secretHeadersAreMasked()
    {
        for (const char *name :
             {"Authorization", "Stripe-Signature", "X-Hub-Signature-256", "X-Shopify-Hmac-SHA256",
              "X-Twilio-Email-Event-Webhook-Signature", "webhook-secret", "X-Auth-TOKEN", "Cookie",
              "X-API-Key", "x-apikey", "AUTHORIZATION"})
            QVERIFY2(isSecretHeader(name), name);
        for (const char *name : {"Content-Type", "X-Request-Id", "tok", "", "Signatur", "Api_Key",
                                 "X-GitHub-Delivery"})
            QVERIFY2(!isSecretHeader(name), name);
        const HeaderList masked =
            maskSecrets({{"Content-Type", "application/json"}, {"Stripe-Signature", "t=1,v1=ab"}});
        QCOMPARE(masked.at(0).second, QByteArray("application/json"));
        QVERIFY(!masked.at(1).second.contains("v1=ab"));
    }

    void keyNormalisation()
    {
        QCOMPARE(*namespacedKey(QStringLiteral("ep"), QStringLiteral(" k1 ")), QStringLiteral("ep:k1"));
        QVERIFY(!namespacedKey(QStringLiteral("ep"), QStringLiteral("caf\u00e9")).ok());
        QVERIFY(!namespacedKey(QStringLiteral("ep"), QStringLiteral("a\tb")).ok());
        QVERIFY(!namespacedKey(QStringLiteral("ep"), QString(253, u'x')).ok());
        QVERIFY(namespacedKey(QStringLiteral("ep"), QString(252, u'x')).ok());
    }

    void jsonPointer()
    {
        const QJsonValue doc = QJsonDocument::fromJson("{\"a\": {\"b/c\": [1, {\"~d\": \"x\"}]}}").object();
        QCOMPARE(resolvePointer(doc, QStringLiteral("/a/b~1c/1/~0d"))->toString(), QStringLiteral("x"));
        QVERIFY(!resolvePointer(doc, QStringLiteral("/a/missing")));
        QVERIFY(!resolvePointer(doc, QStringLiteral("/a/b~1c/7")));
    }
};

QTEST_GUILESS_MAIN(TestConfig)
#include "tst_config.moc"
