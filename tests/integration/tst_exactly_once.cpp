// Exactly once under faults (docs/guarantees.md): no event runs twice within a live lease, no
// sender gets an answer the store did not record; each path to either is held shut here,
// against every store where it touches one.
#include "engine/stats.h"
#include "http/blockingclient.h"
#include "http/httpserver.h"
#include "receiver/receiver.h"
#include "store/redislane.h"
#include "store/redisprotocol.h"
#include "store/sqlitestore.h"
#include "store/storefactory.h"
#include "store/storeurl.h"
#include "support/desk.h"
#include "support/downstream.h"
#include "support/names.h"
#include "support/pgdiskfull.h"
#include "support/serveprocess.h"
#include "support/servers.h"
#include "util/clock.h"
#include "util/crypto.h"

#include <QJsonArray>
#include <QRandomGenerator>
#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QRegularExpression>
#include <QScopeGuard>
#include <QSslConfiguration>
#include <QSslKey>
#include <QSslServer>
#include <QTcpServer>
#include <QTcpSocket>
#include <QTemporaryDir>
#include <QTest>
#include <QThread>
#include <QTimer>

#include <functional>
#include <future>
#include <memory>
#include <mutex>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pqxx/pqxx>
#include <sqlite3.h>
#include <sys/socket.h>
#include <unistd.h>

using namespace idem;
using namespace idem::test;

namespace {

// The shared counting downstream (tests/support), spoken to as this file does: its gate holds
// answers while a test acts on a delivery being processed.
struct GatedDownstream : CountingDownstream
{
    QByteArray url() const { return CountingDownstream::url().toString().toUtf8(); }
    void close() { closeGate(); }
    void open() { openGate(); }
    int count() const { return total(); }
    void setAnswer(int status, QByteArray body, HeaderList headers = {})
    {
        setStatus(status);
        setBody(std::move(body), std::move(headers));
    }
};

// A downstream that answers one byte at a time, forever: an inactivity timeout never fires.
class TrickleServer
{
public:
    TrickleServer()
    {
        m_server.moveToThread(&m_thread);
        m_thread.start();
        QMetaObject::invokeMethod(&m_server, [this] {
            QObject::connect(&m_server, &QTcpServer::newConnection, &m_server, [this] {
                while (QTcpSocket *socket = m_server.nextPendingConnection()) {
                    socket->write("HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n");
                    auto *timer = new QTimer(socket);
                    QObject::connect(timer, &QTimer::timeout, socket, [socket] { socket->write("x"); });
                    timer->start(100);
                }
            });
            m_server.listen(QHostAddress::LocalHost, 0);
            m_port = m_server.serverPort();
        }, Qt::BlockingQueuedConnection);
    }
    ~TrickleServer()
    {
        QMetaObject::invokeMethod(&m_server, [this] {
            m_server.close();
            qDeleteAll(m_server.findChildren<QTcpSocket *>());
        }, Qt::BlockingQueuedConnection);
        m_thread.quit();
        m_thread.wait();
    }
    QByteArray url() const { return "http://127.0.0.1:" + QByteArray::number(m_port) + "/slow"; }

private:
    QThread m_thread;
    QTcpServer m_server;
    quint16 m_port = 0;
};

// A downstream that answers every request with the bytes it is given, as they are (framing,
// interim answers, breaks included), then closes the connection if told to; it records the
// requests' bytes. On its own thread; https when given a certificate and key.
class ScriptedDownstream
{
public:
    explicit ScriptedDownstream(QByteArray answer, bool closeAfter, const QSslConfiguration &tls = {})
        : m_answer(std::move(answer)), m_closeAfter(closeAfter)
    {
        if (tls.localCertificate().isNull()) {
            m_server = std::make_unique<QTcpServer>();
        } else {
            auto server = std::make_unique<QSslServer>();
            server->setSslConfiguration(tls);
            m_server = std::move(server);
            m_scheme = "https";
        }
        m_server->moveToThread(&m_thread);
        m_thread.start();
        QMetaObject::invokeMethod(m_server.get(), [this] {
            // A TLS connection is pending once its handshake is done, after newConnection.
            auto take = [this] {
                while (QTcpSocket *socket = m_server->nextPendingConnection()) {
                    QObject::connect(socket, &QTcpSocket::readyRead, socket, [this, socket] { onRead(socket); });
                    if (socket->bytesAvailable() > 0)
                        onRead(socket);
                }
            };
            QObject::connect(m_server.get(), &QTcpServer::newConnection, m_server.get(), take);
            QObject::connect(m_server.get(), &QTcpServer::pendingConnectionAvailable, m_server.get(), take);
            m_server->listen(QHostAddress::LocalHost, 0);
            m_port = m_server->serverPort();
        }, Qt::BlockingQueuedConnection);
    }
    ~ScriptedDownstream()
    {
        QMetaObject::invokeMethod(m_server.get(), [this] {
            m_server->close();
            qDeleteAll(m_server->findChildren<QTcpSocket *>(Qt::FindDirectChildrenOnly)); // a QSslSocket has one inside
        }, Qt::BlockingQueuedConnection);
        m_thread.quit();
        m_thread.wait();
    }
    QByteArray url() const { return m_scheme + "://127.0.0.1:" + QByteArray::number(m_port) + "/scripted"; }
    QList<QByteArray> requests() const { std::lock_guard lock(m_mutex); return m_requests; }

private:
    // Answers once the request's head and Content-Length bytes are in.
    void onRead(QTcpSocket *socket)
    {
        QByteArray &in = m_inputs[socket];
        in += socket->readAll();
        const qsizetype end = in.indexOf("\r\n\r\n");
        if (end < 0)
            return;
        static const QRegularExpression length(u"\\r\\ncontent-length: *(\\d+)"_qs, QRegularExpression::CaseInsensitiveOption);
        const auto m = length.match(QString::fromLatin1(in.left(end)));
        if (in.size() < end + 4 + (m.hasMatch() ? m.captured(1).toLongLong() : 0))
            return;
        {
            std::lock_guard lock(m_mutex);
            m_requests.append(in);
        }
        in.clear();
        socket->write(m_answer);
        if (m_closeAfter)
            socket->disconnectFromHost();
    }
    QThread m_thread;
    std::unique_ptr<QTcpServer> m_server;
    QByteArray m_scheme = "http";
    quint16 m_port = 0;
    QByteArray m_answer;
    bool m_closeAfter;
    QHash<QTcpSocket *, QByteArray> m_inputs;
    mutable std::mutex m_mutex;
    QList<QByteArray> m_requests;
};

// The SQLite store's write lock, taken by a connection of its own as another process would, on a
// thread that holds it while `whileHeld` runs; returns once the lock is taken (`taken`) or could
// not be. It waits for the lock like SQLite's own callers: the desk holds it for moments (the
// delivery log), and an unchecked BEGIN that found it busy held nothing — the test then saw its
// claim granted at once (a flake, about 1 run in 10).
std::thread holdWriteLock(const QByteArray &path, std::function<void()> whileHeld, bool &taken)
{
    auto locked = std::make_shared<std::promise<bool>>();
    std::thread holder([path, locked, whileHeld = std::move(whileHeld)] {
        sqlite3 *db = nullptr;
        const bool ok = sqlite3_open(path.constData(), &db) == SQLITE_OK &&
                        sqlite3_busy_timeout(db, 10'000) == SQLITE_OK &&
                        sqlite3_exec(db, "BEGIN EXCLUSIVE", nullptr, nullptr, nullptr) == SQLITE_OK;
        locked->set_value(ok);
        if (ok) {
            whileHeld();
            sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr);
        }
        sqlite3_close(db);
    });
    taken = locked->get_future().get();
    return holder;
}

// A loopback port free now (taken, then given back), for a server the test starts on it.
quint16 closedPort()
{
    QTcpServer s;
    s.listen(QHostAddress::LocalHost, 0);
    return s.serverPort();
}

// A loopback port nothing listens on, for as long as this lives: bound, never listening, so a
// connection to it is refused and no server started meanwhile gets it (a port given back was
// taken by the next listen on port 0 — a desk, which answered 404).
class RefusingPort
{
public:
    RefusingPort() : m_fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0))
    {
        sockaddr_in address{};
        address.sin_family = AF_INET;
        address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t length = sizeof address;
        if (m_fd < 0 || ::bind(m_fd, reinterpret_cast<sockaddr *>(&address), sizeof address) != 0 ||
            ::getsockname(m_fd, reinterpret_cast<sockaddr *>(&address), &length) != 0)
            qFatal("cannot reserve a loopback port");
        m_port = ntohs(address.sin_port);
    }
    ~RefusingPort() { ::close(m_fd); }
    RefusingPort(const RefusingPort &) = delete;
    QByteArray number() const { return QByteArray::number(m_port); }

private:
    int m_fd;
    quint16 m_port = 0;
};

QString storeUrl(const QString &backend, const QTemporaryDir &dir, int seq)
{
    if (backend == u"redis"_qs)
        return qEnvironmentVariable("IDEM_TEST_REDIS_URL");
    if (backend == u"cluster"_qs)
        return qEnvironmentVariable("IDEM_TEST_REDIS_CLUSTER_URL");
    if (backend == u"postgres"_qs)
        return qEnvironmentVariable("IDEM_TEST_POSTGRES_URL");
    return u"sqlite:"_qs + dir.filePath(u"e%1.db"_qs.arg(seq));
}

// A random per-run tag, so keys of this run never meet an earlier run's on a shared server.
const QByteArray g_run = QByteArray::number(QDateTime::currentMSecsSinceEpoch(), 36);

