// Hostile clients: each gets its documented answer or is closed, nothing is stored, and a
// normal client keeps being served meanwhile (its latency is printed beside the baseline).
#include "http/blockingclient.h"
#include "metrics/metrics.h"
#include "receiver/receiver.h"
#include "store/rediscluster.h"
#include "store/redisprotocol.h"
#include "store/storefactory.h"
#include "store/storeurl.h"
#include "support/downstream.h"
#include "support/serveprocess.h"
#include "util/clock.h"

#include <QElapsedTimer>
#include <QFile>
#include <QProcess>
#include <QRegularExpression>
#include <QScopeGuard>
#include <QTemporaryDir>
#include <QTest>
#include <QThread>

#include <arpa/inet.h>
#include <atomic>
#include <cerrno>
#include <fcntl.h>
#include <hiredis.h>
#include <netinet/in.h>
#include <poll.h>
#include <pqxx/pqxx>
#include <signal.h>
#include <sqlite3.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>

using namespace idem;

namespace {

constexpr qsizetype kBigAnswer = 900'000;

// A downstream whose every answer is 0.9 MB.
struct BigDownstream : idem::test::CountingDownstream
{
    BigDownstream() { setBody(QByteArray(kBigAnswer, 'x'), {{"Content-Type", "text/plain"}}); }
    QByteArray url() const { return idem::test::CountingDownstream::url().toString().toUtf8(); }
};

// A process's resident memory (this one's by default), in KB.
qint64 residentKb(qint64 pid = 0)
{
    QFile status(pid ? u"/proc/%1/status"_qs.arg(pid) : QStringLiteral("/proc/self/status"));
    if (!status.open(QIODevice::ReadOnly))
        return -1;
    for (const QByteArray &line : status.readAll().split('\n'))
        if (line.startsWith("VmRSS:"))
            return line.mid(6).trimmed().split(' ').first().toLongLong();
    return -1;
}

// A plain socket connected to 127.0.0.1:port, for clients that do what RawConnection will not
// (read nothing, send without blocking); -1 when it could not connect. `receiveBuffer`: its
// SO_RCVBUF, 0 for the system's.
int connectTo(quint16 port, int receiveBuffer = 0)
{
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (receiveBuffer > 0)
        ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &receiveBuffer, sizeof receiveBuffer);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) {
        ::close(fd);
        return -1;
    }
    return fd;
}

// Where a store's stored result of `key` is rewritten straight in the store, as a shared Redis or
// PostgreSQL may hold it whoever wrote it: the same status and body, these header fields.
QString rewriteStoredHeaders(const QString &backend, const QString &url, const QString &key,
                             const QByteArray &headersJsonText, const QByteArray &body)
{
    const QByteArray k = key.toUtf8();
    if (backend == u"sqlite"_qs) {
        sqlite3 *db = nullptr;
        sqlite3_stmt *update = nullptr;
        const QByteArray path = QFile::encodeName(url.mid(7)); // after "sqlite:"
        const bool ok =
            sqlite3_open(path.constData(), &db) == SQLITE_OK &&
            sqlite3_busy_timeout(db, 10'000) == SQLITE_OK &&
            sqlite3_prepare_v2(db, "UPDATE idem_keys SET res_headers = ?1 WHERE key = ?2", -1,
                               &update, nullptr) == SQLITE_OK &&
            sqlite3_bind_text(update, 1, headersJsonText.constData(), int(headersJsonText.size()),
                              SQLITE_STATIC) == SQLITE_OK &&
            sqlite3_bind_text(update, 2, k.constData(), int(k.size()), SQLITE_STATIC) ==
                SQLITE_OK &&
            sqlite3_step(update) == SQLITE_DONE && sqlite3_changes(db) == 1;
        sqlite3_finalize(update);
        sqlite3_close(db);
        return ok ? QString() : u"sqlite: the record was not rewritten"_qs;
    }
    if (backend == u"postgres"_qs) {
        try {
            pqxx::connection c(url.toStdString());
            pqxx::work w(c);
            const auto r = w.exec_params("UPDATE idem_keys SET res_headers = $1 WHERE key = $2",
                                         headersJsonText.toStdString(), k.toStdString());
            w.commit();
            return r.affected_rows() == 1 ? QString() : u"postgres: no such record"_qs;
        } catch (const std::exception &e) {
            return QString::fromUtf8(e.what());
        }
    }
    // Redis: the record's result field, "status\nheaders\nbody". On a cluster the record is in
    // the bucket the desk's cluster layout names, written through the desk's own slot routing.
    const StoreUrl parsed = *StoreUrl::parse(url);
    const bool cluster = backend == u"cluster"_qs;
    const QByteArray rk =
        redis::Layout(parsed.prefix.toUtf8(), cluster ? redis::Layout::kClusterBuckets : 1)
            .record(key);
    const QList<QByteArray> hset{"HSET", rk, "s", "200\n" + headersJsonText + '\n' + body};
    auto failed = [](const redisReply *reply) {
        return !reply || reply->type == REDIS_REPLY_ERROR
                   ? u"redis: "_qs + (reply ? QString::fromUtf8(reply->str) : u"no reply"_qs)
                   : QString();
    };
    if (cluster) {
        QList<redis::ClusterNode> seeds;
        for (const auto &[host, port] : parsed.clusterSeeds)
            seeds.append({host.toUtf8(), port});
        auto written = redis::ClusterLinks(seeds, 2000, 3000, {}).command(hset, true);
        return written ? failed(written->get()) : written.error().message;
    }
    redisContext *c = redisConnect(parsed.host.toUtf8().constData(), parsed.port);
    if (!c || c->err)
        return u"redis: cannot connect"_qs;
    const QByteArray db = parsed.database.isEmpty() ? QByteArray("0") : parsed.database.toUtf8();
    const QList<QByteArray> select{"SELECT", db};
    QString error;
    for (const QList<QByteArray> &command : {select, hset}) {
        redis::Argv argv(command);
        auto *reply = static_cast<redisReply *>(
            redisCommandArgv(c, argv.count(), argv.argv.data(), argv.lengths.data()));
        if (const QString e = failed(reply); !e.isEmpty())
            error = e;
        freeReplyObject(reply);
    }
    redisFree(c);
    return error;
}

// The header sections of the answers in `wire` (bytes read from one connection), each checked
// as a client would read it: a status line, then "token: value" lines. Empty when one is not.
QList<QByteArrayList> headerSections(const QByteArray &wire, QByteArray &why)
{
    QList<QByteArrayList> sections;
    qsizetype at = 0;
    while (at < wire.size()) {
        const qsizetype end = wire.indexOf("\r\n\r\n", at);
        if (end < 0) {
            why = "an unfinished header section: " + wire.mid(at);
            return {};
        }
        QByteArrayList lines = wire.mid(at, end - at).split('\n');
        if (!lines.first().startsWith("HTTP/1.1 ")) {
            why = "not a status line: " + lines.first();
            return {};
        }
        qint64 length = 0;
        for (QByteArray &line : lines) {
            if (line.endsWith('\r'))
                line.chop(1);
            if (line.contains('\r') || line.contains('\0')) {
                why = "a line holds CR or NUL: " + line;
                return {};
            }
        }
        for (const QByteArray &line : lines.mid(1)) {
            const qsizetype colon = line.indexOf(':');
            if (colon <= 0 || !isFieldName(line.left(colon))) {
                why = "not a field line: " + line;
                return {};
            }
            if (line.left(colon).compare("Content-Length", Qt::CaseInsensitive) == 0)
                length = line.mid(colon + 1).trimmed().toLongLong();
        }
        sections.append(lines);
        at = end + 4 + length;
    }
    return sections;
}

} // namespace