int runTool(const QString &program, const QStringList &args, QByteArray *out = nullptr)
{
    QProcess p;
    p.start(program, args);
    if (!p.waitForFinished(20'000))
        return -1;
    if (out)
        *out = p.readAllStandardOutput() + p.readAllStandardError();
    return p.exitCode();
}

// How often the app received each SendGrid event, told by its member `field`, in every batch.
QHash<QString, int> received(const CountingDownstream &down, const QString &field)
{
    QHash<QString, int> n;
    for (const HttpRequest &r : down.requests())
        for (const QJsonValue &e : QJsonDocument::fromJson(r.body).array())
            n[e.toObject().value(field).toVariant().toString()] += 1;
    return n;
}

QJsonObject jsonOf(const ClientResponse &r)
{
    return QJsonDocument::fromJson(r.body).object();
}

// How many bytes the store of `backend` takes, by its own account: SQLite's pages (the file at
// `sqlitePath`, its WAL's pages too), PostgreSQL's tables with their indexes and TOAST, Redis's
// used_memory (of every master, on the cluster). -1 when it cannot be read.
qint64 storeBytes(const QString &backend, const QString &sqlitePath)
{
    if (backend == u"sqlite"_qs) {
        sqlite3 *db = nullptr;
        sqlite3_stmt *size = nullptr;
        qint64 bytes = -1;
        if (sqlite3_open(QFile::encodeName(sqlitePath).constData(), &db) == SQLITE_OK &&
            sqlite3_busy_timeout(db, 10'000) == SQLITE_OK &&
            sqlite3_prepare_v2(db,
                               "SELECT page_count * page_size FROM pragma_page_count(),"
                               " pragma_page_size()",
                               -1, &size, nullptr) == SQLITE_OK &&
            sqlite3_step(size) == SQLITE_ROW)
            bytes = sqlite3_column_int64(size, 0);
        sqlite3_finalize(size);
        sqlite3_close(db);
        return bytes;
    }
    if (backend == u"postgres"_qs) {
        pqxx::connection c(qEnvironmentVariable("IDEM_TEST_POSTGRES_URL").toStdString());
        pqxx::nontransaction n(c);
        // (VACUUM first: the rows earlier tests deleted are then space new rows may take, as
        // they would on a store purging its expired keys.)
        for (const char *table : {"idem_keys", "idem_deliveries", "idem_shared"})
            n.exec(std::string("VACUUM ") + table);
        return n.exec1("SELECT sum(pg_total_relation_size(t::regclass))::bigint FROM"
                       " unnest(ARRAY['idem_keys', 'idem_deliveries', 'idem_shared']) t")[0]
            .as<qint64>();
    }
    QStringList ports{qEnvironmentVariable("IDEM_TEST_REDIS_PORT")};
    if (backend == u"cluster"_qs)
        ports = qEnvironmentVariable("IDEM_TEST_REDIS_CLUSTER_PORTS").split(u',');
    qint64 bytes = 0;
    for (const QString &port : ports) {
        QByteArray info;
        if (runTool(u"redis-cli"_qs, {u"-p"_qs, port, u"INFO"_qs, u"replication"_qs}, &info) != 0)
            return -1;
        if (!info.contains("role:master"))
            continue;
        if (runTool(u"redis-cli"_qs, {u"-p"_qs, port, u"INFO"_qs, u"memory"_qs}, &info) != 0)
            return -1;
        const auto used = QRegularExpression(u"used_memory:(\\d+)"_qs).match(QString::fromLatin1(info));
        if (!used.hasMatch())
            return -1;
        bytes += used.captured(1).toLongLong();
    }
    return bytes;
}

} // namespace

class TestExactlyOnce : public QObject
{
    Q_OBJECT
    QTemporaryDir m_dir;
    int m_seq = 0;

    Desk start(const QString &backend, const QByteArray &endpointsJson, const QByteArray &defaults = "{}")
    {
        const QString url = storeUrl(backend, m_dir, ++m_seq);
        if (url.isEmpty())
            qFatal("%s: run through ./dev test (IDEM_TEST_REDIS_URL, IDEM_TEST_POSTGRES_URL)", qPrintable(backend));
        return startDesk("{\"defaults\": " + defaults + ", \"endpoints\": " + endpointsJson + "}", url);
    }
    static QByteArray endpoint(const QByteArray &name, const QByteArray &forwardTo, const QByteArray &extra = {})
    {
        return "[{\"name\": \"" + name + "\", \"forward_to\": \"" + forwardTo + "\"" + extra + "}]";
    }
    static std::optional<KeyRecord> record(Desk &desk, const QString &key)
    {
        auto r = desk.pool->run<std::optional<KeyRecord>>([&](IdempotencyStore &s) { return s.key(key); });
        return r ? *r : std::nullopt;
    }
    static ClientResponse deliver(quint16 port, const QByteArray &endpoint, const QByteArray &key,
                                  const QByteArray &body = "{\"a\":1}", HeaderList headers = {})
    {
        headers.append({"Idempotency-Key", key});
        return post(port, "/hooks/" + endpoint, body, headers);
    }
    // Ends the lease of `key` (in the last desk's store) now, written straight into the store: a
    // run outliving its lease, without waiting for one.
    bool endLeaseNow(const QString &backend, const QString &key)
    {
        const QByteArray k = key.toUtf8();
        if (backend == u"sqlite"_qs) {
            sqlite3 *db = nullptr;
            sqlite3_stmt *update = nullptr;
            const bool ok =
                sqlite3_open(QFile::encodeName(m_dir.filePath(u"e%1.db"_qs.arg(m_seq))).constData(),
                             &db) == SQLITE_OK &&
                sqlite3_busy_timeout(db, 10'000) == SQLITE_OK &&
                sqlite3_prepare_v2(db, "UPDATE idem_keys SET lease_until_ms = 0 WHERE key = ?1", -1,
                                   &update, nullptr) == SQLITE_OK &&
                sqlite3_bind_text(update, 1, k.constData(), int(k.size()), SQLITE_STATIC) ==
                    SQLITE_OK &&
                sqlite3_step(update) == SQLITE_DONE && sqlite3_changes(db) == 1;
            sqlite3_finalize(update);
            sqlite3_close(db);
            return ok;
        }
        if (backend == u"postgres"_qs) {
            pqxx::connection c(qEnvironmentVariable("IDEM_TEST_POSTGRES_URL").toStdString());
            pqxx::work w(c);
            const auto r = w.exec_params("UPDATE idem_keys SET lease_until_ms = 0 WHERE key = $1",
                                         k.toStdString());
            w.commit();
            return r.affected_rows() == 1;
        }
        // Redis: the record's one-line meta, its sixth field.
        const StoreUrl url = *StoreUrl::parse(qEnvironmentVariable("IDEM_TEST_REDIS_URL"));
        const QString rk = QString::fromUtf8(redis::Layout(url.prefix.toUtf8(), 1).record(key));
        const QStringList cli{u"-p"_qs, QString::number(url.port), u"-n"_qs,
                              url.database.isEmpty() ? u"0"_qs : url.database};
        QByteArray meta;
        if (runTool(u"redis-cli"_qs, cli + QStringList{u"HGET"_qs, rk, u"m"_qs}, &meta) != 0)
            return false;
        QList<QByteArray> fields = meta.trimmed().split(' ');
        if (fields.size() < 10)
            return false;
        fields[5] = "0";
        return runTool(u"redis-cli"_qs, cli + QStringList{u"HSET"_qs, rk, u"m"_qs,
                                                          QString::fromUtf8(fields.join(' '))}) ==
               0;
    }
    // Waits until, on the store's clock, the run of `key`'s claim is past its deadline (the claim
    // + forward_timeout_seconds): a duplicate is then told of the lease's end. The 504 comes a
    // little sooner — its deadline counts from before the claim was sent — so a duplicate sent
    // at once may still be told "being processed" (a flake in a loaded run).
    static bool runIsOver(Desk &desk, const QString &key, int leaseSeconds,
                          int forwardTimeoutSeconds)
    {
        const auto held = record(desk, key);
        if (!held)
            return false;
        const qint64 runEndsMs =
            held->leaseUntilMs - leaseSeconds * 1000LL + forwardTimeoutSeconds * 1000LL;
        return QTest::qWaitFor(
            [&] {
                return *desk.pool->run<qint64>([](IdempotencyStore &s) { return s.clockMs(); }) >=
                       runEndsMs;
            },
            10'000);
    }
    // An operator's retry of `key` (the window's Retry, `keys retry`), on the receiver's thread.
    static Result<RetryOutcome> retryNow(Desk &desk, const QString &key)
    {
        std::promise<Result<RetryOutcome>> retried;
        IdempotencyEngine *engine = desk.receiver->engine();
        QMetaObject::invokeMethod(engine, [engine, key, &retried] {
            engine->retryKey(key, false,
                             [&retried](Result<RetryOutcome> r) { retried.set_value(r); });
        });
        return retried.get_future().get();
    }
    static void stores()
    {
        QTest::addColumn<QString>("backend");
        for (const char *b : {"sqlite", "redis", "postgres"})
            QTest::newRow(b) << QString::fromLatin1(b);
    }
    // stores() and the Redis Cluster.
    static void everyStore()
    {
        QTest::addColumn<QString>("backend");
        for (const char *b : {"sqlite", "redis", "cluster", "postgres"})
            QTest::newRow(b) << QString::fromLatin1(b);
    }
    static QByteArray sendgrid(const QByteArray &name, const QByteArray &forwardTo,
                               const QByteArray &extra = {})
    {
        return "[{\"name\": \"" + name + "\", \"provider\": \"sendgrid\", \"forward_to\": \"" +
               forwardTo + "\"" + extra + "}]";
    }

private Q_SLOTS:
    // The app gets the claim's fencing token, so it can refuse a stale worker's write; a
    // sender cannot forge it (nor Idempotency-Key).
    void fencingTokenIsForwarded_data() { stores(); }
    void fencingTokenIsForwarded()
    {
        QFETCH(QString, backend);
        GatedDownstream down;
        Desk desk = start(backend, endpoint("fence" + g_run, down.url()));
        const QByteArray key = "k-" + backend.toLatin1();
        const ClientResponse r = deliver(desk.port, "fence" + g_run, key, "{}",
                                         {{"Idempotency-Fencing-Token", "999999999"}});
        QCOMPARE(r.status, 200);
        const auto stored = record(desk, u"fence%1:%2"_qs.arg(QString::fromLatin1(g_run), QString::fromLatin1(key)));
        QVERIFY(stored && stored->token > 0);
        QCOMPARE(down.count(), 1);
        const HttpRequest got = down.requests().first();
        QCOMPARE(got.header("Idempotency-Fencing-Token"), QByteArray::number(stored->token));
        int copies = 0;
        for (const auto &[name, value] : got.headers)
            copies += name.compare("Idempotency-Fencing-Token", Qt::CaseInsensitive) == 0;
        QCOMPARE(copies, 1);
    }

    // The app got the request but no usable answer came back (none by the deadline, one broken
    // off): it may have acted, and may still be at it. The key is not failed — a sender's retry
    // ran it again at once, beside the first run — but left processing until its lease ends:
    // duplicates meanwhile are told "in progress", the next after it recovers the key. A
    // downstream that never got the request (nothing listening) still fails the key at once.
    void anUnknownOutcomeIsLeftToItsLease_data() { stores(); }
    void anUnknownOutcomeIsLeftToItsLease()
    {
        QFETCH(QString, backend);
        GatedDownstream slow;
        slow.close(); // holds every request unanswered: the app still at work
        const RefusingPort refusing;                   // nothing listening there
        ScriptedDownstream broken(QByteArray(), true); // closes without a word
        const QByteArray lease = ", \"forward_timeout_seconds\": 1, \"lease_seconds\": 3";
        Desk desk = start(
            backend, "[{\"name\": \"slow" + g_run + "\", \"forward_to\": \"" + slow.url() + "\"" +
                         lease + "}, {\"name\": \"broken" + g_run + "\", \"forward_to\": \"" +
                         broken.url() + "\"" + lease + "}, {\"name\": \"gone" + g_run +
                         "\", \"forward_to\": \"http://127.0.0.1:" + refusing.number() + "/x\"" +
                         lease + "}]");
        auto storeNowMs = [&desk] {
            return *desk.pool->run<qint64>([](IdempotencyStore &s) { return s.clockMs(); });
        };
        const QString slowKey = u"slow%1:k1"_qs.arg(QString::fromLatin1(g_run));
        const QString brokenKey = u"broken%1:k1"_qs.arg(QString::fromLatin1(g_run));

        const ClientResponse timedOut = deliver(desk.port, "slow" + g_run, "k1");
        QCOMPARE(timedOut.status, 504);
        QVERIFY2(timedOut.body.contains("stays in progress until its lease ends"),
                 timedOut.body.constData());
        const ClientResponse cut = deliver(desk.port, "broken" + g_run, "k1");
        QCOMPARE(cut.status, 502);
        QVERIFY2(cut.body.contains("stays in progress"), cut.body.constData());
        for (const QString &key : {slowKey, brokenKey})
            QCOMPARE(name(record(desk, key)->state), name(KeyState::Processing));
        QVERIFY(runIsOver(desk, slowKey, 3, 1));
        const ClientResponse during = deliver(desk.port, "slow" + g_run, "k1");
        QCOMPARE(during.status, 409);
        QCOMPARE(during.header("Idempotency-Outcome"), QByteArray("in-progress"));
        // Nothing runs any more: told when the lease ends, not "retry in 10 s" over and over.
        QVERIFY2(during.body.contains("no recorded outcome yet"), during.body.constData());
        QVERIFY(during.header("Retry-After").toInt() <= 3);
        QCOMPARE(deliver(desk.port, "broken" + g_run, "k1").header("Idempotency-Outcome"),
                 QByteArray("in-progress"));
        QCOMPARE(slow.count(), 1);
        QCOMPARE(broken.requests().size(), 1);

        const ClientResponse unreachable = deliver(desk.port, "gone" + g_run, "k1");
        QCOMPARE(unreachable.status, 502);
        QCOMPARE(name(record(desk, u"gone%1:k1"_qs.arg(QString::fromLatin1(g_run)))->state),
                 name(KeyState::Failed));
        QCOMPARE(deliver(desk.port, "gone" + g_run, "k1").header("Idempotency-Outcome"),
                 QByteArray("reprocessed"));

        // The lease ends (on the store's clock): nothing runs the keys any more, and stats and
        // the tray say so (they counted them with the keys at work); the next delivery recovers
        // the key, once.
        const qint64 leaseUntil =
            std::max(record(desk, slowKey)->leaseUntilMs, record(desk, brokenKey)->leaseUntilMs);
        QVERIFY(QTest::qWaitFor([&] { return storeNowMs() > leaseUntil; }, 10'000));
        for (const QByteArray ep : {"slow", "broken"})
            QCOMPARE(*desk.pool->run<qint64>([&](IdempotencyStore &s) {
                return countStuckKeys(s, QString::fromLatin1(ep + g_run));
            }),
                     1);
        const auto stats = desk.pool->run<StatsReport>(
            [](IdempotencyStore &s) { return collectStats(s, Config{}, 0); });
        QVERIFY(stats);
        QVERIFY(stats->stuck >= 2); // a shared Redis or PostgreSQL may hold other tests' keys
        QVERIFY2(formatStats(*stats, 60).contains(u"past the lease"_qs),
                 qPrintable(formatStats(*stats, 60)));
        QVERIFY(statsToJson(*stats)[u"keys"_qs][u"stuck"_qs].toInteger() >= 2);
        slow.open();
        const ClientResponse after = deliver(desk.port, "slow" + g_run, "k1");
        QCOMPARE(after.status, 200);
        QCOMPARE(after.header("Idempotency-Outcome"), QByteArray("recovered"));
        QCOMPARE(slow.count(), 2);
        QCOMPARE(name(record(desk, slowKey)->state), name(KeyState::Completed));
    }

    // The same for a SendGrid batch: a redelivered batch whose events have no recorded outcome is
    // told when their leases end, not "retry in 10 s" (the cap of a batch still being processed)
    // over and over.
    void aBatchWithUnknownOutcomesWaitsForTheLeases()
    {
        GatedDownstream slow;
        slow.close();
        Desk desk =
            start(u"sqlite"_qs,
                  "[{\"name\": \"sgslow\", \"provider\": \"sendgrid\", \"forward_to\": \"" +
                      slow.url() + "\", \"forward_timeout_seconds\": 1, \"lease_seconds\": 30}]");
        const QByteArray batch = "[{\"sg_event_id\": \"u-1\", \"event\": \"open\"}, "
                                 "{\"sg_event_id\": \"u-2\", \"event\": \"click\"}]";
        const ClientResponse first =
            post(desk.port, "/hooks/sgslow", batch, {{"Content-Type", "application/json"}});
        QCOMPARE(first.status, 504);
        // Both events' runs: each was claimed on its own clock reading, a few ms apart under
        // load, and the batch is "being processed" while either run may still go.
        QVERIFY(runIsOver(desk, u"sgslow:u-1"_qs, 30, 1));
        QVERIFY(runIsOver(desk, u"sgslow:u-2"_qs, 30, 1));
        const ClientResponse again =
            post(desk.port, "/hooks/sgslow", batch, {{"Content-Type", "application/json"}});
        QCOMPARE(again.status, 409);
        QVERIFY2(again.body.contains("no recorded outcome yet"), again.body.constData());
        const int retryAfter = again.header("Retry-After").toInt();
        QVERIFY2(retryAfter > 20 && retryAfter <= 30, again.header("Retry-After").constData());
        QCOMPARE(slow.count(), 1);
    }

    // forward_timeout_seconds bounds the whole answer: a downstream trickling a byte at a time
    // is cut at the deadline (504, failed: its status line came, the app was done), never
    // answered after the lease.
    void forwardTimeoutIsAHardDeadline()
    {
        TrickleServer slow;
        Desk desk = start(u"sqlite"_qs, endpoint("slow", slow.url(), ", \"forward_timeout_seconds\": 1, \"lease_seconds\": 3"));
        const qint64 t0 = monotonicUs();
        const ClientResponse r = deliver(desk.port, "slow", "k1");
        const qint64 tookMs = (monotonicUs() - t0) / 1000;
        QCOMPARE(r.status, 504);
        QVERIFY2(tookMs < 2900, qPrintable(u"answered after %1 ms, the lease is 3000 ms"_qs.arg(tookMs)));
        QCOMPARE(name(record(desk, u"slow:k1"_qs)->state), name(KeyState::Failed));
    }

    // A store slow to grant the claim (not failing: a lock held 1.5 s, under the 5 s busy
    // timeout) leaves no time of the 1 s forward timeout: nothing runs, and the claim is
    // released (the key finished as reset), so the sender's next delivery processes it. Stored
    // as failed, it was replayed for good under on_failed: reject; left leased, a duplicate
    // was told "in progress" — with in_progress_status 202, a 2xx the sender takes as done.
    void aClaimTooLateToStartIsReleased()
    {
        GatedDownstream down;
        Desk desk =
            start(u"sqlite"_qs, endpoint("late", down.url(),
                                         ", \"forward_timeout_seconds\": 1, \"lease_seconds\": 3, "
                                         "\"on_failed\": \"reject\", \"in_progress_status\": 202"));
        const QByteArray path = QFile::encodeName(m_dir.filePath(u"e%1.db"_qs.arg(m_seq)));
        // The store's write lock, held 1.5 s by another process's connection.
        const auto forAWhile = [] { std::this_thread::sleep_for(std::chrono::milliseconds(1500)); };
        bool taken = false;
        std::thread holder = holdWriteLock(path, forAWhile, taken);
        QVERIFY(taken);
        const ClientResponse late = deliver(desk.port, "late", "k1");
        holder.join();
        QCOMPARE(late.status, 503);
        QCOMPARE(late.header("Idempotency-Outcome"), QByteArray("unavailable"));
        QVERIFY2(late.body.contains("not started"), late.body.constData());
        QCOMPARE(down.count(), 0);
        QTRY_COMPARE(name(record(desk, u"late:k1"_qs)->state), name(KeyState::Reset));
        const ClientResponse retry = deliver(desk.port, "late", "k1");
        QCOMPARE(retry.status, 200);
        QCOMPARE(retry.header("Idempotency-Outcome"), QByteArray("reprocessed"));
        QCOMPARE(down.count(), 1);

        // An operator's retry that comes too late leaves the key reset too (not processing, where
        // no list of failed keys shows it and a retry without --force is refused).
        down.setStatus(500);
        QCOMPARE(deliver(desk.port, "late", "k2").status, 500);
        QCOMPARE(name(record(desk, u"late:k2"_qs)->state), name(KeyState::Failed));
        down.setStatus(200);
        holder = holdWriteLock(path, forAWhile, taken);
        QVERIFY(taken);
        const Result<RetryOutcome> operatorRetry = retryNow(desk, u"late:k2"_qs);
        holder.join();
        QVERIFY(!operatorRetry);
        QVERIFY2(operatorRetry.error().message.contains(u"key is reset"_qs),
                 qPrintable(operatorRetry.error().message));
        QCOMPARE(name(record(desk, u"late:k2"_qs)->state), name(KeyState::Reset));
        QCOMPARE(deliver(desk.port, "late", "k2").header("Idempotency-Outcome"),
                 QByteArray("reprocessed"));
        QCOMPARE(down.count(), 3);
    }

    // An operator's retry that fails again says why in the delivery log, as a delivery's line
    // does (it said "operator retry" and nothing more).
    void aFailedOperatorRetryIsLoggedWithItsError()
    {
        GatedDownstream down;
        down.setStatus(500);
        Desk desk = start(u"sqlite"_qs, endpoint("opfail", down.url()));
        QCOMPARE(deliver(desk.port, "opfail", "k1").status, 500);
        const Result<RetryOutcome> retry = retryNow(desk, u"opfail:k1"_qs);
        QVERIFY(retry && !retry->completed);
        QCOMPARE(down.count(), 2);
        auto operatorLine = [&desk] {
            DeliveryQuery query;
            query.key = u"opfail:k1"_qs;
            auto lines = desk.pool->run<QList<DeliveryEvent>>(
                [&](IdempotencyStore &s) { return s.deliveries(query); });
            if (lines)
                for (const DeliveryEvent &e : *lines)
                    if (e.detail.startsWith(u"operator retry"_qs))
                        return e.detail;
            return QString();
        };
        QTRY_COMPARE(operatorLine(), u"operator retry: the downstream answered 500"_qs);
    }

    // A stuck key behind more than a thousand keys in flight is counted (the count read the
    // thousand processing keys updated last, and stuck keys are the oldest).
    void aStuckKeyBehindManyInFlightIsCounted()
    {
        const QString path = m_dir.filePath(u"stuck.db"_qs);
        QVERIFY(SqliteStore::open(path).ok()); // the schema
        sqlite3 *db = nullptr;
        QCOMPARE(sqlite3_open(QFile::encodeName(path).constData(), &db), SQLITE_OK);
        const qint64 now = wallMs();
        sqlite3_exec(db, "BEGIN", nullptr, nullptr, nullptr);
        for (int i = 0; i <= 1100; ++i) {
            // k0 updated first, its lease over; the rest later, in flight.
            const QByteArray sql =
                "INSERT INTO idem_keys (key, endpoint, provider, state, fingerprint, token,"
                " attempts, created_ms, updated_ms, lease_until_ms, expires_at_ms) VALUES ('s:k" +
                QByteArray::number(i) + "', 's', 'generic', 'processing', 'f', 1, 1, " +
                QByteArray::number(now - 60'000 + i) + ", " + QByteArray::number(now - 60'000 + i) +
                ", " + QByteArray::number(i ? now + 600'000 : now - 50'000) + ", " +
                QByteArray::number(now + 3'600'000) + ")";
            QCOMPARE(sqlite3_exec(db, sql.constData(), nullptr, nullptr, nullptr), SQLITE_OK);
        }
        sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr);
        sqlite3_close(db);
        auto pool = openStorePool(u"sqlite:"_qs + path, 1);
        QVERIFY(pool.ok());
        QCOMPARE(*(*pool)->run<qint64>([](IdempotencyStore &s) { return countStuckKeys(s); }), 1);
    }

    // The built-in processor keeps the same deadline.
    void simulatedDelayPastTheDeadlineIs504()
    {
        Desk desk = start(u"sqlite"_qs, "[{\"name\": \"sim\", \"simulate\": {\"delay_ms\": 60000}, \"forward_timeout_seconds\": 1, \"lease_seconds\": 3}]");
        const ClientResponse r = deliver(desk.port, "sim", "k1");
        QCOMPARE(r.status, 504);
        QCOMPARE(name(record(desk, u"sim:k1"_qs)->state), name(KeyState::Processing));
    }

    // An answer over max_response_bytes is not stored as the result (nor replayed): failed, its
    // status line read (the app was done).
    void oversizedAnswerIsFailed()
    {
        GatedDownstream down;
        down.setAnswer(200, QByteArray(300'000, 'x'));
        Desk desk = start(u"sqlite"_qs, endpoint("big", down.url(), ", \"max_response_bytes\": 100000"));
        const ClientResponse r = deliver(desk.port, "big", "k1");
        QCOMPARE(r.status, 502);
        QVERIFY2(r.body.contains("max_response_bytes"), r.body.constData());
        const auto stored = record(desk, u"big:k1"_qs);
        QCOMPARE(name(stored->state), name(KeyState::Failed));
        QVERIFY(stored->result.body.size() < 10'000);
    }

    // Nothing of one delivery reaches another: no cookie jar, the desk's own User-Agent; nothing
    // asked for on the sender's behalf (no Accept-Encoding, no Accept-Language it did not send —
    // QNetworkAccessManager always added them); hop-by-hop headers stay behind.
    void forwardedRequestsStandAlone()
    {
        GatedDownstream down;
        down.setAnswer(200, "{}", {{"Set-Cookie", "session=abc; Path=/"}});
        Desk desk = start(u"sqlite"_qs, endpoint("hop", down.url()));
        QCOMPARE(deliver(desk.port, "hop", "k1").status, 200);
        QCOMPARE(deliver(desk.port, "hop", "k2", "{}",
                         {{"Connection", "keep-alive, X-Hop"}, {"X-Hop", "secret"}, {"Proxy-Authorization", "Basic eA=="},
                          {"Keep-Alive", "timeout=5"}, {"X-Forwarded-For", "10.9.8.7"}, {"X-App", "kept"},
                          {"Accept-Encoding", "gzip"}, {"Accept-Language", "de-CH"}})
                     .status,
                 200);
        QCOMPARE(down.count(), 2);
        // What the sender sent (Host, Content-Type, Content-Length, Connection, Idempotency-Key)
        // and what the desk adds; not one header more.
        const HttpRequest first = down.requests().at(0);
        QStringList names;
        for (const auto &[name, value] : first.headers)
            names.append(QString::fromLatin1(name).toLower());
        names.sort();
        QCOMPARE(names,
                 QStringList({u"connection"_qs, u"content-length"_qs, u"content-type"_qs,
                              u"host"_qs, u"idempotency-fencing-token"_qs, u"idempotency-key"_qs,
                              u"user-agent"_qs, u"via"_qs, u"x-forwarded-for"_qs}));
        QVERIFY(!first.hasHeader("Accept-Encoding"));
        QVERIFY(!first.hasHeader("Accept-Language"));
        QCOMPARE(first.header("Connection"), QByteArray("close"));
        QCOMPARE(first.header("Content-Type"), QByteArray("application/json"));

        const HttpRequest second = down.requests().at(1);
        QVERIFY2(second.header("Cookie").isEmpty(), second.header("Cookie").constData());
        QVERIFY(second.header("User-Agent").startsWith("idemdesk/"));
        QCOMPARE(second.header("Accept-Encoding"), QByteArray("gzip"));
        QCOMPARE(second.header("Accept-Language"), QByteArray("de-CH"));
        QVERIFY(second.header("X-Hop").isEmpty());
        QVERIFY(second.header("Proxy-Authorization").isEmpty());
        QVERIFY(second.header("Keep-Alive").isEmpty());
        QCOMPARE(second.header("X-App"), QByteArray("kept"));
        QCOMPARE(second.header("X-Forwarded-For"), QByteArray("10.9.8.7, 127.0.0.1"));
        // The stored result keeps no cookie for replays either.
        QVERIFY(!record(desk, u"hop:k1"_qs)->result.headers.contains({"Set-Cookie", "session=abc; Path=/"}));
    }

    // A forward_to that leads back to the desk, directly or through another desk, is refused
    // where it comes back (508, nothing claimed for it): it used to be claimed under a longer key
    // each time round ("x:x:x:k", the Idempotency-Key the desk forwards) and forwarded again, some
    // fifty levels deep, until the key grew too long. A chain of desks that ends at an app is not
    // a loop: each adds its own Via entry, after the sender's.
    void aForwardLoopIsRefused()
    {
        GatedDownstream down;
        const quint16 portA = closedPort(), portB = closedPort();
        auto at = [](quint16 port, const char *endpoint) {
            return "http://127.0.0.1:" + QByteArray::number(port) + "/hooks/" + endpoint;
        };
        Desk a = startDesk("{\"endpoints\": [{\"name\": \"self\", \"forward_to\": \"" +
                               at(portA, "self") + "\"}, {\"name\": \"round\", \"forward_to\": \"" +
                               at(portB, "back") + "\"}, {\"name\": \"chain\", \"forward_to\": \"" +
                               at(portB, "app") + "\"}, {\"name\": \"hop\", \"forward_to\": \"" +
                               at(portA, "chain") + "\"}]}",
                           storeUrl(u"sqlite"_qs, m_dir, ++m_seq), portA);
        Desk b = startDesk("{\"endpoints\": [{\"name\": \"back\", \"forward_to\": \"" +
                               at(portA, "round") + "\"}, {\"name\": \"app\", \"forward_to\": \"" +
                               down.url() + "\"}]}",
                           storeUrl(u"sqlite"_qs, m_dir, ++m_seq), portB);
        auto keysOf = [](Desk &desk) {
            QStringList keys;
            auto page = desk.pool->run<QList<KeyRecord>>(
                [](IdempotencyStore &s) { return s.listKeys(KeyQuery{}); });
            if (page)
                for (const KeyRecord &r : *page)
                    keys.append(r.key + u"="_qs + toString(r.state) + u"/"_qs +
                                QString::number(r.result.status));
            keys.sort();
            return keys;
        };

        const ClientResponse direct = deliver(a.port, "self", "k1");
        QCOMPARE(direct.status, 508);
        QVERIFY2(direct.body.contains("a forward_to leads back to it"), direct.body.constData());
        QCOMPARE(keysOf(a), QStringList{u"self:k1=failed/508"_qs});

        const ClientResponse round = deliver(a.port, "round", "k2");
        QCOMPARE(round.status, 508);
        QCOMPARE(keysOf(a), QStringList({u"round:k2=failed/508"_qs, u"self:k1=failed/508"_qs}));
        QCOMPARE(keysOf(b), QStringList{u"back:round:k2=failed/508"_qs});

        // Through both desks to the app: one Via entry each, after the sender's.
        const ClientResponse chained =
            deliver(a.port, "chain", "k3", "{}", {{"Via", "1.1 sender-proxy"}});
        QCOMPARE(chained.status, 200);
        QCOMPARE(down.count(), 1);
        QList<QByteArray> via;
        for (const auto &[name, value] : down.requests().first().headers)
            if (name.compare("Via", Qt::CaseInsensitive) == 0)
                for (const QByteArray &entry : value.split(','))
                    via.append(entry.trimmed());
        QCOMPARE(via.size(), 3);
        QCOMPARE(via.first(), QByteArray("1.1 sender-proxy"));
        QVERIFY2(via.at(1).startsWith("1.1 idemdesk-") && via.at(2).startsWith("1.1 idemdesk-") &&
                     via.at(1) != via.at(2),
                 via.join(" | ").constData());
        // Through two endpoints of one desk, then the other desk, to the app: no loop either
        // (one entry per endpoint, not per desk: it was refused).
        QCOMPARE(deliver(a.port, "hop", "k4").status, 200);
        QCOMPARE(down.count(), 2);
    }

    // User info in forward_to is the app's credential, sent as Basic authentication — unless
    // the sender sent an Authorization of its own, which reaches the app untouched.
    void userInfoIsBasicAuthorization()
    {
        GatedDownstream down;
        const QByteArray url = down.url().replace("http://", "http://desk%40user:p%3Ass@");
        Desk desk = start(u"sqlite"_qs, endpoint("auth", url));
        QCOMPARE(deliver(desk.port, "auth", "k1").status, 200);
        QCOMPARE(deliver(desk.port, "auth", "k2", "{}", {{"Authorization", "Bearer from-sender"}}).status, 200);
        QCOMPARE(down.count(), 2);
        QCOMPARE(down.requests().at(0).header("Authorization"), "Basic " + QByteArray("desk@user:p:ss").toBase64());
        QCOMPARE(down.requests().at(1).header("Authorization"), QByteArray("Bearer from-sender"));
    }

    // The answer is read as HTTP/1.1 frames it: Content-Length, chunked (trailers dropped),
    // up to the close; interim answers skipped. Whatever is not a whole answer — a close before
    // the end, a malformed answer, a body over max_response_bytes — is 502 and the key failed,
    // never a partial body stored as the app's answer.
    void downstreamAnswerFraming_data()
    {
        QTest::addColumn<QByteArray>("answer");
        QTest::addColumn<bool>("closeAfter");
        QTest::addColumn<int>("status");
        QTest::addColumn<QByteArray>("body");
        // Failed when a final status line came back (the app was done), left processing when
        // none did (ProcessResult::outcomeUnknown).
        QTest::addColumn<QString>("state");
        const QByteArray ok = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n";
        QTest::newRow("content-length") << QByteArray(ok + "Content-Length: 5\r\n\r\nhello")
                                        << false << 200 << QByteArray("hello") << u"completed"_qs;
        QTest::newRow("chunked, trailer dropped")
            << QByteArray(ok + "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n "
                               "world\r\n0\r\nX-Trailer: t\r\n\r\n")
            << false << 200 << QByteArray("hello world") << u"completed"_qs;
        QTest::newRow("read until close") << QByteArray(ok + "\r\nup to the close") << true << 200
                                          << QByteArray("up to the close") << u"completed"_qs;
        QTest::newRow("interim answer skipped")
            << QByteArray("HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + ok +
                          "Content-Length: 2\r\n\r\nok")
            << false << 200 << QByteArray("ok") << u"completed"_qs;
        QTest::newRow("error status kept")
            << QByteArray("HTTP/1.1 422 Unprocessable\r\nContent-Length: 3\r\n\r\nbad") << false
            << 422 << QByteArray("bad") << u"failed"_qs;
        QTest::newRow("closed mid-body") << QByteArray(ok + "Content-Length: 100\r\n\r\nonly part")
                                         << true << 502 << QByteArray() << u"failed"_qs;
        QTest::newRow("closed mid-chunk")
            << QByteArray(ok + "Transfer-Encoding: chunked\r\n\r\n10\r\nonly") << true << 502
            << QByteArray() << u"failed"_qs;
        QTest::newRow("closed mid-headers") << QByteArray("HTTP/1.1 200 OK\r\nContent-Le") << true
                                            << 502 << QByteArray() << u"failed"_qs;
        QTest::newRow("closed without an answer")
            << QByteArray() << true << 502 << QByteArray() << u"processing"_qs;
        QTest::newRow("not HTTP") << QByteArray("SSH-2.0-OpenSSH_9.2\r\n") << false << 502
                                  << QByteArray() << u"processing"_qs;
        // A final status no sender can read (it was passed on and stored: "HTTP/1.1 99 OK").
        QTest::newRow("status 099") << QByteArray("HTTP/1.1 099 Odd\r\nContent-Length: 2\r\n\r\nno")
                                    << false << 502 << QByteArray() << u"failed"_qs;
        QTest::newRow("status 600") << QByteArray("HTTP/1.1 600 Odd\r\nContent-Length: 2\r\n\r\nno")
                                    << false << 502 << QByteArray() << u"failed"_qs;
        QTest::newRow("chunked over max_response_bytes")
            << QByteArray(ok + "Transfer-Encoding: chunked\r\n\r\n400\r\n" + QByteArray(1024, 'a') +
                          "\r\n400\r\n" + QByteArray(1024, 'b') + "\r\n")
            << false << 502 << QByteArray() << u"failed"_qs;
        // Never closed: only the bound ends it before the deadline (a 504 would mean it waited).
        QTest::newRow("until close, over max_response_bytes")
            << QByteArray(ok + "\r\n" + QByteArray(3000, 'c')) << false << 502 << QByteArray()
            << u"failed"_qs;
        // A field with no name would be stored and replayed as an invalid line (": ab").
        QTest::newRow("header without a name")
            << QByteArray(ok + ": ab\r\nContent-Length: 2\r\n\r\nok") << false << 502
            << QByteArray() << u"failed"_qs;
        // Each field is looked up among the ones before it: 21 000 names took a second each.
        QByteArray many = ok;
        for (int i = 0; i < 300; ++i)
            many += "X-H" + QByteArray::number(i) + ": v\r\n";
        QTest::newRow("too many header fields") << QByteArray(many + "Content-Length: 2\r\n\r\nok")
                                                << false << 502 << QByteArray() << u"failed"_qs;
        // An endless run of interim answers kept the receiver's thread busy until the deadline.
        QByteArray interim;
        for (int i = 0; i < 9; ++i)
            interim += "HTTP/1.1 100 Continue\r\n\r\n";
        QTest::newRow("interim answers without end")
            << QByteArray(interim + ok + "Content-Length: 2\r\n\r\nok") << false << 502
            << QByteArray() << u"processing"_qs;
        QTest::newRow("status line over the header bound")
            << QByteArray("HTTP/1.1 200 " + QByteArray(70'000, 'K') +
                          "\r\nContent-Length: 2\r\n\r\nok")
            << false << 502 << QByteArray() << u"processing"_qs;
        // A 204 ends at its header section whatever its Content-Length says (RFC 9112 §6.3).
        QTest::newRow("204 with a Content-Length")
            << QByteArray("HTTP/1.1 204 No Content\r\nContent-Length: 12\r\n\r\n") << false << 204
            << QByteArray() << u"completed"_qs;
        // A transfer coding the desk cannot undo would be stored still coded, its header gone.
        QTest::newRow("gzip transfer coding")
            << QByteArray(ok + "Transfer-Encoding: gzip\r\n\r\n\x1f\x8b") << true << 502
            << QByteArray() << u"failed"_qs;
        // The desk's own answer headers are its to set: an app's would call a first answer a
        // replay.
        QTest::newRow("app's Idempotent-Replayed dropped")
            << QByteArray(ok + "Idempotent-Replayed: true\r\nIdempotency-Outcome: "
                               "replayed\r\nContent-Length: 2\r\n\r\nok")
            << false << 200 << QByteArray("ok") << u"completed"_qs;
    }
    void downstreamAnswerFraming()
    {
        QFETCH(QByteArray, answer);
        QFETCH(bool, closeAfter);
        QFETCH(int, status);
        QFETCH(QByteArray, body);
        QFETCH(QString, state);
        ScriptedDownstream down(answer, closeAfter);
        Desk desk = start(u"sqlite"_qs, endpoint("framing", down.url(),
                                                 ", \"max_response_bytes\": 2000, \"forward_timeout_seconds\": 20, \"lease_seconds\": 30"));
        const ClientResponse r = deliver(desk.port, "framing", "k1");
        QCOMPARE(r.status, status);
        QCOMPARE(down.requests().size(), 1);
        const auto stored = record(desk, u"framing:k1"_qs);
        QVERIFY(stored);
        QCOMPARE(name(stored->state), state);
        if (status == 502) {
            QVERIFY2(r.header("Content-Type").startsWith("application/problem+json"), r.body.constData());
            return;
        }
        QCOMPARE(r.body, body);
        QCOMPARE(r.header("Idempotency-Outcome"), QByteArray("processed"));
        QVERIFY(r.header("Idempotent-Replayed").isEmpty());
        if (status == 204) // no Content-Length in a 204 (RFC 9110 §8.6), first answer and replay
            for (const ClientResponse &answer : {r, deliver(desk.port, "framing", "k1")})
                QVERIFY2(!answer.headers.contains({"Content-Length", "0"}) &&
                             answer.header("Content-Length").isEmpty(),
                         answer.header("Content-Length").constData());
        QCOMPARE(stored->result.body, body);
        QVERIFY(!r.header("Transfer-Encoding").contains("chunked"));
        QVERIFY(headerValue(stored->result.headers, "Transfer-Encoding").isEmpty());
        QVERIFY(headerValue(stored->result.headers, "X-Trailer").isEmpty());
    }

    // A 3xx is the app's answer (failed, as any non-2xx), never followed to its Location.
    void redirectIsNotFollowed()
    {
        GatedDownstream elsewhere;
        ScriptedDownstream down("HTTP/1.1 307 Temporary Redirect\r\nLocation: " + elsewhere.url()
                                    + "\r\nContent-Length: 5\r\n\r\nmoved",
                                false);
        Desk desk = start(u"sqlite"_qs, endpoint("moved", down.url()));
        const ClientResponse r = deliver(desk.port, "moved", "k1");
        QCOMPARE(r.status, 307);
        QCOMPARE(r.header("Location"), elsewhere.url());
        QCOMPARE(r.body, QByteArray("moved"));
        QCOMPARE(name(record(desk, u"moved:k1"_qs)->state), name(KeyState::Failed));
        QCOMPARE(down.requests().size(), 1);
        QCOMPARE(elsewhere.count(), 0);
    }

    // https: the downstream's certificate is verified as usual — an untrusted one is 502 and
    // nothing is sent; once its issuer is trusted, the same downstream gets the delivery.
    void httpsCertificateIsVerified()
    {
        QTemporaryDir dir;
        const QString key = dir.filePath(u"key.pem"_qs), cert = dir.filePath(u"cert.pem"_qs);
        QByteArray out;
        QCOMPARE(runTool(u"openssl"_qs, {u"req"_qs, u"-x509"_qs, u"-newkey"_qs, u"rsa:2048"_qs, u"-nodes"_qs,
                                         u"-keyout"_qs, key, u"-out"_qs, cert, u"-days"_qs, u"1"_qs,
                                         u"-subj"_qs, u"/CN=127.0.0.1"_qs, u"-addext"_qs,
                                         u"subjectAltName=IP:127.0.0.1"_qs}, &out), 0);
        QFile keyFile(key), certFile(cert);
        QVERIFY(keyFile.open(QIODevice::ReadOnly) && certFile.open(QIODevice::ReadOnly));
        QSslConfiguration tls = QSslConfiguration::defaultConfiguration();
        tls.setLocalCertificate(QSslCertificate(&certFile));
        tls.setPrivateKey(QSslKey(&keyFile, QSsl::Rsa));
        tls.setPeerVerifyMode(QSslSocket::VerifyNone);
        QVERIFY(!tls.localCertificate().isNull() && !tls.privateKey().isNull());
        ScriptedDownstream down("HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\ntls ok", false, tls);
        Desk desk = start(u"sqlite"_qs, endpoint("tls", down.url()));

        ClientResponse r = deliver(desk.port, "tls", "k1");
        QCOMPARE(r.status, 502);
        QVERIFY2(r.body.contains("unreachable"), r.body.constData());
        QCOMPARE(down.requests().size(), 0);

        const QSslConfiguration before = QSslConfiguration::defaultConfiguration();
        auto restore = qScopeGuard([&] { QSslConfiguration::setDefaultConfiguration(before); });
        QSslConfiguration trusting = before;
        trusting.addCaCertificate(tls.localCertificate());
        QSslConfiguration::setDefaultConfiguration(trusting);
        r = deliver(desk.port, "tls", "k2");
        QCOMPARE(r.status, 200);
        QCOMPARE(r.body, QByteArray("tls ok"));
        QCOMPARE(down.requests().size(), 1);
        QVERIFY(down.requests().first().startsWith("POST /scripted HTTP/1.1\r\nHost: 127.0.0.1:"));
    }

    // Nothing listening: 502 at once, the key failed, and the message names the downstream
    // without the user info.
    void unreachableDownstreamIs502()
    {
        const RefusingPort refusing;
        const QByteArray url = "http://u:hunter2@127.0.0.1:" + refusing.number() + "/gone";
        Desk desk = start(u"sqlite"_qs, endpoint("gone", url, ", \"forward_timeout_seconds\": 20, \"lease_seconds\": 30"));
        const qint64 t0 = monotonicUs();
        const ClientResponse r = deliver(desk.port, "gone", "k1");
        QCOMPARE(r.status, 502);
        QVERIFY((monotonicUs() - t0) / 1000 < 10'000);
        QVERIFY2(r.body.contains("unreachable") && r.body.contains("refused"), r.body.constData());
        QVERIFY(!r.body.contains("hunter2"));
        const auto stored = record(desk, u"gone:k1"_qs);
        QCOMPARE(name(stored->state), name(KeyState::Failed));
        QVERIFY(!stored->error.contains(u"hunter2"_qs));
    }

    // A finish that meets a store error is retried while the lease lasts: the sender gets the
    // result, the key is completed, a duplicate is replayed (not 409, not a second run).
    void failedFinishIsRetried_data() { stores(); }
    void failedFinishIsRetried()
    {
        QFETCH(QString, backend);
        GatedDownstream down;
        down.close();
        const QByteArray ep = "retry" + g_run;
        Desk desk = start(backend, endpoint(ep, down.url(), ", \"forward_timeout_seconds\": 20, \"lease_seconds\": 40"));
        const QByteArray key = "k-" + backend.toLatin1();
        auto first = std::async(std::launch::async, [&] { return deliver(desk.port, ep, key); });
        QTRY_COMPARE_WITH_TIMEOUT(down.count(), 1, 10'000);

        // The fault, while the delivery is being processed: held until the desk has met it (its
        // finish failed and is being retried), then lifted — not for a fixed time, which a
        // loaded machine can outlast before the finish even starts.
        std::thread holder;
        std::promise<void> release;
        std::shared_future<void> released = release.get_future().share();
        QProcess psqlLock;
        const QString redisPort = qEnvironmentVariable("IDEM_TEST_REDIS_PORT");
        const QString pgUrl = qEnvironmentVariable("IDEM_TEST_POSTGRES_URL");
        if (backend == u"redis"_qs) {
            // Writes refused for longer than the desk's 3 s command timeout.
            QByteArray out;
            QCOMPARE(runTool(u"redis-cli"_qs, {u"-p"_qs, redisPort, u"CLIENT"_qs, u"PAUSE"_qs, u"60000"_qs, u"WRITE"_qs}, &out), 0);
        } else if (backend == u"postgres"_qs) {
            // Another session holds the row past the desk's 5 s statement timeout.
            const QString sql = u"BEGIN; SELECT 1 FROM idem_keys WHERE key = '%1' FOR UPDATE; SELECT pg_sleep(60); COMMIT;"_qs
                                    .arg(QString::fromLatin1(ep + ":" + key));
            psqlLock.start(u"psql"_qs, {pgUrl, u"-qc"_qs, sql});
            QTRY_VERIFY_WITH_TIMEOUT(
                [&] {
                    QByteArray out;
                    runTool(u"psql"_qs, {pgUrl, u"-Atc"_qs,
                                         u"SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) WHERE a.query LIKE '%%pg_sleep(60)%%' AND l.locktype = 'transactionid' AND a.pid <> pg_backend_pid()"_qs},
                            &out);
                    return out.trimmed().toInt() > 0;
                }(),
                10'000);
        } else {
            // Another process holds the write lock past the desk's 5 s busy timeout.
            const QByteArray path = QFile::encodeName(m_dir.filePath(u"e%1.db"_qs.arg(m_seq)));
            bool taken = false;
            holder = holdWriteLock(
                path, [released] { released.wait_for(std::chrono::seconds(60)); }, taken);
            QVERIFY(taken);
        }
        bool lifted = false;
        auto liftFault = [&] {
            if (std::exchange(lifted, true))
                return;
            QByteArray out;
            if (backend == u"redis"_qs)
                runTool(u"redis-cli"_qs, {u"-p"_qs, redisPort, u"CLIENT"_qs, u"UNPAUSE"_qs}, &out);
            else if (backend == u"postgres"_qs)
                runTool(u"psql"_qs, {pgUrl, u"-Atc"_qs,
                                     u"SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE query LIKE '%%pg_sleep(60)%%' AND pid <> pg_backend_pid()"_qs},
                        &out);
            release.set_value();
            if (holder.joinable())
                holder.join();
        };
        const qint64 retriesBefore = desk.receiver->engine()->counters().finishRetries;
        down.open();
        auto answered = std::async(std::launch::async, [&] { return first.get(); });
        const auto liftOnFailure = qScopeGuard(liftFault); // a failed QVERIFY returns early
        QTRY_VERIFY2_WITH_TIMEOUT(desk.receiver->engine()->counters().finishRetries > retriesBefore,
                                  "the finish never met the fault", 30'000);
        liftFault();
        const ClientResponse r = answered.get();
        psqlLock.waitForFinished(20'000);
        QVERIFY2(r.status == 200, r.body.constData());
        QCOMPARE(r.header("Idempotency-Outcome"), QByteArray("processed"));
        const QString stored = QString::fromLatin1(ep + ":" + key);
        QCOMPARE(name(record(desk, stored)->state), name(KeyState::Completed));
        const ClientResponse again = deliver(desk.port, ep, key);
        QCOMPARE(again.status, 200);
        QCOMPARE(again.header("Idempotency-Outcome"), QByteArray("replayed"));
        QCOMPARE(down.count(), 1);
    }

    // A store that answers but refuses writes — SQLite's write lock held by another program past
    // the desk's busy timeout, PostgreSQL out of disk, Redis out of memory: a duplicate of a
    // completed delivery still gets its stored answer (the count of deliveries is what the store
    // refused, and the delivery log says so), a new key is refused (503) and nothing runs, and
    // /readyz says not ready. Once writes go through again, all is as before.
    void duplicatesAreAnsweredWhileTheStoreRefusesWrites_data() { stores(); }
    void duplicatesAreAnsweredWhileTheStoreRefusesWrites()
    {
        QFETCH(QString, backend);
        GatedDownstream down;
        const QByteArray ep = "refuse" + g_run;
        Desk desk = start(backend, endpoint(ep, down.url()));
        const ClientResponse first = deliver(desk.port, ep, "k1");
        QCOMPARE(first.status, 200);
        const QString stored = QString::fromLatin1(ep + ":k1");

        std::thread holder;
        std::promise<void> release;
        std::shared_future<void> released = release.get_future().share();
        const QString redisPort = qEnvironmentVariable("IDEM_TEST_REDIS_PORT");
        std::optional<PgDiskFull> pgFull;
        QByteArray out;
        if (backend == u"redis"_qs) {
            QCOMPARE(
                runTool(u"redis-cli"_qs,
                        {u"-p"_qs, redisPort, u"CONFIG"_qs, u"SET"_qs, u"maxmemory"_qs, u"1"_qs},
                        &out),
                0);
        } else if (backend == u"postgres"_qs) {
            // Its keys and its log alike, as a full disk refuses both (the log written meanwhile
            // was a write that went through, and /readyz said ready).
            pgFull.emplace(QString::fromLatin1(ep), QStringList{u"INSERT OR UPDATE ON idem_keys"_qs,
                                                                u"INSERT ON idem_deliveries"_qs});
            QVERIFY(pgFull->ok());
        } else {
            bool taken = false;
            holder = holdWriteLock(
                QFile::encodeName(m_dir.filePath(u"e%1.db"_qs.arg(m_seq))),
                [released] { released.wait_for(std::chrono::seconds(60)); }, taken);
            QVERIFY(taken);
        }
        bool lifted = false;
        auto liftFault = [&] {
            if (std::exchange(lifted, true))
                return;
            QByteArray ignored;
            if (backend == u"redis"_qs)
                runTool(u"redis-cli"_qs,
                        {u"-p"_qs, redisPort, u"CONFIG"_qs, u"SET"_qs, u"maxmemory"_qs, u"0"_qs},
                        &ignored);
            else if (pgFull)
                pgFull->lift();
            release.set_value();
            if (holder.joinable())
                holder.join();
        };
        const auto liftOnFailure = qScopeGuard(liftFault); // a failed QVERIFY returns early

        const ClientResponse fresh = deliver(desk.port, ep, "k2");
        QVERIFY2(fresh.status == 503, fresh.body.constData());
        const ClientResponse again = deliver(desk.port, ep, "k1");
        QVERIFY2(again.status == 200, again.body.constData());
        QCOMPARE(again.header("Idempotency-Outcome"), QByteArray("replayed"));
        QCOMPARE(again.body, first.body);
        // After the duplicate: its answer without the count is a refused write too.
        RawConnection probe(desk.port);
        probe.send("GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n");
        QCOMPARE(probe.readResponse().status, 503);
        QCOMPARE(down.count(), 1);

        liftFault();
        QCOMPARE(record(desk, stored)->attempts, 1); // the refused count was not written
        QCOMPARE(deliver(desk.port, ep, "k1").header("Idempotency-Outcome"),
                 QByteArray("replayed"));
        QCOMPARE(record(desk, stored)->attempts, 2);
        QCOMPARE(deliver(desk.port, ep, "k2").header("Idempotency-Outcome"),
                 QByteArray("processed"));
        QCOMPARE(down.count(), 2);
        // The answer without its count is in the delivery log, kept while the store refused it.
        auto uncountedLine = [&desk, &stored] {
            DeliveryQuery query;
            query.key = stored;
            auto lines = desk.pool->run<QList<DeliveryEvent>>(
                [&](IdempotencyStore &s) { return s.deliveries(query); });
            if (lines)
                for (const DeliveryEvent &e : *lines)
                    if (e.outcome == Outcome::Replayed && e.detail.startsWith(u"not counted: "_qs))
                        return e.detail;
            return QString();
        };
        QTRY_VERIFY_WITH_TIMEOUT(!uncountedLine().isEmpty(), 15'000);
    }

    // The delivery log kept while the store refused it is written back a part at a time: a
    // backlog larger than one transaction the store then takes (room for some rows, not all —
    // a disk just freed) is written, not retried whole for ever.
    void aLogBacklogIsWrittenBackInParts()
    {
        const QByteArray ep = "backlog" + g_run;
        PgDiskFull full(QString::fromLatin1(ep), {u"INSERT ON idem_deliveries"_qs}, 600);
        QVERIFY(full.ok());
        Desk desk = start(u"postgres"_qs, "[{\"name\": \"" + ep + "\"}]");
        // One key, processed then replayed: each delivery one entry of the log (rejections
        // past 100 would be summarised, IdempotencyEngine::logRejection).
        for (int i = 0; i < 2000; ++i)
            QCOMPARE(post(desk.port, "/hooks/" + ep, "{}", {{"Idempotency-Key", "k"}}).status, 200);
        QTRY_VERIFY_WITH_TIMEOUT(
            desk.pool->health().writesFailing(QDateTime::currentMSecsSinceEpoch()), 10'000);
        QVERIFY(full.allow()); // then a transaction's first 600 rows only
        QTRY_COMPARE_WITH_TIMEOUT(PgDiskFull::logged(QString::fromLatin1(ep)), 2000, 30'000);
    }

    // The delivery log left at shutdown is written then, waiting for each part (it was handed
    // over and dropped: a part the store refused was lost without a word); what the store refuses
    // then is said lost.
    void theLogLeftAtShutdownIsWrittenOrSaidLost()
    {
        const QByteArray ep = "shutdown" + g_run;
        PgDiskFull full(QString::fromLatin1(ep), {u"INSERT ON idem_deliveries"_qs});
        QVERIFY(full.ok());
        const QByteArray config = "[{\"name\": \"" + ep + "\"}]";
        {
            Desk desk = start(u"postgres"_qs, config);
            for (int i = 0; i < 20; ++i) // rejected (no key): logged, nothing claimed
                QCOMPARE(post(desk.port, "/hooks/" + ep, "{}").status, 400);
            QTRY_VERIFY_WITH_TIMEOUT(
                desk.pool->health().writesFailing(QDateTime::currentMSecsSinceEpoch()), 10'000);
            QTest::ignoreMessage(
                QtWarningMsg,
                QRegularExpression(
                    u"^delivery log: 20 deliveries not written at shutdown, lost: .*No space left"_qs));
            desk.receiver.reset(); // stops, as serve and the window do
        }
        QVERIFY(full.allow());
        {
            Desk desk = start(u"postgres"_qs, config);
            for (int i = 0; i < 30; ++i)
                QCOMPARE(post(desk.port, "/hooks/" + ep, "{}").status, 400);
            desk.receiver.reset(); // at once: the log is still the desk's
        }
        QCOMPARE(PgDiskFull::logged(QString::fromLatin1(ep)), 30);
    }

    // Back-pressure refuses new claims, never a finish; finishes run before waiting claims.
    void poolRunsFinishesFirstAndNeverRefusesThem()
    {
        StorePool pool(storeFactory(*StoreUrl::parse(u"sqlite:"_qs + m_dir.filePath(u"pool.db"_qs))), 1, 2);
        QObject context;
        std::promise<void> gate;
        std::shared_future<void> opened = gate.get_future().share();
        std::mutex mutex;
        QStringList order;
        auto job = [&](const QString &what) {
            return [&, what](IdempotencyStore &) -> Result<Ok> {
                std::lock_guard lock(mutex);
                order << what;
                return Ok{};
            };
        };
        QStringList refused;
        auto done = [&](const QString &what) {
            return [&, what](Result<Ok> r) {
                if (!r)
                    refused << what + u": "_qs + r.error().message;
            };
        };
        pool.submit<Ok>(&context, [opened](IdempotencyStore &) -> Result<Ok> { opened.wait(); return Ok{}; }, [](Result<Ok>) {});
        QTRY_COMPARE(pool.queued(), 0); // the worker holds the first job
        pool.submit<Ok>(&context, job(u"claim1"_qs), done(u"claim1"_qs));
        pool.submit<Ok>(&context, job(u"claim2"_qs), done(u"claim2"_qs));
        pool.submit<Ok>(&context, job(u"claim3"_qs), done(u"claim3"_qs)); // over the limit of 2
        for (int i = 0; i < 5; ++i)
            pool.submit<Ok>(&context, job(u"finish%1"_qs.arg(i)), done(u"finish%1"_qs.arg(i)),
                            StorePool::Batch::Alone, StorePool::Priority::Finish);
        gate.set_value();
        QTRY_COMPARE(pool.queued(), 0);
        QTRY_COMPARE(refused.size(), 1);
        QVERIFY2(refused.first().startsWith(u"claim3: "_qs) && refused.first().contains(u"overloaded"_qs), qPrintable(refused.first()));
        std::lock_guard lock(mutex);
        QCOMPARE(order, QStringList({u"finish0"_qs, u"finish1"_qs, u"finish2"_qs, u"finish3"_qs, u"finish4"_qs,
                                     u"claim1"_qs, u"claim2"_qs}));
    }

    // The Redis lane refuses claims past its in-flight bound, never a finish.
    void redisLaneNeverRefusesAFinish()
    {
        const auto url = StoreUrl::parse(qEnvironmentVariable("IDEM_TEST_REDIS_URL"));
        QVERIFY(url.ok());
        StorePool health(storeFactory(*url), 1);
        RedisLane lane(*url, RedisOptions{}, health, 1);
        QByteArray out;
        QCOMPARE(runTool(u"redis-cli"_qs, {u"-p"_qs, qEnvironmentVariable("IDEM_TEST_REDIS_PORT"), u"CLIENT"_qs,
                                           u"PAUSE"_qs, u"800"_qs, u"ALL"_qs}, &out), 0);
        ClaimRequest c;
        c.endpoint = u"lane"_qs + QString::fromLatin1(g_run);
        c.key = c.endpoint + u":a"_qs;
        c.provider = u"generic"_qs;
        c.fingerprint = "f";
        std::optional<Result<ClaimResult>> first, second;
        std::optional<Result<FinishVerdict>> finish;
        lane.claim(c, [&](Result<ClaimResult> r) { first = std::move(r); });
        ClaimRequest other = c;
        other.key = c.endpoint + u":b"_qs;
        lane.claim(other, [&](Result<ClaimResult> r) { second = std::move(r); });
        FinishRequest f;
        f.key = c.key;
        f.token = 1;
        lane.finish(f, [&](Result<FinishVerdict> r) { finish = std::move(r); });
        QTRY_VERIFY_WITH_TIMEOUT(first && second && finish, 10'000);
        QVERIFY(first->ok());
        QVERIFY(!second->ok());
        QVERIFY2(second->error().message.contains(u"overloaded"_qs), qPrintable(second->error().message));
        QVERIFY2(finish->ok(), finish->ok() ? "" : qPrintable(finish->error().message)); // answered by Redis
    }

    // SendGrid batches (docs/http.md#sendgrid-batches): every element new → the original bytes and
    // signature go to the app; a subset → its own array, without the signature that covered the
    // whole.
    void sendgridForwardsTheOriginalBytes_data() { stores(); }
    void sendgridForwardsTheOriginalBytes()
    {
        QFETCH(QString, backend);
        GatedDownstream down;
        const QByteArray ep = "sg" + g_run;
        Desk desk = start(backend, "[{\"name\": \"" + ep + "\", \"provider\": \"sendgrid\", \"forward_to\": \"" + down.url() + "\"}]");
        const QByteArray id = backend.toLatin1() + g_run;
        const QByteArray batch = "[ {\"sg_event_id\": \"" + id + "-1\", \"event\": \"delivered\"},\n"
                                 "  {\"sg_event_id\": \"" + id + "-2\", \"event\": \"open\"} ]";
        const HeaderList signature{{"X-Twilio-Email-Event-Webhook-Signature", "MEUCIQ=="},
                                   {"X-Twilio-Email-Event-Webhook-Timestamp", "1700000000"},
                                   {"Content-Type", "application/json"}};
        const ClientResponse r = post(desk.port, "/hooks/" + ep, batch, signature);
        QCOMPARE(r.status, 200);
        QCOMPARE(down.count(), 1);
        QCOMPARE(down.requests().at(0).body, batch); // byte for byte
        QCOMPARE(down.requests().at(0).header("X-Twilio-Email-Event-Webhook-Signature"), QByteArray("MEUCIQ=="));
        const QList<QByteArray> tokens = down.requests().at(0).header("Idempotency-Fencing-Token").split(',');
        QCOMPARE(tokens.size(), 2);

        const QByteArray mixed = "[{\"sg_event_id\": \"" + id + "-2\", \"event\": \"open\"}, {\"sg_event_id\": \"" + id + "-3\", \"event\": \"click\"}]";
        QCOMPARE(post(desk.port, "/hooks/" + ep, mixed, signature).status, 200);
        QCOMPARE(down.count(), 2);
        const HttpRequest subset = down.requests().at(1);
        QCOMPARE(QJsonDocument::fromJson(subset.body).array().size(), 1);
        QCOMPARE(QJsonDocument::fromJson(subset.body).array().at(0).toObject().value(u"sg_event_id"_qs).toString(),
                 QString::fromLatin1(id + "-3"));
        QVERIFY(subset.header("X-Twilio-Email-Event-Webhook-Signature").isEmpty());
    }

    // Events without sg_event_id are told apart by their whole body, its canonical JSON: two
    // clicks of one recipient on two links in the same second are two events, each run once,
    // in one batch or in two; the same event sent again, its members in another order and
    // spaced otherwise, is replayed.
    void sendgridClicksInOneSecondAreTwoEvents_data() { everyStore(); }
    void sendgridClicksInOneSecondAreTwoEvents()
    {
        QFETCH(QString, backend);
        GatedDownstream down;
        const QByteArray ep = "sgc" + g_run;
        Desk desk = start(backend, sendgrid(ep, down.url()));
        const QByteArray message = backend.toLatin1() + g_run;
        auto click = [&](const QByteArray &url) {
            return "{\"email\":\"a@example.com\",\"event\":\"click\",\"sg_message_id\":\"" +
                   message + "\",\"timestamp\":1700000000,\"url\":\"" + url + "\"}";
        };
        const QByteArray path = "/hooks/" + ep;
        ClientResponse r = post(desk.port, path, "[" + click("a") + "," + click("b") + "]");
        QCOMPARE(r.status, 200);
        QCOMPARE(jsonOf(r).value(u"events").toInt(), 2);
        QCOMPARE(jsonOf(r).value(u"processed").toInt(), 2);
        QCOMPARE(post(desk.port, path, "[" + click("c") + "]").status, 200);
        r = post(desk.port, path, "[" + click("d") + "]");
        QCOMPARE(r.status, 200);
        QCOMPARE(jsonOf(r).value(u"processed").toInt(), 1);
        const QByteArray again = "[ {\"url\": \"b\", \"timestamp\": 1700000000, \"sg_message_id\": \"" +
                                 message + "\",\n \"event\": \"click\", \"email\": \"a@example.com\"} ]";
        r = post(desk.port, path, again);
        QCOMPARE(r.status, 200);
        QCOMPARE(jsonOf(r).value(u"replayed").toInt(), 1);
        QCOMPARE(jsonOf(r).value(u"processed").toInt(), 0);
        const QHash<QString, int> n = received(down, u"url"_qs);
        QCOMPARE(n.size(), 4);
        for (const QString &url : {u"a"_qs, u"b"_qs, u"c"_qs, u"d"_qs})
            QVERIFY2(n.value(url) == 1, qPrintable(url));
    }

    // An event that gives another's key (its sg_event_id) to a different body is a mismatch,
    // in the same batch or a later one: never run, never answered 2xx (the sender keeps it and
    // retries it), logged with its body. The same event twice in one batch is run once.
    void sendgridNeverAnswers2xxForAnEventReusingAKey_data() { everyStore(); }
    void sendgridNeverAnswers2xxForAnEventReusingAKey()
    {
        QFETCH(QString, backend);
        GatedDownstream down;
        const QByteArray ep = "sgm" + g_run;
        Desk desk = start(backend, sendgrid(ep, down.url()));
        const QByteArray id = backend.toLatin1() + g_run;
        auto event = [&](const char *n, const char *url) {
            return "{\"sg_event_id\":\"" + id + n + "\",\"event\":\"click\",\"url\":\"" +
                   QByteArray(url) + "\"}";
        };
        const QByteArray path = "/hooks/" + ep;
        // In one batch: the first of the two runs, the second is refused, and so is every retry.
        const QByteArray both = "[" + event("x", "a") + "," + event("x", "b") + "]";
        for (int attempt = 0; attempt < 2; ++attempt) {
            const ClientResponse r = post(desk.port, path, both);
            QCOMPARE(r.status, 422);
            QCOMPARE(r.header("Idempotency-Outcome"), QByteArray("mismatch"));
            QVERIFY2(r.body.contains("1 of the 2 events"), r.body.constData());
        }
        // Across batches: the new event of the second batch runs, the reused key does not.
        QCOMPARE(post(desk.port, path, "[" + event("y", "c") + "]").status, 200);
        QCOMPARE(post(desk.port, path, "[" + event("y", "d") + "," + event("z", "e") + "]").status,
                 422);
        // The same event twice in one batch, spaced otherwise: one run, and 2xx.
        const ClientResponse twice = post(
            desk.port, path,
            "[" + event("w", "f") + ", { \"url\" : \"f\", \"event\" : \"click\", \"sg_event_id\" : \"" +
                id + "w\" }]");
        QCOMPARE(twice.status, 200);
        QCOMPARE(jsonOf(twice).value(u"events").toInt(), 2);
        QCOMPARE(jsonOf(twice).value(u"processed").toInt(), 1);
        QCOMPARE(jsonOf(twice).value(u"repeated").toInt(), 1);

        const QHash<QString, int> n = received(down, u"url"_qs);
        const QHash<QString, int> expected{{u"a"_qs, 1}, {u"c"_qs, 1}, {u"e"_qs, 1}, {u"f"_qs, 1}};
        QCOMPARE(n, expected);
        // Each refusal is in the log with the body refused.
        auto refused = [&](const QByteArray &n) {
            DeliveryQuery query;
            query.key = QString::fromLatin1(ep + ":" + id + n);
            QByteArrayList bodies;
            if (auto lines = desk.pool->run<QList<DeliveryEvent>>(
                    [&](IdempotencyStore &s) { return s.deliveries(query); }))
                for (const DeliveryEvent &e : *lines)
                    if (e.outcome == Outcome::Mismatch)
                        bodies << e.payload;
            return bodies;
        };
        QTRY_COMPARE(refused("x").size(), 2);
        QVERIFY2(refused("x").at(0).contains("\"url\":\"b\""), refused("x").at(0).constData());
        QTRY_COMPARE(refused("y").size(), 1);
        QVERIFY(refused("y").at(0).contains("\"url\":\"d\""));
    }

    // on_mismatch "ignore" holds inside a batch as across batches: another body under a key
    // already in the batch is a duplicate of the first, counted as repeated, and the batch is 2xx.
    void sendgridIgnoresAMismatchInsideABatchWhenToldTo()
    {
        GatedDownstream down;
        const QByteArray ep = "sgi" + g_run;
        Desk desk = start(u"sqlite"_qs, sendgrid(ep, down.url(), ", \"on_mismatch\": \"ignore\""));
        auto event = [&](const char *url) {
            return "{\"sg_event_id\":\"i" + g_run + "\",\"event\":\"click\",\"url\":\"" +
                   QByteArray(url) + "\"}";
        };
        const ClientResponse both =
            post(desk.port, "/hooks/" + ep, "[" + event("a") + "," + event("b") + "]");
        QCOMPARE(both.status, 200);
        QCOMPARE(jsonOf(both).value(u"processed").toInt(), 1);
        QCOMPARE(jsonOf(both).value(u"repeated").toInt(), 1);
        const ClientResponse later = post(desk.port, "/hooks/" + ep, "[" + event("c") + "]");
        QCOMPARE(later.status, 200);
        QCOMPARE(jsonOf(later).value(u"replayed").toInt(), 1);
        QCOMPARE(received(down, u"url"_qs), (QHash<QString, int>{{u"a"_qs, 1}}));
    }

    // An event is told apart, keyed, stored and forwarded by its bytes as sent, never by a
    // double: two events whose ids differ only past 2^53 (with or without sg_event_id) are two
    // events, each run once, and one forwarded in a subset, like its record, keeps its digits
    // verbatim.
    void sendgridEventsDifferingOnlyPast2To53AreDistinct_data() { everyStore(); }
    void sendgridEventsDifferingOnlyPast2To53AreDistinct()
    {
        QFETCH(QString, backend);
        GatedDownstream down;
        const QByteArray ep = "sgn" + g_run;
        Desk desk = start(backend, sendgrid(ep, down.url()));
        const QByteArray run = backend.toLatin1() + g_run;
        const QByteArray path = "/hooks/" + ep;
        auto keyless = [&](const char *id) {
            return "{\"event\":\"open\",\"run\":\"" + run + "\",\"id\":" + QByteArray(id) + "}";
        };
        auto keyed = [&](const char *id) {
            return "{\"event\":\"open\",\"run\":\"" + run + "\",\"sg_event_id\":" + id + "}";
        };
        // Past 2^64, and past 2^53: a double holds neither pair apart.
        const QByteArray four = "[" + keyless("18446744073709551000") + "," +
                                keyless("18446744073709551001") + "," + keyed("9007199254740993") +
                                "," + keyed("9007199254740992") + "]";
        ClientResponse r = post(desk.port, path, four);
        QCOMPARE(r.status, 200);
        QCOMPARE(jsonOf(r).value(u"events").toInt(), 4);
        QCOMPARE(jsonOf(r).value(u"processed").toInt(), 4);
        QCOMPARE(jsonOf(r).value(u"repeated").toInt(), 0);
        QCOMPARE(down.count(), 1);
        QCOMPARE(down.requests().at(0).body, four);
        QVERIFY(record(desk, QString::fromLatin1(ep + ":9007199254740993")));
        QVERIFY(record(desk, QString::fromLatin1(ep + ":9007199254740992")));

        // Re-sent with a new event: only that one runs, forwarded as the sender wrote it.
        const QByteArray big = "{\"event\":\"click\", \"sg_event_id\":\"" + run +
                               "-big\", \"n\":12345678901234567890, \"f\":1.50}";
        r = post(desk.port, path, four.chopped(1) + "," + big + "]");
        QCOMPARE(r.status, 200);
        QCOMPARE(jsonOf(r).value(u"processed").toInt(), 1);
        QCOMPARE(jsonOf(r).value(u"replayed").toInt(), 4);
        QCOMPARE(down.count(), 2);
        QCOMPARE(down.requests().at(1).body, "[" + big + "]");
        const std::optional<KeyRecord> stored =
            record(desk, QString::fromLatin1(ep + ":" + run + "-big"));
        QVERIFY(stored);
        QCOMPARE(stored->request.body, "[" + big + "]");
    }

    // An element that names a member twice has no one meaning (QJsonDocument keeps the last,
    // other readers the first): the batch is refused with 400, saying so, and nothing of it is
    // claimed or run. Nor does such a variant of a completed event get a 2xx replay.
    void sendgridRefusesAnElementNamingAMemberTwice_data() { everyStore(); }
    void sendgridRefusesAnElementNamingAMemberTwice()
    {
        QFETCH(QString, backend);
        GatedDownstream down;
        const QByteArray ep = "sgd" + g_run;
        Desk desk = start(backend, sendgrid(ep, down.url()));
        const QByteArray id = backend.toLatin1() + g_run;
        const QByteArray path = "/hooks/" + ep;
        const QByteArray done = "{\"sg_event_id\":\"" + id + "-1\",\"url\":\"a\"}";
        QCOMPARE(post(desk.port, path, "[" + done + "]").status, 200);
        const QList<QByteArray> twice{
            "[{\"sg_event_id\":\"" + id + "-2\",\"url\":\"a\",\"url\":\"b\"}]",
            // The same member twice, once escaped; and twice deeper in the element.
            "[{\"sg_event_id\":\"" + id + "-3\",\"url\":\"a\",\"\\u0075rl\":\"b\"}]",
            "[{\"sg_event_id\":\"" + id + "-4\",\"x\":{\"y\":[{\"z\":1,\"z\":2}]}}]",
            // The completed event again, its url once more as it was: QJsonDocument reads the
            // same event, the sender wrote another.
            "[" + done + ",{\"sg_event_id\":\"" + id + "-1\",\"url\":\"b\",\"url\":\"a\"}]",
        };
        for (const QByteArray &batch : twice) {
            const ClientResponse r = post(desk.port, path, batch);
            QCOMPARE(r.status, 400);
            QVERIFY2(r.body.contains("twice in one object"), r.body.constData());
        }
        QCOMPARE(down.count(), 1);
        for (const char *n : {"-2", "-3", "-4"})
            QVERIFY2(!record(desk, QString::fromLatin1(ep + ":" + id + n)), n);
    }

    // More events in one batch than max_batch_elements: refused whole (413, saying why), before
    // anything is claimed or stored.
    void aBatchOverMaxBatchElementsIsRefusedWhole_data() { everyStore(); }
    void aBatchOverMaxBatchElementsIsRefusedWhole()
    {
        QFETCH(QString, backend);
        GatedDownstream down;
        const QByteArray ep = "sgx" + g_run;
        Desk desk = start(backend, sendgrid(ep, down.url(), ", \"max_batch_elements\": 3"));
        const QByteArray id = backend.toLatin1() + g_run;
        QByteArray batch = "[";
        for (int i = 0; i < 4; ++i)
            batch += QByteArray(i ? "," : "") + "{\"sg_event_id\":\"" + id + QByteArray::number(i) + "\"}";
        const ClientResponse r = post(desk.port, "/hooks/" + ep, batch + "]");
        QCOMPARE(r.status, 413);
        QCOMPARE(r.header("Content-Type"), QByteArray("application/problem+json"));
        QVERIFY2(r.body.contains("max_batch_elements 3"), r.body.constData());
        QCOMPARE(down.count(), 0);
        KeyQuery all;
        all.endpoint = QString::fromLatin1(ep);
        QCOMPARE(desk.pool->run<QList<KeyRecord>>([&](IdempotencyStore &s) {
                     return s.listKeys(all);
                 })->size(),
                 0);
        // Three are taken.
        QCOMPARE(post(desk.port, "/hooks/" + ep, batch.left(batch.lastIndexOf(',')) + "]").status,
                 200);
        QCOMPARE(down.count(), 1);
    }

    // The attack shape: many tiny events, under large headers or none. The headers and the app's
    // one answer are stored once for the batch, so 12 KB of headers cost the store about 12 KB,
    // not 12 KB per event; and the worst case, the smallest events that are each a key of their
    // own, grows the store by a bounded number of bytes per request byte (docs/security.md
    // states the figure measured here). Every event's record still reads its headers.
    void aBatchOfTinyEventsGrowsTheStoreBoundedly_data() { everyStore(); }
    void aBatchOfTinyEventsGrowsTheStoreBoundedly()
    {
        QFETCH(QString, backend);
        const QByteArray ep = "sgb" + g_run;
        // The built-in processor: its answer lists the batch's 2,000 keys (some 160 KB).
        Desk desk = start(backend, "[{\"name\": \"" + ep + "\", \"provider\": \"sendgrid\"}]");
        const QString sqlitePath = m_dir.filePath(u"e%1.db"_qs.arg(m_seq));
        constexpr int kEvents = 2000;
        // What a batch of kEvents events `{"n":<i + from>}` under `headers` grows the store by,
        // and its request's bytes (body, header lines).
        auto grow = [&](int from, const HeaderList &headers) -> std::pair<qint64, qint64> {
            QByteArray body = "[";
            for (int i = from; i < from + kEvents; ++i)
                body += QByteArray(i > from ? "," : "") + "{\"n\":" + QByteArray::number(i) + "}";
            body += "]";
            qint64 requestBytes = body.size();
            for (const auto &[name, value] : headers)
                requestBytes += name.size() + value.size() + 4;
            const qint64 before = storeBytes(backend, sqlitePath);
            const ClientResponse r = post(desk.port, "/hooks/" + ep, body, headers);
            if (r.status != 200 || jsonOf(r).value(u"processed").toInt() != kEvents)
                return {-1, requestBytes};
            // Every event's delivery is in the log (written after the answer) before measuring.
            DeliveryQuery logged;
            logged.endpoint = QString::fromLatin1(ep);
            logged.limit = 3 * kEvents;
            const bool allLogged = QTest::qWaitFor(
                [&] {
                    auto lines = desk.pool->run<QList<DeliveryEvent>>(
                        [&](IdempotencyStore &s) { return s.deliveries(logged); });
                    return lines && lines->size() >= from + kEvents;
                },
                30'000);
            if (!allLogged)
                return {-2, requestBytes};
            return {storeBytes(backend, sqlitePath) - before, requestBytes};
        };
        // The worst case: the smallest events, no header beyond the client's own; measured
        // after a first such batch, which also makes what a store makes once (on a cluster,
        // the buckets' indexes and the replicas' buffers: 3 MB more).
        QVERIFY(grow(0, {}).first > 0);
        const auto [bare, bareRequest] = grow(kEvents, {});
        QVERIFY(bare > 0);
        HeaderList padding;
        // 12 KB: within 100 fields and 16 KB (HttpLimits); random, as PostgreSQL compresses
        // what repeats.
        for (int i = 0; i < 60; ++i) {
            QByteArray random(142, Qt::Uninitialized);
            QRandomGenerator::global()->fillRange(reinterpret_cast<quint32 *>(random.data()),
                                                 random.size() / 4);
            padding.append({"X-Padding-" + QByteArray::number(i), random.toBase64()});
        }
        const qint64 padded = grow(2 * kEvents, padding).first;
        QVERIFY(padded > 0);
        const double perRequestByte = double(bare) / double(bareRequest);
        qInfo("%s: %d events in %lld request bytes grew the store by %lld bytes: %.0f per "
              "request byte (%lld per event); with 12 KB more headers by %lld bytes",
              qPrintable(backend), kEvents, bareRequest, bare, perRequestByte, bare / kEvents,
              padded);
        // Kept in every record, the 12 KB of headers alone were 24 MB; here they add what they
        // weigh, give or take what the stores' allocators round.
        QVERIFY2(padded - bare < 2'000'000,
                 qPrintable(u"the headers cost %1 bytes"_qs.arg(padded - bare)));
        QVERIFY2(perRequestByte <= 250,
                 qPrintable(u"%1 store bytes per request byte"_qs.arg(perRequestByte)));

        const KeyRecord first = *record(desk, QString::fromLatin1(ep) + u":e-"_qs +
                                                  QString::fromLatin1(sha256Hex("{\"n\":4000}")));
        QCOMPARE(headerValue(first.request.headers, "X-Padding-59"), padding.last().second);
        QCOMPARE(first.request.body, QByteArray("[{\"n\":4000}]"));
    }

    // An element whose finish is refused (a newer claim took it over) is not completed by this
    // delivery: the answer is not 2xx, so the sender retries and gets the newer result.
    void sendgridAnswersNot2xxWhenAnElementIsSuperseded_data() { stores(); }
    void sendgridAnswersNot2xxWhenAnElementIsSuperseded()
    {
        QFETCH(QString, backend);
        GatedDownstream down;
        down.close();
        const QByteArray ep = "sgs" + g_run;
        Desk desk = start(backend, "[{\"name\": \"" + ep + "\", \"provider\": \"sendgrid\", \"forward_to\": \"" + down.url() + "\"}]");
        const QByteArray id = backend.toLatin1() + g_run;
        const QByteArray batch = "[{\"sg_event_id\": \"" + id + "-a\"}, {\"sg_event_id\": \"" + id + "-b\"}]";
        auto answer = std::async(std::launch::async, [&] { return post(desk.port, "/hooks/" + ep, batch); });
        QTRY_COMPARE_WITH_TIMEOUT(down.count(), 1, 10'000);
        // One element's lease ends under the run (as it does when its finish is held up by a
        // store fault) and a new delivery takes it over (a new token).
        const QString a = QString::fromLatin1(ep + ":" + id + "-a");
        QVERIFY(endLeaseNow(backend, a));
        auto takenOver =
            desk.pool->run<ClaimResult>([&](IdempotencyStore &s) -> Result<ClaimResult> {
                ClaimRequest c;
                c.key = a;
                c.endpoint = QString::fromLatin1(ep);
                c.provider = u"sendgrid"_qs;
                auto held = s.key(a); // the same event (a different body would be a mismatch)
                if (!held || !held->has_value())
                    return makeError(ErrorCode::NotFound, u"no record of the element"_qs);
                c.fingerprint = (*held)->fingerprint;
                return s.claim(c);
            });
        QVERIFY(takenOver.ok() && takenOver->claimed());
        down.open();
        const ClientResponse r = answer.get();
        QVERIFY2(r.status < 200 || r.status >= 300, qPrintable(u"status %1: %2"_qs.arg(r.status).arg(QString::fromUtf8(r.body))));
        QCOMPARE(name(record(desk, a)->state), name(KeyState::Processing)); // the newer claim's
        QCOMPARE(record(desk, a)->token, takenOver->record.token);
        QCOMPARE(name(record(desk, QString::fromLatin1(ep + ":" + id + "-b"))->state), name(KeyState::Completed));
    }

    // Leases are decided on the store's clock: a second desk whose clock is 90 s ahead sees a
    // live lease as live (409), and does not run the event a second time.
    void skewedInstanceKeepsTheGuarantee_data()
    {
        QTest::addColumn<QString>("backend");
        QTest::newRow("redis") << u"redis"_qs;
        QTest::newRow("postgres") << u"postgres"_qs;
    }
    void skewedInstanceKeepsTheGuarantee()
    {
        QFETCH(QString, backend);
        const QString faketime = u"/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"_qs;
        QVERIFY2(QFile::exists(faketime), "libfaketime is missing (Debian package faketime; ./dev installs it)");
        GatedDownstream down;
        down.close();
        const QByteArray ep = "skew" + g_run;
        QFile config(m_dir.filePath(u"skew.json"_qs));
        QVERIFY(config.open(QIODevice::WriteOnly));
        config.write("{\"endpoints\": " + endpoint(ep, down.url(), ", \"forward_timeout_seconds\": 20, \"lease_seconds\": 30") + "}");
        config.close();
        const QStringList args{u"--config"_qs, config.fileName(), u"--store"_qs, storeUrl(backend, m_dir, 0)};
        quint16 portA = 0, portB = 0;
        auto a = startServe(QStringLiteral(IDEMDESK_BIN), args, portA);
        QProcessEnvironment skewed = QProcessEnvironment::systemEnvironment();
        skewed.insert(u"LD_PRELOAD"_qs, faketime);
        skewed.insert(u"FAKETIME"_qs, u"+90s"_qs);
        auto b = startServe(QStringLiteral(IDEMDESK_BIN), args, portB, nullptr, false, skewed);
        QVERIFY(portA && portB);
        const QByteArray key = "k-" + backend.toLatin1();
        auto first = std::async(std::launch::async, [&] { return deliver(portA, ep, key); });
        QTRY_COMPARE_WITH_TIMEOUT(down.count(), 1, 10'000);
        const ClientResponse duplicate = deliver(portB, ep, key);
        QCOMPARE(duplicate.header("Idempotency-Outcome"), QByteArray("in-progress"));
        QCOMPARE(duplicate.status, 409);
        down.open();
        QCOMPARE(first.get().status, 200);
        const ClientResponse later = deliver(portB, ep, key);
        QCOMPARE(later.header("Idempotency-Outcome"), QByteArray("replayed"));
        QCOMPARE(down.count(), 1);
        for (auto *p : {a.get(), b.get()}) {
            p->terminate();
            p->waitForFinished(10'000);
        }
    }

    // PostgreSQL's purge against a claim re-taking an expired row: the purge read the row as
    // expired, then waited for the claim's row lock; READ COMMITTED checked only the DELETE's own
    // condition again, and the fresh claim was deleted: its key ran twice. The purge asks again of
    // each row it deletes whether it is expired. The re-take is held open here, as a slow commit
    // would hold it.
    void postgresPurgeSparesARowRetakenMeanwhile()
    {
        const QString url = qEnvironmentVariable("IDEM_TEST_POSTGRES_URL");
        auto pool = openStorePool(url, 2);
        QVERIFY2(pool.ok(), pool.ok() ? "" : qPrintable(pool.error().message));
        const QString key = u"purge:%1"_qs.arg(QString::fromLatin1(g_run));
        ClaimRequest claim;
        claim.key = key;
        claim.endpoint = u"purge"_qs;
        claim.provider = u"generic"_qs;
        claim.fingerprint = "f";
        claim.policy.ttlMs = 500;
        QVERIFY((*pool)->run<ClaimResult>([&](IdempotencyStore &s) { return s.claim(claim); }));
        QVERIFY(QTest::qWaitFor(
            [&] {
                return !(*pool)
                            ->run<std::optional<KeyRecord>>(
                                [&](IdempotencyStore &s) { return s.key(key); })
                            ->has_value();
            },
            5000));

        pqxx::connection retaking(url.toStdString()), watching(url.toStdString());
        pqxx::work retake(retaking);
        retake.exec_params(
            "UPDATE idem_keys SET state = 'processing', expires_at_ms = idem_now_ms() + 600000,"
            " lease_until_ms = idem_now_ms() + 60000 WHERE key = $1",
            key.toStdString());
        auto purged = std::async(std::launch::async, [&] {
            return (*pool)->run<qint64>([](IdempotencyStore &s) { return s.purgeExpired(); });
        });
        // The purge has read the row and waits for its lock.
        QVERIFY(QTest::qWaitFor(
            [&] {
                pqxx::nontransaction n(watching);
                return n.exec("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                              " AND query LIKE 'DELETE FROM idem_keys%'")[0][0]
                           .as<int>() > 0;
            },
            10'000));
        retake.commit();
        QVERIFY(purged.get());
        const auto kept =
            (*pool)->run<std::optional<KeyRecord>>([&](IdempotencyStore &s) { return s.key(key); });
        QVERIFY(kept && kept->has_value());
        QCOMPARE(name((*kept)->state), name(KeyState::Processing));
    }

    // A batch's shared content outlives every record naming it, even when PostgreSQL's purge
    // takes the expired row while the batch writes it: the batch sees the row, the purge
    // (holding it here, as a slow purge would) deletes it, and the batch's records must still
    // find their headers.
    void postgresPurgeCannotTakeSharedContentABatchNames()
    {
        const QString url = qEnvironmentVariable("IDEM_TEST_POSTGRES_URL");
        auto pool = openStorePool(url, 2);
        QVERIFY2(pool.ok(), pool.ok() ? "" : qPrintable(pool.error().message));
        const QString ep = u"sharedpurge%1"_qs.arg(QString::fromLatin1(g_run));
        const HeaderList headers{{"Content-Type", "application/json"}, {"X-Run", ep.toUtf8()}};
        const QByteArray ref = sharedRef(headersJson(headers));
        auto batchOf = [&](const QString &k) {
            ClaimRequest r;
            r.key = ep + u":"_qs + k;
            r.endpoint = ep;
            r.provider = u"sendgrid"_qs;
            r.fingerprint = "f" + k.toUtf8();
            r.policy.ttlMs = 600'000;
            r.policy.leaseMs = 60'000;
            r.request.body = "{}";
            r.request.headers = headers;
            r.request.headersRef = ref;
            return QList<ClaimRequest>{r};
        };
        auto claimBatch = [&](const QString &k) {
            return (*pool)->run<QList<ClaimResult>>(
                [&](IdempotencyStore &s) { return s.claimBatch(batchOf(k)); });
        };
        QVERIFY(claimBatch(u"a"_qs));
        pqxx::connection purging(url.toStdString()), watching(url.toStdString());
        {
            pqxx::nontransaction n(watching);
            n.exec_params("UPDATE idem_shared SET expires_at_ms = idem_now_ms() - 1"
                          " WHERE sha256 = $1",
                          ref.toStdString());
        }
        pqxx::work purge(purging);
        QCOMPARE(purge.exec_params("SELECT 1 FROM idem_shared WHERE sha256 = $1 FOR UPDATE",
                                   ref.toStdString())
                     .size(),
                 1);
        auto second = std::async(std::launch::async, [&] { return claimBatch(u"b"_qs); });
        // The batch has found the row and waits for it.
        QVERIFY(QTest::qWaitFor(
            [&] {
                pqxx::nontransaction n(watching);
                return n.exec("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type ="
                              " 'Lock' AND query LIKE '%idem_shared%'")[0][0]
                           .as<int>() > 0;
            },
            10'000));
        purge.exec_params("DELETE FROM idem_shared WHERE sha256 = $1 AND expires_at_ms <="
                          " idem_now_ms()",
                          ref.toStdString());
        purge.commit();
        const auto claimed = second.get();
        QVERIFY2(claimed.ok(), claimed.ok() ? "" : qPrintable(claimed.error().message));
        QVERIFY(claimed->first().claimed());
        {
            pqxx::nontransaction n(watching);
            QCOMPARE(n.exec_params("SELECT count(*) FROM idem_shared WHERE sha256 = $1 AND"
                                   " expires_at_ms > idem_now_ms() + 600000",
                                   ref.toStdString())[0][0]
                         .as<int>(),
                     1);
        }
        const auto stored = (*pool)->run<std::optional<KeyRecord>>(
            [&](IdempotencyStore &s) { return s.key(ep + u":b"_qs); });
        QVERIFY2(stored.ok() && stored->has_value(),
                 stored.ok() ? "absent" : qPrintable(stored.error().message));
        QCOMPARE((*stored)->request.headers, headers);
    }

    // ?wait_replicas=N: a claim or finish that N replicas did not acknowledge is refused (503),
    // so a failover cannot lose a claim whose event then ran. The refused claim's key is listed
    // all the same (it is in the store, processing until its lease ends).
    void redisWaitReplicasRefusesUnreplicatedWrites()
    {
        QTemporaryDir masterDir, replicaDir;
        RedisServer master(masterDir.path()), replica(replicaDir.path());
        QVERIFY(master.start());
        GatedDownstream down;
        const QString url =
            master.url() +
            u"?wait_replicas=1&wait_timeout_ms=1000"_qs; // 1 s: a replica on a loaded machine acks
                                                         // within it
        Desk desk = startDesk("{\"endpoints\": " + endpoint("w", down.url()) + "}", url);

        QStringList details; // the delivery log's: why (the sender is told nothing of the store)
        QObject context;
        QObject::connect(desk.receiver->engine(), &IdempotencyEngine::delivered, &context,
                         [&details](const DeliveryEvent &e) { details << e.detail; });
        const ClientResponse alone = deliver(desk.port, "w", "k1");
        QCOMPARE(alone.status, 503);
        QVERIFY2(!alone.body.contains("replicas"), alone.body.constData());
        QTRY_VERIFY2(details.join(u" | "_qs).contains(u"replicas"_qs),
                     qPrintable(details.join(u" | "_qs)));
        QCOMPARE(down.count(), 0); // refused before anything ran
        KeyQuery processing;
        processing.state = KeyState::Processing;
        const auto listed = desk.pool->run<QList<KeyRecord>>(
            [&](IdempotencyStore &s) { return s.listKeys(processing); });
        QVERIFY(listed && listed->size() == 1 && listed->first().key == u"w:k1"_qs);

        QVERIFY(replica.start({u"--replicaof"_qs, u"127.0.0.1"_qs, QString::number(master.port())}));
        QTRY_VERIFY_WITH_TIMEOUT(
            [&] {
                QByteArray out;
                runTool(u"redis-cli"_qs, {u"-p"_qs, QString::number(master.port()), u"INFO"_qs, u"replication"_qs}, &out);
                return out.contains("connected_slaves:1") && out.contains("state=online");
            }(),
            20'000);
        const ClientResponse replicated = deliver(desk.port, "w", "k2");
        QCOMPARE(replicated.status, 200);
        QCOMPARE(down.count(), 1);
    }

    // The desk says when Redis may lose acknowledged records (eviction, no persistence).
    void redisDurabilityWarnings()
    {
        QTemporaryDir dir;
        RedisServer redis(dir.path()); // AOF, appendfsync always, noeviction
        QVERIFY(redis.start());
        auto pool = openStorePool(redis.url());
        QVERIFY(pool.ok());
        auto warnings = [&] { return *(*pool)->run<QStringList>([](IdempotencyStore &s) { return s.durabilityWarnings(); }); };
        QCOMPARE(warnings(), QStringList());
        const QString port = QString::number(redis.port());
        QCOMPARE(runTool(u"redis-cli"_qs, {u"-p"_qs, port, u"CONFIG"_qs, u"SET"_qs, u"maxmemory-policy"_qs, u"allkeys-lru"_qs}), 0);
        QCOMPARE(runTool(u"redis-cli"_qs, {u"-p"_qs, port, u"CONFIG"_qs, u"SET"_qs, u"appendfsync"_qs, u"everysec"_qs}), 0);
        QStringList found = warnings();
        QCOMPARE(found.size(), 2);
        QVERIFY2(found.at(0).contains(u"allkeys-lru"_qs), qPrintable(found.at(0)));
        QVERIFY2(found.at(1).contains(u"everysec"_qs), qPrintable(found.at(1)));
        QCOMPARE(runTool(u"redis-cli"_qs, {u"-p"_qs, port, u"CONFIG"_qs, u"SET"_qs, u"appendonly"_qs, u"no"_qs}), 0);
        found = warnings();
        QVERIFY2(found.last().contains(u"persists nothing"_qs), qPrintable(found.join(u"; "_qs)));
    }

    // A config whose lease could end while its delivery is still processed is refused at start.
    void serveRefusesALeaseShorterThanTheForwardTimeout()
    {
        QFile config(m_dir.filePath(u"short-lease.json"_qs));
        QVERIFY(config.open(QIODevice::WriteOnly));
        config.write("{\"endpoints\": [{\"name\": \"a\", \"lease_seconds\": 5, \"forward_timeout_seconds\": 30}]}");
        config.close();
        QProcess serve;
        serve.start(QStringLiteral(IDEMDESK_BIN), {u"serve"_qs, u"--config"_qs, config.fileName(), u"--listen"_qs,
                                                   u"127.0.0.1:0"_qs, u"--store"_qs, u"sqlite:"_qs + m_dir.filePath(u"x.db"_qs)});
        QVERIFY(serve.waitForFinished(10'000));
        QCOMPARE(serve.exitCode(), 2);
        const QByteArray err = serve.readAllStandardError();
        QVERIFY2(err.contains("endpoints[0].lease_seconds") && err.contains("forward_timeout_seconds"), err.constData());
    }
};

QTEST_GUILESS_MAIN(TestExactlyOnce)
#include "tst_exactly_once.moc"