class TestHostile : public QObject
{
    Q_OBJECT
    QTemporaryDir m_dir;
    test::CountingDownstream m_relay;
    test::CountingDownstream m_held; // its gate closed: no answer
    BigDownstream m_big;
    std::shared_ptr<StorePool> m_pool;
    std::unique_ptr<Receiver> m_receiver;
    quint16 m_port = 0;
    int m_normalSeq = 0;

    qint64 storedKeys()
    {
        return m_pool->run<StateCounts>([](IdempotencyStore &s) { return s.countKeys({}); })->total();
    }
    std::optional<KeyRecord> stored(const QString &key)
    {
        return *m_pool->run<std::optional<KeyRecord>>([&](IdempotencyStore &s) { return s.key(key); });
    }
    qint64 replayed() const { return m_receiver->engine()->counters().byOutcome[size_t(Outcome::Replayed)]; }
    // Median latency (ms) of `n` normal deliveries, each with a new key; every one must be
    // processed (200).
    double normalLatency(int n, int &failures)
    {
        QList<double> ms;
        for (int i = 0; i < n; ++i) {
            QElapsedTimer t;
            t.start();
            const ClientResponse r = post(m_port, "/hooks/orders", "{\"n\":1}",
                                          {{"Idempotency-Key", "normal-" + QByteArray::number(++m_normalSeq)}});
            if (r.status != 200 || r.header("Idempotency-Outcome") != "processed") {
                qWarning("normal delivery got %d %s", r.status, qPrintable(r.error));
                ++failures;
            }
            ms << double(t.nsecsElapsed()) / 1e6;
        }
        std::sort(ms.begin(), ms.end());
        return ms.at(ms.size() / 2);
    }
    static ClientResponse get(quint16 port, const QByteArray &path)
    {
        return raw(port, "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    }
    static ClientResponse raw(quint16 port, const QByteArray &bytes)
    {
        RawConnection c(port, 5000);
        c.send(bytes);
        return c.readResponse();
    }

    // `serve` with the built-in config on SQLite store `name`.db, answering; port 0 when not.
    std::unique_ptr<QProcess> serveOnSqlite(const QString &name, quint16 &port)
    {
        auto serve = test::startServe(
            QStringLiteral(IDEMDESK_BIN),
            {u"--store"_qs, u"sqlite:"_qs + m_dir.filePath(name + u".db"_qs)}, port);
        if (port && get(port, "/healthz").status != 200)
            port = 0;
        return serve;
    }

    // `count` connections from `sources` (in turn), each sending all of a 1 MiB body but its
    // last byte, then nothing. Returns them open; `held` counts those the desk kept reading
    // (no answer within a moment), `refused` those it answered 429 or 503 and closed.
    static std::vector<std::unique_ptr<RawConnection>>
    halfSend(quint16 port, int count, const QByteArrayList &sources, int &held, int &refused)
    {
        constexpr qsizetype kBody = 1024 * 1024;
        const QByteArray rest(kBody - 1, 'x');
        std::vector<std::unique_ptr<RawConnection>> open;
        for (int i = 0; i < count; ++i) {
            auto c = std::make_unique<RawConnection>(port, 5000, "127.0.0.1",
                                                     sources.at(i % sources.size()));
            c->send("POST /hooks/generic HTTP/1.1\r\nHost: x\r\nIdempotency-Key: half-" +
                    QByteArray::number(i) + "\r\nContent-Length: " + QByteArray::number(kBody) +
                    "\r\n\r\n");
            c->send(rest); // fails once the desk refused it and closed
            open.push_back(std::move(c));
        }
        // Each looked at in turn until a round finds none newly closed: then the desk has
        // decided on every connection (a held one is never closed: no minimum rate, a long
        // request timeout). A refused one was answered, then closed.
        refused = 0;
        std::vector<RawConnection *> waiting;
        for (auto &c : open)
            waiting.push_back(c.get());
        for (bool decided = true; decided;) {
            decided = false;
            for (auto it = waiting.begin(); it != waiting.end();) {
                if (!(*it)->waitClosed(50)) {
                    ++it;
                    continue;
                }
                const int status = (*it)->readResponse().status;
                refused += status == 429 || status == 503;
                decided = true;
                it = waiting.erase(it);
            }
        }
        held = int(waiting.size());
        return open;
    }

private Q_SLOTS:
    void initTestCase()
    {
        rlimit limit;
        getrlimit(RLIMIT_NOFILE, &limit);
        limit.rlim_cur = limit.rlim_max;
        setrlimit(RLIMIT_NOFILE, &limit);
        const QByteArray relay = m_relay.url().toString().toUtf8();
        auto config = Config::parse("{\"endpoints\": [{\"name\": \"orders\", \"max_body_bytes\": 65536},"
                                    " {\"name\": \"byid\", \"key\": {\"json_pointer\": \"/id\"}},"
                                    " {\"name\": \"relay\", \"forward_to\": \"" + relay + "\"},"
                                    " {\"name\": \"big\", \"forward_to\": \"" + m_big.url() + "\"},"
                                    // Port 1: nothing listens, the delivery fails with 502.
                                    " {\"name\": \"creds\", \"forward_to\": \"http://deskuser:hunter2@127.0.0.1:1/hook\"},"
                                    // The app's API key in forward_to's query, the app down,
                                    // slow (held past the timeout), or answering too much.
                                    " {\"name\": \"qdown\", \"on_failed\": \"reject\", \"forward_to\": "
                                    "\"http://deskuser:hunter2@127.0.0.1:1/hook?api_key=SECRET123&v=2\"},"
                                    " {\"name\": \"qslow\", \"forward_timeout_seconds\": 1, \"lease_seconds\": 3,"
                                    " \"forward_to\": \"" + m_held.url().toString().toUtf8() + "?api_key=SECRET123\"},"
                                    " {\"name\": \"qbig\", \"on_failed\": \"reject\", \"max_response_bytes\": 1000,"
                                    " \"forward_to\": \"" + m_big.url() + "?api_key=SECRET123\"}]}",
                                    u"hostile"_qs);
        QVERIFY2(config.ok(), config.ok() ? "" : qPrintable(config.error().message));
        m_pool = *openStorePool(u"sqlite:"_qs + m_dir.filePath(u"h.db"_qs));
        HttpLimits limits;
        limits.requestTimeoutMs = 1500;
        limits.idleTimeoutMs = 60'000;
        m_receiver = std::make_unique<Receiver>(*config, m_pool, limits);
        ListenAddress any;
        any.port = 0;
        m_port = m_receiver->start(any)->port;
    }

    void answersToHostileRequests_data()
    {
        QTest::addColumn<QByteArray>("request");
        QTest::addColumn<int>("status");
        const QByteArray post = "POST /hooks/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: h1\r\n";
        QTest::newRow("huge header") << QByteArray(post + "X-Big: " + QByteArray(20000, 'a') + "\r\nContent-Length: 2\r\n\r\n{}") << 431;
        QByteArray many = post;
        for (int i = 0; i < 150; ++i)
            many += "X-H" + QByteArray::number(i) + ": v\r\n";
        QTest::newRow("numerous headers") << QByteArray(many + "Content-Length: 2\r\n\r\n{}") << 431;
        QTest::newRow("invalid bytes") << QByteArray("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11) << 400;
        QTest::newRow("two content-lengths") << QByteArray(post + "Content-Length: 2\r\nContent-Length: 30\r\n\r\n{}") << 400;
        QTest::newRow("content-length and chunked") << QByteArray(post + "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /healthz HTTP/1.1\r\n\r\n") << 400;
        QTest::newRow("chunked then identity") << QByteArray(post + "Transfer-Encoding: chunked, identity\r\n\r\n2\r\n{}\r\n0\r\n\r\n") << 400;
        QTest::newRow("space before colon") << QByteArray(post + "Content-Length : 2\r\n\r\n{}") << 400;
        QTest::newRow("oversized body") << QByteArray(post + "Content-Length: 1000000\r\n\r\n") << 413;
        QTest::newRow("not json for a pointer key") << QByteArray("POST /hooks/byid HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\nnot json!") << 400;
        QByteArray nested(5000, '[');
        nested += QByteArray(5000, ']');
        QTest::newRow("deeply nested json") << QByteArray("POST /hooks/byid HTTP/1.1\r\nHost: x\r\nContent-Length: " + QByteArray::number(nested.size()) + "\r\n\r\n" + nested) << 400;
        QTest::newRow("no key") << QByteArray("POST /hooks/orders HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}") << 400;
        QTest::newRow("path traversal") << QByteArray("POST /hooks/../hooks/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: t\r\nContent-Length: 2\r\n\r\n{}") << 404;
        // RFC 9112: obs-fold and a missing Host are 400, a coding nothing here decodes 501.
        QTest::newRow("obs-fold in the key") << QByteArray("POST /hooks/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: h1\r\n h2\r\nContent-Length: 2\r\n\r\n{}") << 400;
        QTest::newRow("obs-fold makes chunked") << QByteArray(post + "Transfer-Encoding:\r\n chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n") << 400;
        QTest::newRow("gzip, chunked") << QByteArray(post + "Transfer-Encoding: gzip, chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n") << 501;
        QTest::newRow("no host") << QByteArray("POST /hooks/orders HTTP/1.1\r\nIdempotency-Key: h1\r\nContent-Length: 2\r\n\r\n{}") << 400;
    }
    void answersToHostileRequests()
    {
        QFETCH(QByteArray, request);
        QFETCH(int, status);
        const qint64 before = storedKeys();
        const ClientResponse r = raw(m_port, request);
        QCOMPARE(r.status, status);
        QCOMPARE(r.header("Idempotency-Outcome"), QByteArray("rejected"));
        QCOMPARE(storedKeys(), before);
    }

    void trailersAreNeitherKeysNorHeaders()
    {
        // A trailer Idempotency-Key (with another trailer after it) used to become the key.
        const qint64 before = storedKeys();
        ClientResponse r = raw(m_port, "POST /hooks/orders HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                                       "2\r\n{}\r\n0\r\nIdempotency-Key: forged\r\nX-Pad: 1\r\n\r\n");
        QCOMPARE(r.status, 400);
        QCOMPARE(storedKeys(), before);
        // A trailer used to replace a header's value on its way downstream.
        const int relayed = m_relay.total();
        r = raw(m_port, "POST /hooks/relay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: trailer-1\r\nX-Forwarded-User: alice\r\n"
                        "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\nX-Forwarded-User: admin\r\nX-Pad: 1\r\n\r\n");
        QCOMPARE(r.status, 200);
        QCOMPARE(m_relay.total(), relayed + 1);
        const HttpRequest forwarded = m_relay.requests().last();
        QCOMPARE(forwarded.header("X-Forwarded-User"), QByteArray("alice"));
        QVERIFY(!forwarded.hasHeader("X-Pad"));
        const auto record = stored(u"relay:trailer-1"_qs);
        QVERIFY(record.has_value());
        QCOMPARE(headerValue(record->request.headers, "X-Forwarded-User"), QByteArray("alice"));
        QVERIFY(!headerValue(record->request.headers, "X-Pad").size());
    }

    void aHeaderSentTwiceIsReadOnce()
    {
        // The desk (key, signature, stored request) and the downstream read the same value: the
        // lines joined, as RFC 9110 §5.3 reads them. It used to be the first line here and the
        // last one downstream.
        const int relayed = m_relay.total();
        const ClientResponse r = raw(m_port, "POST /hooks/relay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: twice-a\r\n"
                                             "X-Forwarded-User: alice\r\nIdempotency-Key: twice-b\r\nX-Forwarded-User: admin\r\n"
                                             "Content-Length: 2\r\n\r\n{}");
        QCOMPARE(r.status, 200);
        QCOMPARE(r.header("Idempotency-Key"), QByteArray("relay:twice-a, twice-b"));
        QCOMPARE(m_relay.total(), relayed + 1);
        const HttpRequest forwarded = m_relay.requests().last();
        const auto record = stored(u"relay:twice-a, twice-b"_qs);
        QVERIFY(record.has_value());
        QCOMPARE(headerValue(record->request.headers, "X-Forwarded-User"), QByteArray("alice, admin"));
        QCOMPARE(forwarded.header("X-Forwarded-User"), QByteArray("alice, admin"));
        QCOMPARE(forwarded.header("Idempotency-Key"), QByteArray("relay:twice-a, twice-b"));
    }

    void credentialsInForwardToAreNotShown()
    {
        // forward_to carries a user and password; the app is down. Neither the (unauthenticated)
        // sender's answer, nor the stored error and result, nor the log line shows them.
        const ClientResponse r = post(m_port, "/hooks/creds", "{}", {{"Idempotency-Key", "c1"}});
        QCOMPARE(r.status, 502);
        QVERIFY2(!r.body.contains("hunter2") && !r.body.contains("deskuser"), r.body.constData());
        const auto record = stored(u"creds:c1"_qs);
        QVERIFY(record.has_value());
        QVERIFY2(record->error.contains(u"127.0.0.1:1/hook"_qs), qPrintable(record->error));
        QVERIFY2(!record->error.isEmpty() && !record->error.contains(u"hunter2") && !record->error.contains(u"deskuser"),
                 qPrintable(record->error));
        QVERIFY(!record->result.body.contains("hunter2"));
        DeliveryQuery query;
        query.key = u"creds:c1"_qs;
        auto logged = [&] { return *m_pool->run<QList<DeliveryEvent>>([&](IdempotencyStore &s) { return s.deliveries(query); }); };
        QTRY_COMPARE_WITH_TIMEOUT(logged().size(), 1, 10000);
        const QString detail = logged().first().detail;
        QVERIFY2(!detail.contains(u"hunter2") && !detail.contains(u"deskuser"), qPrintable(detail));
    }

    void aForwardedSecretNeverReachesTheSender_data()
    {
        QTest::addColumn<QByteArray>("endpoint");
        QTest::addColumn<int>("status");
        QTest::addColumn<QByteArray>("reason");
        QTest::newRow("unreachable") << QByteArray("qdown") << 502
                                     << QByteArray("the app at forward_to is unreachable "
                                                   "(connection refused)");
        QTest::newRow("timed out") << QByteArray("qslow") << 504
                                   << QByteArray("the app at forward_to did not answer within");
        QTest::newRow("too large") << QByteArray("qbig") << 502
                                   << QByteArray("the app at forward_to answered more than 1000 "
                                                 "bytes");
    }
    void aForwardedSecretNeverReachesTheSender()
    {
        // forward_to holds the app's API key in its query. The sender's answer (stored, and
        // replayed to every duplicate) says what went wrong without the URL; the operator's error,
        // history and delivery log name it with the query's values masked.
        QFETCH(QByteArray, endpoint);
        QFETCH(int, status);
        QFETCH(QByteArray, reason);
        m_held.closeGate();
        auto reopen = qScopeGuard([&] { m_held.openGate(); });
        const QString key = QString::fromLatin1(endpoint) + u":s1"_qs;
        const auto leaks = [](const QByteArray &text) {
            return text.contains("SECRET123") || text.contains("hunter2") ||
                   text.contains("api_key") || text.contains("127.0.0.1");
        };
        const ClientResponse first = post(m_port, "/hooks/" + endpoint, "{}", {{"Idempotency-Key", "s1"}});
        QCOMPARE(first.status, status);
        QVERIFY2(first.body.contains(reason) && !leaks(first.body), first.body.constData());
        const auto record = stored(key);
        QVERIFY(record.has_value());
        QVERIFY2(!leaks(record->result.body), record->result.body.constData());
        // (A timed-out run is not finished: its error is the log's alone.)
        QVERIFY2((status == 504 || record->error.contains(u"?api_key=***"_qs)) &&
                     !record->error.contains(u"SECRET123"_qs) &&
                     !record->error.contains(u"hunter2"_qs),
                 qPrintable(record->error));
        for (const HistoryEntry &h : record->history)
            QVERIFY2(!h.detail.contains(u"SECRET123"_qs), qPrintable(h.detail));
        // A duplicate: the stored failure replayed (on_failed: reject), or "in progress" while
        // the timed-out run's lease lasts.
        const ClientResponse again = post(m_port, "/hooks/" + endpoint, "{}", {{"Idempotency-Key", "s1"}});
        QVERIFY2(!leaks(again.body), again.body.constData());
        if (status == 502)
            QCOMPARE(again.body, first.body);
        DeliveryQuery query;
        query.key = key;
        auto logged = [&] { return *m_pool->run<QList<DeliveryEvent>>([&](IdempotencyStore &s) { return s.deliveries(query); }); };
        QTRY_COMPARE_WITH_TIMEOUT(logged().size(), 2, 10000);
        QString details;
        for (const DeliveryEvent &e : logged())
            details += e.detail + u'\n';
        QVERIFY2(details.contains(u"?api_key=***"_qs) && !details.contains(u"SECRET123"_qs) &&
                     !details.contains(u"hunter2"_qs),
                 qPrintable(details));
    }

    void aClientThatDoesNotReadIsNotBuffered()
    {
        // A key whose stored answer is 0.9 MB, then 300 pipelined replays of it from a client
        // that reads none: the desk must not hold 300 answers for it (it held 270 MB), but stop
        // reading that connection until the client takes them.
        QCOMPARE(post(m_port, "/hooks/big", "{}", {{"Idempotency-Key", "big-1"}}).body.size(), kBigAnswer);
        const qint64 warmUpFrom = replayed();
        for (int i = 0; i < 3; ++i) // the replay path's own buffers, before measuring
            QCOMPARE(post(m_port, "/hooks/big", "{}", {{"Idempotency-Key", "big-1"}}).body.size(), kBigAnswer);
        // Counted after their answers are handed over: the last may not be yet (it was read
        // into replayedBefore late, and the burst below counted 301).
        QTRY_COMPARE_WITH_TIMEOUT(replayed() - warmUpFrom, 3, 5000);
        const qint64 residentBefore = residentKb();
        const qint64 replayedBefore = replayed();
        RawConnection client(m_port, 30000);
        QByteArray burst;
        for (int i = 0; i < 300; ++i)
            burst += buildPost("/hooks/big", "{}", {{"Idempotency-Key", "big-1"}}, false);
        QVERIFY(client.send(burst)); // 40 KB: the socket buffers take it all
        // The desk answers what the bound and the kernel's socket buffers take, then waits; were
        // it unbounded, it would answer all 300. Wait until its count of replays stands still
        // (half a second without change) or reaches 300; either way it is then measured.
        qint64 last = -1;
        for (int still = 0; still < 10 && last - replayedBefore < 300;) {
            QTest::qWait(50);
            const qint64 now = replayed();
            still = now == last ? still + 1 : 0;
            last = now;
        }
        const qint64 answered = last - replayedBefore;
        const qint64 heldKb = residentKb() - residentBefore;
        qInfo("a client reading nothing: %lld of 300 replays answered, %lld KB more resident memory",
              static_cast<long long>(answered), static_cast<long long>(heldKb));
        QVERIFY2(answered < 300, "every answer was produced for a client that reads none");
        QVERIFY2(heldKb < 16 * 1024, qPrintable(u"%1 KB held for a client that reads nothing"_qs.arg(heldKb)));
        // Once it reads, it gets every answer, in order: the connection resumes as it drains.
        for (int i = 0; i < 300; ++i) {
            const ClientResponse r = client.readResponse();
            QCOMPARE(r.status, 200);
            QCOMPARE(r.body.size(), kBigAnswer);
            QCOMPARE(r.header("Idempotent-Replayed"), QByteArray("true"));
        }
        // The engine counts a replay once its answer is handed over, which can be just after
        // the client has read it.
        QTRY_COMPARE_WITH_TIMEOUT(replayed() - replayedBefore, 300, 5000);
        QVERIFY2(residentKb() - residentBefore < 16 * 1024, "memory grew while the client read its answers");
    }

    void aConnectionPipeliningFasterThanItIsAnsweredHoldsOneRead()
    {
        // Issue 31 (F2) on a real `serve`: one connection sends 32 MiB of pipelined requests and
        // reads its answers as they come. The desk parses what it has read before it reads more,
        // so the rest waits in the kernel; it held every byte as it arrived (and copied what it
        // held again for each request it answered: RSS +50 MB and growing, a core busy).
        quint16 port = 0;
        auto serve = serveOnSqlite(u"pipeline"_qs, port);
        QVERIFY(port);
        const QByteArray request =
            "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + QByteArray(4000, 'p') + "\r\n\r\n";
        constexpr int kRequests = 8192;
        const QByteArray burst = request.repeated(kRequests);
        const qint64 before = residentKb(serve->processId());
        const int fd = connectTo(port);
        QVERIFY(fd >= 0);
        std::atomic<int> answers{0};
        std::atomic<bool> sent{false};
        std::thread reader([&] {
            QByteArray carry;
            char buffer[65536];
            for (;;) {
                const ssize_t got = ::recv(fd, buffer, sizeof buffer, 0);
                if (got <= 0)
                    break;
                carry += QByteArrayView(buffer, got);
                answers += int(carry.count("HTTP/1.1 200 "));
                carry = carry.right(12); // an answer's first line cut between two reads
            }
        });
        std::thread sender([&] {
            for (qsizetype at = 0; at < burst.size();) {
                const ssize_t n =
                    ::send(fd, burst.constData() + at, size_t(burst.size() - at), MSG_NOSIGNAL);
                if (n <= 0)
                    break;
                at += n;
            }
            sent = true;
        });
        auto stop = qScopeGuard([&] {
            ::shutdown(fd, SHUT_RDWR);
            sender.join();
            reader.join();
            ::close(fd);
        });
        qint64 peakKb = 0;
        double healthzMs = -1;
        QElapsedTimer elapsed;
        elapsed.start();
        while (!(sent && answers == kRequests) && elapsed.elapsed() < 120'000) {
            peakKb = std::max(peakKb, residentKb(serve->processId()) - before);
            if (peakKb > 8 * 1024)
                break;
            if (healthzMs < 0 && answers > kRequests / 2) { // another client, meanwhile
                QElapsedTimer t;
                t.start();
                QCOMPARE(get(port, "/healthz").status, 200);
                healthzMs = double(t.nsecsElapsed()) / 1e6;
            }
            QTest::qWait(20);
        }
        qInfo("one connection pipelining %d requests (%lld MiB) while reading: %d answered in "
              "%lld ms, serve's resident memory %lld KB before, at most %lld KB more; another "
              "client's /healthz meanwhile %.1f ms",
              kRequests, qint64(burst.size() >> 20), answers.load(), elapsed.elapsed(), before,
              peakKb, healthzMs);
        QVERIFY2(peakKb <= 8 * 1024, qPrintable(u"%1 KB more"_qs.arg(peakKb)));
        QCOMPARE(answers.load(), kRequests);
        serve->terminate();
        QVERIFY(serve->waitForFinished(10000));
    }

    void aClientTakingItsAnswersSteadilyKeepsItsConnection()
    {
        // A client pipelining requests whose 404 answers carry their 15 KB path back, and taking
        // them at ~20 KB/s, twenty times the minimum: the kernel's megabytes of send buffer
        // report room only once much of it is gone, so a pace counted from what the socket
        // wrote saw nothing for a whole idle time and dropped it. What counts is what the client
        // acknowledged.
        quint16 port = 0;
        const QString config = m_dir.filePath(u"drain.json"_qs);
        {
            QFile f(config);
            QVERIFY(f.open(QIODevice::WriteOnly));
            f.write("{\"store\": \"sqlite:" + m_dir.filePath(u"drain.db"_qs).toUtf8() +
                    "\", \"idle_timeout_seconds\": 8}");
        }
        auto serve = test::startServe(QStringLiteral(IDEMDESK_BIN), {u"--config"_qs, config}, port);
        QVERIFY(port);
        const int fd = connectTo(port);
        QVERIFY(fd >= 0);
        auto closeIt = qScopeGuard([&] { ::close(fd); });
        ::fcntl(fd, F_SETFL, O_NONBLOCK);
        const QByteArray request =
            "GET /hooks/" + QByteArray(15000, 'a') + " HTTP/1.1\r\nHost: x\r\n\r\n";
        qint64 got = 0;
        QElapsedTimer elapsed;
        elapsed.start();
        while (elapsed.elapsed() < 30'000) { // more than three idle times
            for (int i = 0; i < 50; ++i)
                if (::send(fd, request.constData(), size_t(request.size()), MSG_NOSIGNAL) <= 0)
                    break;
            char chunk[1000];
            const ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
            QVERIFY2(n != 0 && (n > 0 || errno == EAGAIN || errno == EWOULDBLOCK),
                     qPrintable(u"closed after %1 ms, %2 KB taken"_qs.arg(elapsed.elapsed())
                                    .arg(got >> 10)));
            got += std::max<ssize_t>(0, n);
            QThread::msleep(50); // 1000 bytes each 50 ms
        }
        qInfo("a client taking its answers at %lld B/s for %lld ms: still open", got * 1000 /
              elapsed.elapsed(), elapsed.elapsed());
        serve->terminate();
        QVERIFY(serve->waitForFinished(10000));
    }

    void connectionsThatNeverReadTheirAnswersHoldABoundedShare()
    {
        // The review's 64 connections of one client, each pipelining requests whose 404 answers
        // carry their 15 KB path back, reading none (their receive buffers small): the desk
        // held 1 MiB of answers for each and every request byte it read (RSS +330 MB).
        quint16 port = 0;
        auto serve = serveOnSqlite(u"unread"_qs, port);
        QVERIFY(port);
        const qint64 before = residentKb(serve->processId());
        const QByteArray eight =
            ("GET /hooks/" + QByteArray(15000, 'a') + " HTTP/1.1\r\nHost: x\r\n\r\n").repeated(8);
        std::vector<int> fds;
        auto closeAll = qScopeGuard([&] {
            for (const int fd : fds)
                ::close(fd);
        });
        for (int i = 0; i < 64; ++i) {
            fds.push_back(connectTo(port, 4096));
            QVERIFY(fds.back() >= 0);
            ::fcntl(fds.back(), F_SETFL, O_NONBLOCK);
        }
        // Sent until no connection takes more for 2 s (the desk reads none of them any more).
        qint64 sent = 0;
        QElapsedTimer elapsed;
        elapsed.start();
        std::vector<pollfd> polls;
        for (const int fd : fds)
            polls.push_back({fd, POLLOUT, 0});
        while (elapsed.elapsed() < 60'000 && ::poll(polls.data(), polls.size(), 2000) > 0) {
            for (pollfd &p : polls) {
                if (p.revents & (POLLERR | POLLHUP))
                    p.fd = -1;
                else if (p.revents & POLLOUT)
                    sent += std::max<ssize_t>(
                        0, ::send(p.fd, eight.constData(), size_t(eight.size()), MSG_NOSIGNAL));
            }
        }
        const qint64 grownKb = residentKb(serve->processId()) - before;
        qInfo("64 connections sending %lld MiB of requests, reading no answer: serve's resident "
              "memory %lld KB before, %lld KB more",
              sent >> 20, before, grownKb);
        QVERIFY2(grownKb < 32 * 1024, qPrintable(u"%1 KB more"_qs.arg(grownKb)));
        QCOMPARE(raw(port, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").status,
                 200);
        serve->terminate();
        QVERIFY(serve->waitForFinished(10000));
    }

    void senderThatDisconnectsMidBody()
    {
        const qint64 before = storedKeys();
        for (int i = 0; i < 20; ++i) {
            RawConnection c(m_port);
            c.send("POST /hooks/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: cut-" + QByteArray::number(i)
                   + "\r\nContent-Length: 1000\r\n\r\n{\"half\":");
            c.close();
        }
        // Every cut connection is gone from the desk: nothing of theirs was stored meanwhile.
        QTRY_COMPARE_WITH_TIMEOUT(m_receiver->connectionCount(), 0, 10000);
        QCOMPARE(storedKeys(), before);
        QCOMPARE(post(m_port, "/hooks/orders", "{}", {{"Idempotency-Key", "after-cut"}}).status, 200);
        QVERIFY(stored(u"orders:after-cut"_qs).has_value());
        for (int i = 0; i < 20; ++i)
            QVERIFY(!stored(u"orders:cut-%1"_qs.arg(i)).has_value());
    }

    void normalClientIsServedDuringAnAttack()
    {
        const qint64 storedBefore = storedKeys();
        int failures = 0;
        const double baseline = normalLatency(200, failures);

        // Thousands of idle keep-alive connections (from 10 clients: each may have 256),
        // slowloris senders, and garbage, all at once.
        std::vector<std::unique_ptr<RawConnection>> idle;
        for (int i = 0; i < 2000; ++i) {
            idle.push_back(std::make_unique<RawConnection>(
                m_port, 2000, "127.0.0.1", "127.0.0." + QByteArray::number(2 + i % 10)));
            QVERIFY(idle.back()->isOpen());
        }
        std::atomic<bool> stop{false};
        std::atomic<int> slowAnswered408{0};
        std::atomic<int> garbageAnswered{0};
        std::vector<std::thread> attackers;
        for (int t = 0; t < 4; ++t) {
            attackers.emplace_back([&] { // slowloris: a header byte now and then, never finishing
                while (!stop) {
                    RawConnection c(m_port, 3000);
                    c.send("POST /hooks/orders HTTP/1.1\r\n");
                    for (int i = 0; i < 40 && !stop; ++i) {
                        if (!c.send("X"))
                            break;
                        QThread::msleep(50);
                    }
                    if (c.readResponse().status == 408)
                        ++slowAnswered408;
                }
            });
        }
        attackers.emplace_back([&] { // garbage and smuggling attempts as fast as they are answered
            while (!stop) {
                garbageAnswered += raw(m_port, "POST /hooks/orders HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxx").status == 400;
                garbageAnswered += raw(m_port, QByteArray("\x00\xff\xfe garbage\r\n\r\n", 14)).status == 400;
            }
        });
        // The attack is under way (garbage answered, a slow sender cut) before measuring.
        QTRY_VERIFY_WITH_TIMEOUT(garbageAnswered.load() >= 20, 10000);
        const double underAttack = normalLatency(200, failures);
        QTRY_VERIFY_WITH_TIMEOUT(slowAnswered408.load() > 0, 10000); // slow senders get 408 and are closed
        stop = true;
        for (auto &t : attackers)
            t.join();
        qInfo("normal client median latency: %.2f ms alone, %.2f ms during the attack (%.1fx) with %d idle connections open",
              baseline, underAttack, underAttack / baseline, int(idle.size()));
        QCOMPARE(failures, 0);
        // The store holds the normal deliveries, and nothing else.
        QCOMPARE(storedKeys(), storedBefore + 400);
        QVERIFY(stored(u"orders:normal-%1"_qs.arg(m_normalSeq)).has_value());
        // The idle connections are still usable: keep-alive, not dropped by the attack.
        QCOMPARE(idle.front()->send(buildPost("/hooks/orders", "{}", {{"Idempotency-Key", "idle-0"}}, false)), true);
        QCOMPARE(idle.front()->readResponse().status, 200);
    }

    void aStoredResultCannotSplitTheAnswer_data()
    {
        QTest::addColumn<QString>("backend");
        QTest::newRow("sqlite") << u"sqlite"_qs;
        QTest::newRow("redis") << u"redis"_qs;
        QTest::newRow("cluster") << u"cluster"_qs;
        QTest::newRow("postgres") << u"postgres"_qs;
    }
    void aStoredResultCannotSplitTheAnswer()
    {
        // A completed record whose stored result was then rewritten in the store itself (a
        // shared Redis or PostgreSQL holds whatever anyone wrote) with fields that would end the
        // answer early: a Set-Cookie and a second answer of the attacker's on the connection.
        QFETCH(QString, backend);
        const char *variable = backend == u"redis"_qs     ? "IDEM_TEST_REDIS_URL"
                               : backend == u"cluster"_qs ? "IDEM_TEST_REDIS_CLUSTER_URL"
                                                          : "IDEM_TEST_POSTGRES_URL";
        const QString url = backend == u"sqlite"_qs
                                ? u"sqlite:"_qs + m_dir.filePath(u"split.db"_qs)
                                : qEnvironmentVariable(variable);
        if (url.isEmpty())
            QFAIL(qPrintable(QString::fromLatin1(variable) +
                             u" is not set: run through ./dev test"_qs));
        auto pool = openStorePool(url);
        QVERIFY2(pool.ok(), pool.ok() ? "" : qPrintable(pool.error().message));
        auto config = Config::parse(R"({"endpoints": [{"name": "split"}]})", u"split"_qs);
        Receiver receiver(*config, *pool);
        ListenAddress any;
        any.port = 0;
        const quint16 port = receiver.start(any)->port;
        const QByteArray key = "split-" + QByteArray::number(wallMs());
        const QByteArray body = "{\"n\":1}";
        const ClientResponse first = post(port, "/hooks/split", body, {{"Idempotency-Key", key}});
        QCOMPARE(first.status, 200);
        const QByteArray evil =
            R"([["Content-Type","application/json"],["X-Fine","ok"],)"
            R"(["X-Evil","a\r\nSet-Cookie: session=attacker\r\n\r\nHTTP/1.1 200 OK\r\nX-Owned: 1"],)"
            R"(["X-Nul","a\u0000b"],["Bad Name","x"],["","nameless"]])";
        const QString key16 = u"split:"_qs + QString::fromLatin1(key);
        const QString rewritten = rewriteStoredHeaders(backend, url, key16, evil, first.body);
        QVERIFY2(rewritten.isEmpty(), qPrintable(rewritten));

        // The replay and a second request on one connection, read as bytes off the wire.
        RawConnection c(port, 5000);
        QVERIFY(c.send(buildPost("/hooks/split", body, {{"Idempotency-Key", key}}, false) +
                       "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
        const QByteArray wire = c.readBytes(1 << 20); // up to the close
        QByteArray why;
        const QList<QByteArrayList> answers = headerSections(wire, why);
        QVERIFY2(!answers.isEmpty(), (why + "\n" + wire).constData());
        QCOMPARE(answers.size(), 2); // the replay and /healthz: nothing of the attacker's
        QVERIFY2(!wire.contains("Set-Cookie") && !wire.contains("X-Owned") &&
                     !wire.contains("nameless"),
                 wire.constData());
        QVERIFY2(answers.first().contains("Idempotent-Replayed: true"), wire.constData());
        QVERIFY2(answers.first().contains("X-Fine: ok"), wire.constData()); // valid ones stay
        QVERIFY2(wire.contains(first.body), wire.constData());

        // Read from the store, the record has the valid fields only (`keys show`, export).
        const auto record = *(*pool)->run<std::optional<KeyRecord>>(
            [&](IdempotencyStore &s) { return s.key(key16); });
        QVERIFY(record.has_value());
        QCOMPARE(headerValue(record->result.headers, "X-Fine"), QByteArray("ok"));
        QCOMPARE(record->result.headers.size(), 2);
    }

    void halfSentBodiesFromOneClientHoldOnlyItsShare()
    {
        // The attack of issue 31 (B5) on a real `serve`: 400 connections from one client, each
        // sending all but the last byte of a 1 MiB body, then nothing. Slow senders are not cut
        // here (no minimum rate, a long request timeout): the budget alone bounds the memory.
        const QString config = m_dir.filePath(u"halfsent.json"_qs);
        QFile f(config);
        QVERIFY(f.open(QIODevice::WriteOnly));
        f.write(R"({"min_upload_bytes_per_second": 0, "request_timeout_seconds": 600})");
        f.close();
        quint16 port = 0;
        auto serve = test::startServe(QStringLiteral(IDEMDESK_BIN),
                                      {u"--config"_qs, config, u"--store"_qs,
                                       u"sqlite:"_qs + m_dir.filePath(u"halfsent.db"_qs)},
                                      port);
        QVERIFY(port);
        QCOMPARE(post(port, "/hooks/generic", "{}", {{"Idempotency-Key", "warm"}}).status, 200);
        const qint64 before = residentKb(serve->processId());
        int held = 0, refused429 = 0;
        const auto attackers = halfSend(port, 400, {"127.0.0.2"}, held, refused429);
        const qint64 grownKb = residentKb(serve->processId()) - before;
        qInfo("one client, 400 half-sent 1 MiB bodies: %d held, %d refused 429; serve's "
              "resident memory %lld KB before, %lld KB more during the attack",
              held, refused429, qint64(before), qint64(grownKb));
        QVERIFY2(held <= 16 && refused429 >= 400 - 16, "one client held more than its share");
        // Its share (16 MiB) and the connections' own memory; it took 500 MB and more before.
        QVERIFY2(grownKb < 40 * 1024, qPrintable(u"%1 KB more"_qs.arg(grownKb)));
        // Everyone else is served meanwhile.
        QCOMPARE(get(port, "/healthz").status, 200);
        const ClientResponse normal =
            post(port, "/hooks/generic", "{}", {{"Idempotency-Key", "n1"}});
        QCOMPARE(normal.status, 200);
        QCOMPARE(normal.header("Idempotency-Outcome"), QByteArray("processed"));
        serve->terminate();
        QVERIFY(serve->waitForFinished(10000));
    }

    void halfSentBodiesFromManyClientsStayWithinTheBudget()
    {
        // The same from 8 clients: together they could hold 8 × 16 MiB, the budget is 64 MiB:
        // past it every client gets 503 and the connection is closed.
        const QString config = m_dir.filePath(u"halfsent8.json"_qs);
        QFile f(config);
        QVERIFY(f.open(QIODevice::WriteOnly));
        f.write(R"({"min_upload_bytes_per_second": 0, "request_timeout_seconds": 600})");
        f.close();
        quint16 port = 0;
        auto serve = test::startServe(QStringLiteral(IDEMDESK_BIN),
                                      {u"--config"_qs, config, u"--store"_qs,
                                       u"sqlite:"_qs + m_dir.filePath(u"halfsent8.db"_qs)},
                                      port);
        QVERIFY(port);
        QCOMPARE(post(port, "/hooks/generic", "{}", {{"Idempotency-Key", "warm"}}).status, 200);
        const qint64 before = residentKb(serve->processId());
        QByteArrayList sources;
        for (int i = 2; i < 10; ++i)
            sources << "127.0.0." + QByteArray::number(i);
        int held = 0, refused = 0;
        auto attackers = halfSend(port, 400, sources, held, refused);
        const qint64 grownKb = residentKb(serve->processId()) - before;
        qInfo("8 clients, 400 half-sent 1 MiB bodies: %d held, %d refused; serve's resident "
              "memory %lld KB before, %lld KB more during the attack",
              held, refused, qint64(before), qint64(grownKb));
        QVERIFY2(held <= 64, "more bodies held than the budget holds");
        QVERIFY2(grownKb < 96 * 1024, qPrintable(u"%1 KB more"_qs.arg(grownKb)));
        QCOMPARE(get(port, "/healthz").status, 200); // no body: never refused for the budget
        // A delivery gets through, or is told to come back (503, Retry-After), never hangs;
        // once the attackers are gone it gets through.
        const ClientResponse during =
            post(port, "/hooks/generic", "{}", {{"Idempotency-Key", "m1"}});
        QVERIFY2(during.status == 200 ||
                     (during.status == 503 && during.header("Retry-After") == "1"),
                 qPrintable(QString::number(during.status)));
        attackers.clear();
        QTRY_COMPARE_WITH_TIMEOUT(
            post(port, "/hooks/generic", "{}", {{"Idempotency-Key", "m2"}}).status, 200, 10000);
        serve->terminate();
        QVERIFY(serve->waitForFinished(10000));
    }

    void aFullBufferAnswers503AndAClientPastItsShare429()
    {
        // A budget of two bodies; one client's share is one body.
        auto config = Config::parse(R"({"max_buffered_request_bytes": 131072,
            "defaults": {"max_body_bytes": 65536}, "endpoints": [{"name": "orders"}]})",
                                    u"budget"_qs);
        QVERIFY2(config.ok(), config.ok() ? "" : qPrintable(config.error().message));
        Receiver small(*config, m_pool);
        ListenAddress any;
        any.port = 0;
        const quint16 port = small.start(any)->port;
        const QByteArray almost = "POST /hooks/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: b\r\n"
                                  "Content-Length: 65536\r\n\r\n" +
                                  QByteArray(65535, 'x');
        RawConnection a1(port, 5000, "127.0.0.1", "127.0.0.2");
        QVERIFY(a1.send(almost));
        QTRY_COMPARE(small.bufferedBytes(), 65536);
        // The same client again: over its own share.
        RawConnection a2(port, 5000, "127.0.0.1", "127.0.0.2");
        QVERIFY(a2.send(buildPost("/hooks/orders", "{}", {{"Idempotency-Key", "a2"}}, false)));
        ClientResponse r = a2.readResponse();
        QCOMPARE(r.status, 429);
        QCOMPARE(r.header("Retry-After"), QByteArray("1"));
        QCOMPARE(r.header("Idempotency-Outcome"), QByteArray("rejected"));
        QVERIFY(a2.waitClosed(5000));
        // Another client takes the rest: the receiver is full for everyone.
        RawConnection b1(port, 5000, "127.0.0.1", "127.0.0.3");
        QVERIFY(b1.send(almost));
        QTRY_COMPARE(small.bufferedBytes(), 131072);
        r = post(port, "/hooks/orders", "{}", {{"Idempotency-Key", "full"}});
        QCOMPARE(r.status, 503);
        QCOMPARE(r.header("Retry-After"), QByteArray("1"));
        QCOMPARE(get(port, "/healthz").status, 200); // no body, nothing to buffer
        // What a gone sender held is given back.
        a1.close();
        QTRY_COMPARE(small.bufferedBytes(), 65536);
        r = post(port, "/hooks/orders", "{}", {{"Idempotency-Key", "room"}});
        QCOMPARE(r.status, 200);
        // A whole body is held until its answer is written, then given back.
        QVERIFY(b1.send("x"));
        QCOMPARE(b1.readResponse().status, 200);
        QTRY_COMPARE(small.bufferedBytes(), 0);
    }

    void aClientPastItsConnectionCapGets429()
    {
        auto config = Config::parse(R"({"max_connections_per_client": 3,
            "endpoints": [{"name": "orders"}]})",
                                    u"cap"_qs);
        Receiver small(*config, m_pool);
        ListenAddress any;
        any.port = 0;
        const quint16 port = small.start(any)->port;
        std::vector<std::unique_ptr<RawConnection>> open;
        for (int i = 0; i < 3; ++i)
            open.push_back(std::make_unique<RawConnection>(port, 5000, "127.0.0.1", "127.0.0.2"));
        QTRY_COMPARE(small.connectionCount(), 3);
        RawConnection extra(port, 5000, "127.0.0.1", "127.0.0.2");
        const ClientResponse r = extra.readResponse();
        QCOMPARE(r.status, 429);
        QCOMPARE(r.header("Retry-After"), QByteArray("1"));
        QVERIFY(extra.waitClosed(5000));
        // Another client is not affected; and a closed connection makes room.
        QCOMPARE(post(port, "/hooks/orders", "{}", {{"Idempotency-Key", "cap-other"}}).status, 200);
        open.pop_back();
        QTRY_COMPARE(small.connectionCount(), 2);
        RawConnection again(port, 5000, "127.0.0.1", "127.0.0.2");
        QVERIFY(
            again.send(buildPost("/hooks/orders", "{}", {{"Idempotency-Key", "cap-2"}}, false)));
        QCOMPARE(again.readResponse().status, 200);
    }

    void aRequestSlowerThanTheMinimumRateIsCut()
    {
        auto config = Config::parse(R"({"endpoints": [{"name": "orders"}]})", u"pace"_qs);
        HttpLimits limits;
        limits.minUploadBytesPerSecond = 1000;
        limits.uploadWindowMs = 1000;
        limits.requestTimeoutMs = 120'000; // the pace cuts it, not the request's deadline
        Receiver paced(*config, m_pool, limits);
        ListenAddress any;
        any.port = 0;
        const quint16 port = paced.start(any)->port;
        // Half a body sent at once, then nothing: cut after a window without its due.
        RawConnection stalled(port, 10'000);
        QElapsedTimer took;
        took.start();
        QVERIFY(stalled.send("POST /hooks/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: slow\r\n"
                             "Content-Length: 20000\r\n\r\n" +
                             QByteArray(10000, 'x')));
        const ClientResponse cut = stalled.readResponse();
        QCOMPARE(cut.status, 408);
        QVERIFY2(cut.body.contains("slower than 1000 bytes per second"), cut.body.constData());
        QVERIFY(took.elapsed() < 60'000);
        QVERIFY(!stored(u"orders:slow"_qs).has_value());
        // A body trickled at ten times the minimum arrives whole.
        RawConnection trickle(port, 10'000);
        const QByteArray body = "{\"pad\":\"" + QByteArray(9980, 'y') + "\"}";
        QVERIFY(
            trickle.send("POST /hooks/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: trickle\r\n"
                         "Content-Type: application/json\r\nContent-Length: " +
                         QByteArray::number(body.size()) + "\r\n\r\n"));
        for (qsizetype at = 0; at < body.size(); at += 500) {
            QVERIFY(trickle.send(body.mid(at, 500)));
            QThread::msleep(50); // 10 000 bytes/s: a sender's pace, not a wait for the desk
        }
        QCOMPARE(trickle.readResponse().status, 200);
    }

    void idleConnectionsAreClosedAfterTheIdleTimeout()
    {
        auto config = Config::parse(R"({"endpoints": [{"name": "orders"}]})", u"idle"_qs);
        HttpLimits limits;
        limits.idleTimeoutMs = 300;
        Receiver receiver(*config, m_pool, limits);
        ListenAddress any;
        any.port = 0;
        const quint16 port = receiver.start(any)->port;
        RawConnection silent(port);
        QVERIFY(silent.waitClosed(10'000)); // never sent anything
        RawConnection keepAlive(port);
        QVERIFY(keepAlive.send(
            buildPost("/hooks/orders", "{}", {{"Idempotency-Key", "idle-1"}}, false)));
        QCOMPARE(keepAlive.readResponse().status, 200);
        QVERIFY(keepAlive.waitClosed(10'000)); // idle after its answer
        QTRY_COMPARE(receiver.connectionCount(), 0);
        // The config's timeouts reach the listener; without them, the documented defaults.
        const HttpLimits defaults = limitsFor(Config::builtin());
        QCOMPARE(defaults.idleTimeoutMs, 60'000);
        QCOMPARE(defaults.requestTimeoutMs, 30'000);
        auto set =
            Config::parse(R"({"idle_timeout_seconds": 7, "request_timeout_seconds": 9})", u"t"_qs);
        QCOMPARE(limitsFor(*set).idleTimeoutMs, 7000);
        QCOMPARE(limitsFor(*set).requestTimeoutMs, 9000);
    }

    void idleConnectionsCannotKeepScrapesOut()
    {
        // 64 idle connections to /metrics (its connection limit) used to keep every scrape out
        // (503) for the minute of the idle timeout.
        quint16 port = 0;
        QByteArray err;
        auto serve =
            test::startServe(QStringLiteral(IDEMDESK_BIN),
                             {u"--store"_qs, u"sqlite:"_qs + m_dir.filePath(u"scrape.db"_qs),
                              u"--metrics-listen"_qs, u"127.0.0.1:0"_qs},
                             port, &err);
        QVERIFY(port);
        const auto found =
            QRegularExpression(u"metrics at http://127\\.0\\.0\\.1:(\\d+)/metrics"_qs)
                .match(QString::fromUtf8(err));
        QVERIFY2(found.hasMatch(), err.constData());
        const quint16 metrics = quint16(found.captured(1).toUInt());
        std::vector<std::unique_ptr<RawConnection>> idle;
        int refused = 0;
        for (int i = 0; i < 64; ++i) {
            idle.push_back(
                std::make_unique<RawConnection>(metrics, 2000, "127.0.0.1", "127.0.0.2"));
            QVERIFY(idle.back()->isOpen());
        }
        for (auto &c : idle)
            refused += c->readResponse().status == 429; // the admitted ones time out (2 s)
        QCOMPARE(refused, 64 - MetricsServer::listenerLimits().maxConnectionsPerClient);
        QCOMPARE(get(metrics, "/metrics").status, 200); // a scraper, from another address
        // And an idle connection is closed within the listener's short idle timeout.
        QVERIFY(MetricsServer::listenerLimits().idleTimeoutMs <= 5000);
        RawConnection silent(metrics, 2000);
        QVERIFY(silent.waitClosed(MetricsServer::listenerLimits().idleTimeoutMs + 10'000));
        serve->terminate();
        QVERIFY(serve->waitForFinished(10000));
    }

    void aBurstOfConnectionsIsQueuedNotDropped()
    {
        // While serve accepts nothing (stopped), the kernel completes connections into the
        // listen backlog; past it, it drops the SYN and the client sends it again only a second
        // or more later. With Qt's backlog of 50, the 52nd connection waited; now the system's
        // maximum: none waits. Deterministic: nothing is accepted meanwhile.
        quint16 port = 0;
        auto serve =
            test::startServe(QStringLiteral(IDEMDESK_BIN),
                             {u"--store"_qs, u"sqlite:"_qs + m_dir.filePath(u"burst.db"_qs)}, port);
        QVERIFY(port);
        const int burst = std::min(300, listenBacklog() - 8);
        QVERIFY2(burst > 60, "the system's listen backlog (somaxconn) is too small for this test");
        QCOMPARE(::kill(pid_t(serve->processId()), SIGSTOP), 0);
        auto resume = qScopeGuard([&] { ::kill(pid_t(serve->processId()), SIGCONT); });
        std::vector<std::unique_ptr<RawConnection>> open;
        for (int i = 0; i < burst; ++i) {
            // From two clients: one may have 256 connections.
            open.push_back(std::make_unique<RawConnection>(port, 800, "127.0.0.1",
                                                           i % 2 ? "127.0.0.2" : "127.0.0.3"));
            QVERIFY2(open.back()->isOpen(), qPrintable(u"connection %1 of %2 was not completed "
                                                       "at once"_qs.arg(i + 1)
                                                           .arg(burst)));
        }
        resume.dismiss();
        QCOMPARE(::kill(pid_t(serve->processId()), SIGCONT), 0);
        QVERIFY(
            open.back()->send(buildPost("/hooks/generic", "{}", {{"Idempotency-Key", "burst"}})));
        QCOMPARE(open.back()->readResponse().status, 200);
        serve->terminate();
        QVERIFY(serve->waitForFinished(10000));
    }

    void aRestartBindsThePortItsConnectionsLeftInTimeWait()
    {
        quint16 port = 0;
        const QString store = u"sqlite:"_qs + m_dir.filePath(u"rebind.db"_qs);
        auto serve = test::startServe(QStringLiteral(IDEMDESK_BIN), {u"--store"_qs, store}, port);
        QVERIFY(port);
        // Connection: close: the desk closes first, so its side is left in TIME-WAIT.
        for (int i = 0; i < 20; ++i)
            QCOMPARE(post(port, "/hooks/generic", "{}",
                          {{"Idempotency-Key", "rebind-" + QByteArray::number(i)}})
                         .status,
                     200);
        serve->terminate();
        QVERIFY(serve->waitForFinished(10000));
        QProcess ss;
        ss.start(u"ss"_qs,
                 {u"-Htan"_qs, u"state"_qs, u"time-wait"_qs, u"sport = :%1"_qs.arg(port)});
        QVERIFY(ss.waitForFinished(5000));
        QVERIFY2(!ss.readAllStandardOutput().trimmed().isEmpty(), "no connection in TIME-WAIT");
        quint16 again = 0;
        QByteArray err;
        auto restarted = test::startServe(
            QStringLiteral(IDEMDESK_BIN),
            {u"--store"_qs, store, u"--listen"_qs, u"127.0.0.1:%1"_qs.arg(port)}, again, &err);
        QVERIFY2(again == port, err.constData());
        QCOMPARE(post(port, "/hooks/generic", "{}", {{"Idempotency-Key", "rebind-new"}}).status,
                 200);
        restarted->terminate();
        QVERIFY(restarted->waitForFinished(10000));
    }

    void connectionLimitAnswers503()
    {
        auto config = Config::parse("{\"max_connections\": 5, \"endpoints\": [{\"name\": \"orders\"}]}", u"limit"_qs);
        Receiver small(*config, m_pool);
        ListenAddress any;
        any.port = 0;
        const quint16 port = small.start(any)->port;
        std::vector<std::unique_ptr<RawConnection>> open;
        for (int i = 0; i < 5; ++i)
            open.push_back(std::make_unique<RawConnection>(port));
        QTRY_COMPARE(small.connectionCount(), 5);
        RawConnection extra(port);
        const ClientResponse r = extra.readResponse();
        QCOMPARE(r.status, 503);
        QCOMPARE(r.header("Retry-After"), QByteArray("1"));
        open.clear();
        QTRY_COMPARE(post(port, "/hooks/orders", "{}", {{"Idempotency-Key", "limit-ok"}}).status, 200);
    }
};

QTEST_GUILESS_MAIN(TestHostile)
#include "tst_hostile.moc"
