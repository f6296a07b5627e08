// What only Redis has: the script cache can be flushed under the desk, prefixes keep desks
// apart on one server, and a hung server times out (503) instead of hanging the receiver; and
// the receiver thread's own asynchronous lane (RedisLane) keeps all of that too.
#include "http/blockingclient.h"
#include "store/redislane.h"
#include "store/redisprotocol.h"
#include "store/redisstore.h"
#include "store/storefactory.h"
#include "support/desk.h"
#include "support/faultproxy.h"
#include "support/names.h"
#include "support/servers.h"
#include "util/clock.h"

#include <QElapsedTimer>
#include <QFile>
#include <QProcess>
#include <QScopeGuard>
#include <QTemporaryDir>
#include <QTest>

#include <hiredis.h>

#include <arpa/inet.h>
#include <atomic>
#include <csignal>
#include <mutex>
#include <netinet/in.h>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>

using namespace idem;
using namespace idem::test;

namespace {
ClaimRequest claimOf(const QString &key)
{
    ClaimRequest c;
    c.key = key;
    c.endpoint = key.section(u':', 0, 0);
    c.provider = u"generic"_qs;
    c.fingerprint = "f";
    c.policy.leaseMs = 60'000;
    c.policy.ttlMs = 3'600'000;
    c.request = {"POST", "/hooks/x", {{"X-A", "1"}}, "{\"a\":1}"};
    return c;
}

// Waits, running the event loop, for a lane's answer.
template<typename T, typename Call>
Result<T> await(Call call)
{
    std::optional<Result<T>> answer;
    call([&](Result<T> r) { answer = std::move(r); });
    (void)QTest::qWaitFor([&] { return answer.has_value(); }, 20'000);
    return answer ? std::move(*answer) : Result<T>(makeError(ErrorCode::Internal, u"no answer in 20 s"_qs));
}

Result<ClaimResult> laneClaim(StoreLane &lane, const ClaimRequest &c)
{
    return await<ClaimResult>([&](auto done) { lane.claim(c, done); });
}

Result<FinishVerdict> laneFinish(StoreLane &lane, const QString &key, qint64 token, const QByteArray &body)
{
    FinishRequest f;
    f.key = key;
    f.token = token;
    f.state = KeyState::Completed;
    f.result = {201, {{"X-R", "r"}}, body};
    return await<FinishVerdict>([&](auto done) { lane.finish(f, done); });
}

// A pool on `url` and the lane the engine would get from it, used from this thread.
struct LaneOn
{
    std::shared_ptr<StorePool> pool;
    QObject context;
    std::unique_ptr<StoreLane> lane;
    explicit LaneOn(const QString &url)
    {
        if (auto opened = openStorePool(url)) {
            pool = *opened;
            lane = pool->lane(&context);
        }
    }
};

bool redisCli(quint16 port, const QStringList &args, QByteArray *out = nullptr)
{
    QProcess cli;
    cli.start(u"redis-cli"_qs, QStringList{u"-p"_qs, QString::number(port)} + args);
    const bool ok = cli.waitForFinished(5000) && cli.exitCode() == 0;
    if (out)
        *out = cli.readAllStandardOutput();
    return ok;
}

// Runs a script of Redis layout v1 (tests/fixtures/redis-v1: common.lua prepended, as the
// previous release loaded them); its answer's lines.
QList<QByteArray> runV1(quint16 port, const char *script, const QStringList &argv)
{
    QFile common(QStringLiteral(IDEM_REDIS_V1 "/common.lua"));
    QFile file(QStringLiteral(IDEM_REDIS_V1 "/%1.lua").arg(QLatin1String(script)));
    if (!common.open(QIODevice::ReadOnly) || !file.open(QIODevice::ReadOnly))
        return {};
    const QString source = QString::fromUtf8(common.readAll() + "\n" + file.readAll());
    QByteArray out;
    if (!redisCli(port, QStringList{u"EVAL"_qs, source, u"0"_qs} + argv, &out))
        return {};
    return out.trimmed().split('\n');
}
// Runs a script of Redis layout v2 or v3 (tests/fixtures/redis-v2, redis-v3: `dir`), loaded as
// those releases did (the history cap and common.lua prepended), on `keys`; its answer's lines.
QList<QByteArray> runScript(const QString &dir, quint16 port, const char *script,
                            const QStringList &keys, const QStringList &argv)
{
    QFile common(dir + u"/common.lua"_qs);
    QFile file(dir + u"/%1.lua"_qs.arg(QLatin1String(script)));
    if (!common.open(QIODevice::ReadOnly) || !file.open(QIODevice::ReadOnly))
        return {};
    const QString source =
        QString::fromUtf8("local CAP = 64\n" + common.readAll() + "\n" + file.readAll());
    QByteArray out;
    if (!redisCli(port, QStringList{u"EVAL"_qs, source, QString::number(keys.size())} + keys + argv,
                  &out))
        return {};
    return out.trimmed().split('\n');
}
QList<QByteArray> runV2(quint16 port, const char *script, const QStringList &keys,
                        const QStringList &argv)
{
    return runScript(QStringLiteral(IDEM_REDIS_V2), port, script, keys, argv);
}
QList<QByteArray> runV3(quint16 port, const char *script, const QStringList &keys,
                        const QStringList &argv)
{
    return runScript(QStringLiteral(IDEM_REDIS_V3), port, script, keys, argv);
}
// A record's key in the current layout (a single Redis: one bucket), for redis-cli.
QString recordOf(const QString &prefix, const QString &key)
{
    return QString::fromUtf8(redis::Layout(prefix.toUtf8(), 1).record(key));
}

// A Redis that answers each command by its name from `answers` (RESP bytes; "+OK" for the rest),
// on a thread of its own: a hostile or broken server, for the desk's reading of what it says.
class FakeRedis
{
public:
    explicit FakeRedis(QHash<QByteArray, QByteArray> answers) : m_answers(std::move(answers))
    {
        m_listener = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        ::bind(m_listener, reinterpret_cast<sockaddr *>(&a), sizeof a);
        ::listen(m_listener, 16);
        socklen_t len = sizeof a;
        ::getsockname(m_listener, reinterpret_cast<sockaddr *>(&a), &len);
        m_port = ntohs(a.sin_port);
        m_thread = std::thread([this] { serve(); });
    }
    ~FakeRedis()
    {
        m_stop = true;
        ::shutdown(m_listener, SHUT_RDWR);
        ::close(m_listener);
        m_thread.join();
    }
    quint16 port() const { return m_port; }

private:
    void serve()
    {
        std::vector<std::thread> clients;
        for (;;) {
            const int fd = ::accept(m_listener, nullptr, nullptr);
            if (fd < 0 || m_stop)
                break;
            clients.emplace_back([this, fd] { answer(fd); });
        }
        for (auto &c : clients)
            c.join();
    }
    void answer(int fd)
    {
        timeval t{10, 0};
        ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &t, sizeof t);
        QByteArray in;
        char buffer[4096];
        for (;;) {
            // Whole commands only: *N, then N bulk strings; the first names the answer.
            QList<QByteArray> args;
            qsizetype at = 0;
            bool whole = false;
            if (in.startsWith('*')) {
                const qsizetype eol = in.indexOf("\r\n");
                const int n = eol > 0 ? in.mid(1, eol - 1).toInt() : -1;
                at = eol + 2;
                for (int i = 0; eol > 0 && i < n; ++i) {
                    const qsizetype end = in.indexOf("\r\n", at);
                    if (end < 0 || in.at(at) != '$')
                        break;
                    const int size = in.mid(at + 1, end - at - 1).toInt();
                    if (in.size() < end + 2 + size + 2)
                        break;
                    args << in.mid(end + 2, size);
                    at = end + 2 + size + 2;
                }
                whole = eol > 0 && args.size() == n;
            }
            if (!whole) {
                const ssize_t got = ::recv(fd, buffer, sizeof buffer, 0);
                if (got <= 0)
                    break;
                in.append(buffer, got);
                continue;
            }
            in.remove(0, at);
            const QByteArray name = (args.value(0) + ' ' + args.value(1)).toUpper();
            QByteArray out =
                m_answers.value(name, m_answers.value(args.value(0).toUpper(), "+OK\r\n"));
            ::send(fd, out.constData(), size_t(out.size()), MSG_NOSIGNAL);
        }
        ::close(fd);
    }
    QHash<QByteArray, QByteArray> m_answers;
    int m_listener = -1;
    quint16 m_port = 0;
    std::atomic<bool> m_stop{false};
    std::thread m_thread;
};
constexpr qint64 kTombstoneMs = 86'400'000; // common.lua's TOKEN_GRACE_MS

QByteArray bulk(const QByteArray &s)
{
    return "$" + QByteArray::number(s.size()) + "\r\n" + s + "\r\n";
}

// What a FakeRedis answers for the blocking store to connect: a single Redis of layout v4, one
// bucket, its scripts loaded and its clock read.
QHash<QByteArray, QByteArray> connectingAnswers()
{
    return {{"CLUSTER INFO", "-ERR This instance has cluster support disabled\r\n"},
            {"SCRIPT LOAD", bulk(QByteArray(40, 'a'))},
            {"GET", bulk("4")},
            {"GET IDEM:BUCKETS", bulk("1")},
            {"TIME", "*2\r\n" + bulk("1700000000") + bulk("0")}};
}
} // namespace

class TestRedis : public QObject
{
    Q_OBJECT
    QTemporaryDir m_dir;
    std::unique_ptr<RedisServer> m_redis;

private Q_SLOTS:
    void initTestCase()
    {
        m_redis = std::make_unique<RedisServer>(m_dir.path());
        QVERIFY(m_redis->start());
    }

    void scriptCacheFlushedUnderTheDesk()
    {
        auto store = RedisStore::connect(*StoreUrl::parse(m_redis->url()));
        QVERIFY(store.ok());
        QVERIFY((*store)->claim(claimOf(u"flush:a"_qs))->claimed());
        QProcess cli;
        cli.start(u"redis-cli"_qs, {u"-p"_qs, QString::number(m_redis->port()), u"SCRIPT"_qs, u"FLUSH"_qs});
        QVERIFY(cli.waitForFinished(5000));
        QCOMPARE(cli.readAllStandardOutput().trimmed(), QByteArray("OK"));
        // NOSCRIPT: loaded again and run once; the answer is the real one.
        auto again = (*store)->claim(claimOf(u"flush:a"_qs));
        QVERIFY2(again.ok(), again.ok() ? "" : qPrintable(again.error().message));
        QCOMPARE(name(again->decision.action), name(ClaimAction::InProgress));
        QCOMPARE((*(*store)->key(u"flush:a"_qs))->attempts, 2);
    }

    // Redis out of memory (maxmemory reached, noeviction) refuses writes: a new key is refused
    // (503), but a duplicate of a completed one still gets its stored answer — the claim
    // script's count of deliveries seen is a write Redis may refuse, not a decision.
    void duplicatesAreReplayedWhenRedisIsOutOfMemory()
    {
        auto store = RedisStore::connect(*StoreUrl::parse(m_redis->url()));
        QVERIFY(store.ok());
        const ClaimResult first = *(*store)->claim(claimOf(u"oom:a"_qs));
        QVERIFY(first.claimed());
        FinishRequest f;
        f.key = u"oom:a"_qs;
        f.token = first.record.token;
        f.state = KeyState::Completed;
        f.result = {201, {{"X-R", "r"}}, "stored"};
        QCOMPARE(name(*(*store)->finish(f)), name(FinishVerdict::Accept));
        QVERIFY(redisCli(m_redis->port(), {u"CONFIG"_qs, u"SET"_qs, u"maxmemory"_qs, u"1"_qs}));
        auto restore = qScopeGuard([&] { redisCli(m_redis->port(), {u"CONFIG"_qs, u"SET"_qs, u"maxmemory"_qs, u"0"_qs}); });
        const auto replay = (*store)->claim(claimOf(u"oom:a"_qs));
        QVERIFY2(replay.ok(), replay.ok() ? "" : qPrintable(replay.error().message));
        QCOMPARE(name(replay->decision.action), name(ClaimAction::Replay));
        QCOMPARE(replay->record.result.status, 201);
        QCOMPARE(replay->record.result.body, QByteArray("stored"));
        const auto refused = (*store)->claim(claimOf(u"oom:b"_qs));
        QVERIFY(!refused.ok());
        QVERIFY2(refused.error().message.contains(u"OOM"_qs), qPrintable(refused.error().message));
    }

    // A delivery log Redis refuses (out of memory) is an error, which the desk keeps for later:
    // the XADDs' answers went unread, and the log was lost without a word.
    void aRefusedDeliveryLogIsAnError()
    {
        auto store = RedisStore::connect(*StoreUrl::parse(m_redis->url()));
        QVERIFY(store.ok());
        DeliveryEvent e;
        e.atMs = QDateTime::currentMSecsSinceEpoch();
        e.endpoint = u"oomlog"_qs;
        e.key = u"oomlog:a"_qs;
        e.outcome = Outcome::Processed;
        e.status = 200;
        QVERIFY((*store)->appendDeliveries({e}).ok());
        QVERIFY(redisCli(m_redis->port(), {u"CONFIG"_qs, u"SET"_qs, u"maxmemory"_qs, u"1"_qs}));
        auto restore = qScopeGuard([&] {
            redisCli(m_redis->port(), {u"CONFIG"_qs, u"SET"_qs, u"maxmemory"_qs, u"0"_qs});
        });
        const auto refused = (*store)->appendDeliveries({e, e});
        QVERIFY(!refused.ok());
        QVERIFY2(refused.error().message.contains(u"OOM"_qs), qPrintable(refused.error().message));
    }

    // A store that answers reads but refuses writes (Redis out of memory): /readyz says not
    // ready while the last write failed (it said ready, with every new delivery refused), and
    // ready again once a write goes through.
    void readinessFollowsWrites()
    {
        Desk desk = startDesk("{\"endpoints\": [{\"name\": \"ready\"}]}", m_redis->url());
        auto readyz = [&desk] {
            RawConnection c(desk.port, 5000);
            c.send("GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n");
            return c.readResponse().status;
        };
        auto deliver = [&desk](const QByteArray &key) {
            return post(desk.port, "/hooks/ready", "{}", {{"Idempotency-Key", key}}).status;
        };
        QCOMPARE(deliver("r1"), 200);
        QCOMPARE(readyz(), 200);
        QVERIFY(redisCli(m_redis->port(), {u"CONFIG"_qs, u"SET"_qs, u"maxmemory"_qs, u"1"_qs}));
        auto restore = qScopeGuard([&] { redisCli(m_redis->port(), {u"CONFIG"_qs, u"SET"_qs, u"maxmemory"_qs, u"0"_qs}); });
        QCOMPARE(deliver("r2"), 503);
        QCOMPARE(readyz(), 503);
        QVERIFY(redisCli(m_redis->port(), {u"CONFIG"_qs, u"SET"_qs, u"maxmemory"_qs, u"0"_qs}));
        QCOMPARE(deliver("r2"), 200);
        QCOMPARE(readyz(), 200);
    }

    // A listing longer than a chunk of the index while new keys arrive names each key once: the
    // index is read a chunk at a time by rank, and new keys push the older ones down (a long
    // `keys list` repeated some).
    void aLongListingNamesEachKeyOnce()
    {
        auto store = RedisStore::connect(*StoreUrl::parse(m_redis->url()));
        QVERIFY(store.ok());
        for (int i = 0; i < 2500; ++i)
            QVERIFY((*store)->claim(claimOf(u"long:%1"_qs.arg(i))).ok());
        std::atomic<bool> stop{false};
        std::thread arriving([&stop, url = m_redis->url()] {
            auto other = RedisStore::connect(*StoreUrl::parse(url));
            for (int i = 0; other && !stop; ++i)
                (void)(*other)->claim(claimOf(u"long:new%1"_qs.arg(i)));
        });
        const auto stopArriving = qScopeGuard([&] {
            stop = true;
            arriving.join();
        });
        KeyQuery q;
        q.endpoint = u"long"_qs;
        q.limit = 100'000;
        for (int round = 0; round < 5; ++round) {
            const auto listed = (*store)->listKeys(q);
            QVERIFY(listed.ok());
            QSet<QString> keys;
            for (const KeyRecord &r : *listed)
                keys.insert(r.key);
            QVERIFY(listed->size() >= 2500);
            QCOMPARE(keys.size(), listed->size());
        }
    }

    void prefixesKeepDesksApart()
    {
        auto one = RedisStore::connect(*StoreUrl::parse(m_redis->url() + u"?prefix=desk1:"_qs));
        auto two = RedisStore::connect(*StoreUrl::parse(m_redis->url() + u"?prefix=desk2:"_qs));
        QVERIFY(one.ok() && two.ok());
        QVERIFY((*one)->claim(claimOf(u"shared:k"_qs))->claimed());
        QVERIFY((*two)->claim(claimOf(u"shared:k"_qs))->claimed()); // another desk: its own key
        QCOMPARE((*one)->countKeys(u"shared"_qs)->total(), 1);
        KeyQuery q;
        const auto listed = (*two)->listKeys(q);
        QVERIFY(listed.ok());
        QCOMPARE(listed->size(), 1);
        QCOMPARE(listed->first().key, u"shared:k"_qs);
    }

    void aHungServerTimesOut()
    {
        // One connection: a claim sent and never answered is in doubt, and never retried.
        auto store = RedisStore::connect(*StoreUrl::parse(m_redis->url()));
        QVERIFY(store.ok());
        ::kill(pid_t(m_redis->pid()), SIGSTOP);
        QElapsedTimer t;
        t.start();
        auto hung = (*store)->claim(claimOf(u"hang:b"_qs));
        const qint64 waited = t.elapsed();
        ::kill(pid_t(m_redis->pid()), SIGCONT);
        QVERIFY(!hung.ok());
        QVERIFY2(hung.error().code == ErrorCode::InDoubt, qPrintable(hung.error().message));
        QVERIFY2(waited < 10'000, qPrintable(QString::number(waited)));

        // Through the pool: every call of a hung server fails within its timeout (503 for the
        // sender), the pool reports it, and the next call after it wakes up works again.
        auto pool = openStorePool(m_redis->url());
        QVERIFY(pool.ok());
        ::kill(pid_t(m_redis->pid()), SIGSTOP);
        auto during = (*pool)->run<ClaimResult>([](IdempotencyStore &s) { return s.claim(claimOf(u"hang:c"_qs)); });
        ::kill(pid_t(m_redis->pid()), SIGCONT);
        QVERIFY(!during.ok());
        QVERIFY(during.error().code == ErrorCode::InDoubt || during.error().code == ErrorCode::Unavailable);
        QVERIFY(!(*pool)->health().healthy);
        auto after = (*pool)->run<ClaimResult>([](IdempotencyStore &s) { return s.claim(claimOf(u"hang:d"_qs)); });
        QVERIFY2(after.ok(), after.ok() ? "" : qPrintable(after.error().message));
        QVERIFY((*pool)->health().healthy);
    }

    // A link Redis closed while it sat idle (CLIENT KILL here; a restart, its timeout) is
    // replaced before the next call rather than failing it (a listing's error, a log write
    // put off): the pool asks the store before each call, as it does PostgreSQL's.
    void linksClosedWhileIdleAreReplaced()
    {
        auto pool = openStorePool(m_redis->url());
        QVERIFY(pool.ok());
        const auto count = [&] {
            return (*pool)->run<StateCounts>([](IdempotencyStore &s) { return s.countKeys({}); });
        };
        for (int i = 0; i < 20; ++i)
            QVERIFY(count().ok());
        QVERIFY(redisCli(m_redis->port(), {u"CLIENT"_qs, u"KILL"_qs, u"TYPE"_qs, u"normal"_qs}));
        for (int i = 0; i < 20; ++i) {
            auto after = count();
            QVERIFY2(after.ok(), after.ok() ? "" : qPrintable(after.error().message));
        }
    }

    void laneSpeaksTheStoreProtocol()
    {
        // Database 3 of the server: the lane selects it on connecting, as the store does.
        const QString url = m_redis->url().section(u'/', 0, 2) + u"/3"_qs;
        LaneOn on(url);
        QVERIFY(on.lane);
        auto &lane = on.lane;
        auto &pool = on.pool;
        QVERIFY(dynamic_cast<RedisLane *>(lane.get()));

        const ClaimRequest c = claimOf(u"lane:a"_qs);
        auto first = laneClaim(*lane, c);
        QVERIFY2(first.ok(), first.ok() ? "" : qPrintable(first.error().message));
        QCOMPARE(name(first->decision.action), name(ClaimAction::Create));
        QCOMPARE(first->record.attempts, 1);
        QCOMPARE(first->record.request.body, c.request.body);
        auto second = laneClaim(*lane, c);
        QCOMPARE(name(second->decision.action), name(ClaimAction::InProgress));
        QCOMPARE(second->record.token, first->record.token);
        QCOMPARE(name(*laneFinish(*lane, c.key, first->record.token + 1, "x")), name(FinishVerdict::StaleToken));
        QCOMPARE(name(*laneFinish(*lane, c.key, first->record.token, "done")), name(FinishVerdict::Accept));
        auto replay = laneClaim(*lane, c);
        QCOMPARE(name(replay->decision.action), name(ClaimAction::Replay));
        QCOMPARE(replay->record.result.status, 201);
        QCOMPARE(replay->record.result.body, QByteArray("done"));
        QCOMPARE(headerValue(replay->record.result.headers, "X-R"), QByteArray("r"));
        QCOMPARE(replay->record.attempts, 3);

        // The same record, read by the blocking store: in database 3, not in 0.
        auto three = RedisStore::connect(*StoreUrl::parse(url));
        auto zero = RedisStore::connect(*StoreUrl::parse(m_redis->url()));
        QVERIFY(three.ok() && zero.ok());
        QCOMPARE((*(*three)->key(c.key))->history.size(), 2);
        QVERIFY(!(*(*zero)->key(c.key)).has_value());
        QVERIFY(pool->health().healthy);

        // Many calls in one turn of the event loop go out together and each gets its own answer.
        int created = 0, answered = 0;
        for (int i = 0; i < 500; ++i)
            lane->claim(claimOf(u"lane:many-%1"_qs.arg(i % 250)), [&](Result<ClaimResult> r) {
                ++answered;
                created += r.ok() && r->claimed();
            });
        QTRY_COMPARE_WITH_TIMEOUT(answered, 500, 20'000);
        QCOMPARE(created, 250);
    }

    void laneReloadsAFlushedScriptCache()
    {
        LaneOn on(m_redis->url());
        QVERIFY(on.lane);
        auto &lane = on.lane;
        QVERIFY(laneClaim(*lane, claimOf(u"laneflush:a"_qs))->claimed());
        QVERIFY(redisCli(m_redis->port(), {u"SCRIPT"_qs, u"FLUSH"_qs}));
        auto again = laneClaim(*lane, claimOf(u"laneflush:a"_qs));
        QVERIFY2(again.ok(), again.ok() ? "" : qPrintable(again.error().message));
        QCOMPARE(name(again->decision.action), name(ClaimAction::InProgress));
        QVERIFY(laneClaim(*lane, claimOf(u"laneflush:b"_qs))->claimed()); // cached again
    }

    void laneTimesOutAHungServerAndConnectsAgain()
    {
        LaneOn on(m_redis->url());
        QVERIFY(on.lane);
        auto &lane = on.lane;
        auto &pool = on.pool;
        QVERIFY(laneClaim(*lane, claimOf(u"lanehang:a"_qs))->claimed());
        ::kill(pid_t(m_redis->pid()), SIGSTOP);
        QElapsedTimer t;
        t.start();
        auto hung = laneClaim(*lane, claimOf(u"lanehang:b"_qs));
        const qint64 waited = t.elapsed();
        ::kill(pid_t(m_redis->pid()), SIGCONT);
        QVERIFY(!hung.ok());
        QVERIFY2(hung.error().code == ErrorCode::InDoubt, qPrintable(hung.error().message));
        QVERIFY2(hung.error().message.contains(u"no answer within"_qs), qPrintable(hung.error().message));
        QVERIFY2(waited >= 2'000 && waited < 10'000, qPrintable(QString::number(waited)));
        QVERIFY(!pool->health().healthy);
        auto after = laneClaim(*lane, claimOf(u"lanehang:c"_qs));
        QVERIFY2(after.ok(), after.ok() ? "" : qPrintable(after.error().message));
        QVERIFY(pool->health().healthy);
    }

    void laneAuthenticatesAndSaysWhyNot()
    {
        auto pool = openStorePool(m_redis->url()); // before the password: it probes at opening
        QVERIFY(pool.ok());
        QVERIFY(redisCli(m_redis->port(), {u"CONFIG"_qs, u"SET"_qs, u"requirepass"_qs, u"s3cret"_qs}));
        auto restore = qScopeGuard([&] {
            redisCli(m_redis->port(), {u"-a"_qs, u"s3cret"_qs, u"--no-auth-warning"_qs, u"CONFIG"_qs,
                                       u"SET"_qs, u"requirepass"_qs, QString()});
        });
        QObject context;
        auto anonymous = (*pool)->lane(&context);
        auto refused = laneClaim(*anonymous, claimOf(u"laneauth:a"_qs));
        QVERIFY(!refused.ok());
        // Redis says why: NOAUTH, or (Redis 7, for a long command) "unauthenticated multibulk length".
        QVERIFY2(refused.error().message.contains(u"auth"_qs, Qt::CaseInsensitive), qPrintable(refused.error().message));

        const QString withPassword = m_redis->url().replace(u"redis://"_qs, u"redis://:s3cret@"_qs);
        auto url = StoreUrl::parse(withPassword);
        QVERIFY(url.ok());
        RedisLane lane(*url, {}, **pool);
        auto claimed = laneClaim(lane, claimOf(u"laneauth:a"_qs));
        QVERIFY2(claimed.ok(), claimed.ok() ? "" : qPrintable(claimed.error().message));
        QVERIFY(claimed->claimed());
        QVERIFY(!withPassword.isEmpty() && !url->display().contains(u"s3cret"_qs));
    }

    // A record's index entries are written by the script that writes the record: the link to
    // Redis lost the moment a claim is answered (here: cut from inside the answer, before the
    // lane's event loop turns again), the key is listed, counted and exported all the same.
    void aClaimIsListedWhateverHappensToTheLinkAfterIt()
    {
        FaultProxy proxy(m_redis->port());
        const QString url = u"redis://127.0.0.1:%1/0?prefix=cut:"_qs.arg(proxy.port());
        LaneOn on(url);
        QVERIFY(on.lane);
        std::optional<Result<ClaimResult>> answer;
        on.lane->claim(claimOf(u"ep:cut"_qs), [&](Result<ClaimResult> r) {
            proxy.setMode(FaultProxy::Mode::Reset);
            answer = std::move(r);
        });
        QTRY_VERIFY_WITH_TIMEOUT(answer.has_value(), 10'000);
        QVERIFY(answer->ok() && (*answer)->claimed());
        QTest::qWait(50); // whatever the lane would still send goes nowhere

        auto store = RedisStore::connect(*StoreUrl::parse(m_redis->url() + u"?prefix=cut:"_qs));
        QVERIFY(store.ok());
        KeyQuery q;
        q.state = KeyState::Processing;
        const auto listed = *(*store)->listKeys(q);
        QCOMPARE(listed.size(), 1);
        QCOMPARE(listed.first().key, u"ep:cut"_qs);
        QCOMPARE((*store)->countKeys(u"ep"_qs)->processing, 1);
        QCOMPARE(*(*store)->keyNames({}), QStringList{u"ep:cut"_qs});
        // The finish moves it in the same step: listed as completed, counted once.
        FinishRequest f;
        f.key = u"ep:cut"_qs;
        f.token = (*answer)->record.token;
        f.state = KeyState::Completed;
        f.result = {200, {}, "ok"};
        QCOMPARE(name(*(*store)->finish(f)), name(FinishVerdict::Accept));
        const StateCounts counts = *(*store)->countKeys(u"ep"_qs);
        QCOMPARE(counts.completed, 1);
        QCOMPARE(counts.total(), 1);
        QCOMPARE((*store)->listKeys(q)->size(), 0);
        q.state = KeyState::Completed;
        QCOMPARE((*store)->listKeys(q)->size(), 1);
    }

    // A store written by the first releases (layout v1) is migrated, record by record, with its
    // state, TTL, token, result, request and history; the desk then carries on with it.
    void migratesLayoutOne()
    {
        const quint16 port = m_redis->port();
        const QString p = u"v1mig:"_qs;
        const QString headers = u"[[\"X-A\",\"1\"]]"_qs;
        auto claimV1 = [&](const QString &key, const QString &ttlMs) {
            return runV1(port, "claim",
                         {p, key, u"ep"_qs, u"generic"_qs, u"fp-"_qs + key, u"60000"_qs, ttlMs,
                          u"reprocess"_qs, u"reject"_qs, u"POST"_qs, u"/hooks/ep"_qs, headers,
                          u"body of "_qs + key, u"64"_qs});
        };
        // completed, with a result; processing; failed; failed then reset by the operator.
        const auto done = claimV1(u"ep:done"_qs, u"3600000"_qs);
        QCOMPARE(done.value(0), QByteArray("create"));
        QCOMPARE(runV1(port, "finish",
                       {p, u"ep:done"_qs, QString::fromLatin1(done.value(2)), u"completed"_qs,
                        u"201"_qs, u"[[\"X-R\",\"r\"]]"_qs, u"the result"_qs, QString(), u"64"_qs})
                     .value(0),
                 QByteArray("accept"));
        const auto busy = claimV1(u"ep:busy"_qs, u"3600000"_qs);
        const auto bad = claimV1(u"ep:bad"_qs, u"7200000"_qs);
        QCOMPARE(runV1(port, "finish",
                       {p, u"ep:bad"_qs, QString::fromLatin1(bad.value(2)), u"failed"_qs, u"502"_qs,
                        u"[]"_qs, u"down"_qs, u"downstream \"down\""_qs, u"64"_qs})
                     .value(0),
                 QByteArray("accept"));
        const auto again = claimV1(u"ep:again"_qs, u"3600000"_qs);
        QCOMPARE(runV1(port, "finish",
                       {p, u"ep:again"_qs, QString::fromLatin1(again.value(2)), u"failed"_qs,
                        u"500"_qs, u"[]"_qs, u"x"_qs, u"boom"_qs, u"64"_qs})
                     .value(0),
                 QByteArray("accept"));
        QCOMPARE(runV1(port, "operator",
                       {p, u"ep:again"_qs, u"reset"_qs, u"0"_qs, u"by hand"_qs, u"64"_qs})
                     .value(0),
                 QByteArray("accept"));
        const QStringList keys{u"ep:done"_qs, u"ep:busy"_qs, u"ep:bad"_qs, u"ep:again"_qs};

        // What v1 holds, read through the v1 hash before the migration.
        QHash<QString, QByteArray> v1, ttl;
        for (const QString &k : keys) {
            QVERIFY(redisCli(port, {u"HGETALL"_qs, p + u"k:"_qs + k}, &v1[k]));
            QVERIFY(redisCli(port, {u"PEXPIRETIME"_qs, p + u"k:"_qs + k}, &ttl[k]));
        }
        auto url = *StoreUrl::parse(m_redis->url() + u"?prefix="_qs + p);
        auto store = RedisStore::connect(url);
        QVERIFY(store.ok());
        // Not ready (/readyz) while the records of an earlier layout are left.
        auto ready = (*store)->ready();
        QVERIFY(!ready.ok());
        QVERIFY2(ready.error().message.contains(u"idemdesk migrate"_qs),
                 qPrintable(ready.error().message));
        auto migrated = (*store)->migrateLayout();
        QVERIFY2(migrated.ok(), migrated.ok() ? "" : qPrintable(migrated.error().message));
        QCOMPARE(*migrated, 4);
        QCOMPARE(*(*store)->migrateLayout(), 0); // nothing left of v1
        QVERIFY((*store)->ready().ok());
        // A layout newer than this build's is not ready either.
        QVERIFY(redisCli(port, {u"SET"_qs, p + u"layout"_qs, u"5"_qs}));
        QVERIFY(!(*store)->ready().ok());
        QVERIFY(redisCli(port, {u"SET"_qs, p + u"layout"_qs, u"4"_qs}));
        QVERIFY((*store)->ready().ok());
        QByteArray out;
        QVERIFY(redisCli(port,
                         {u"EXISTS"_qs, p + u"tokens"_qs, p + u"i:all"_qs, p + u"i:e:ep"_qs,
                          p + u"k:ep:done"_qs},
                         &out));
        QCOMPARE(out.trimmed(), QByteArray("0"));

        for (const QString &k : keys) {
            const auto record = *(*store)->key(k);
            QVERIFY2(record.has_value(), qPrintable(k));
            const QList<QByteArray> fields = v1.value(k).trimmed().split('\n');
            QHash<QByteArray, QByteArray> old;
            for (qsizetype i = 0; i + 1 < fields.size(); i += 2)
                old.insert(fields.at(i), fields.at(i + 1));
            QCOMPARE(record->key, k);
            QCOMPARE(toString(record->state), QString::fromLatin1(old.value("state")));
            QCOMPARE(record->token, old.value("token").toLongLong());
            QCOMPARE(record->attempts, old.value("attempts").toInt());
            QCOMPARE(record->createdMs, old.value("created").toLongLong());
            QCOMPARE(record->updatedMs, old.value("updated").toLongLong());
            QCOMPARE(record->expiresAtMs, old.value("expires_at").toLongLong());
            QCOMPARE(record->fingerprint, old.value("fingerprint"));
            QCOMPARE(record->request.method, QByteArray("POST"));
            QCOMPARE(record->request.path, QByteArray("/hooks/ep"));
            QCOMPARE(headerValue(record->request.headers, "X-A"), QByteArray("1"));
            QCOMPARE(record->request.body, "body of " + k.toUtf8());
            QCOMPARE(record->result.status, old.value("res_status").toInt());
            QCOMPARE(record->result.body, old.value("res_body"));
            QCOMPARE(record->error, QString::fromUtf8(old.value("error")));
            QCOMPARE(record->history.size(),
                     historyFromJson(parseJsonArray(old.value("history"))).size());
            // The TTL: the same expiry, on the new key, which Redis keeps a day longer as the
            // key's tombstone (its token the floor of the next).
            QVERIFY(redisCli(port, {u"PEXPIRETIME"_qs, recordOf(p, k)}, &out));
            QCOMPARE(out.trimmed().toLongLong(),
                     ttl.value(k).trimmed().toLongLong() + kTombstoneMs);
        }
        const auto doneRecord = **(*store)->key(u"ep:done"_qs);
        QCOMPARE(doneRecord.result.status, 201);
        QCOMPARE(headerValue(doneRecord.result.headers, "X-R"), QByteArray("r"));
        QCOMPARE(doneRecord.history.size(), 2);
        QCOMPARE(doneRecord.history.last().event, u"completed"_qs);
        const auto badRecord = **(*store)->key(u"ep:bad"_qs);
        QCOMPARE(badRecord.error, u"downstream \"down\""_qs);
        QCOMPARE(badRecord.history.last().detail, u"downstream \"down\""_qs);
        QCOMPARE((**(*store)->key(u"ep:again"_qs)).history.last().event, u"reset"_qs);

        // Listed and counted as before (the indexes are built from the records).
        const StateCounts counts = *(*store)->countKeys(u"ep"_qs);
        QCOMPARE(counts.completed, 1);
        QCOMPARE(counts.processing, 1);
        QCOMPARE(counts.failed, 1);
        QCOMPARE(counts.reset, 1);
        KeyQuery q;
        q.endpoint = u"ep"_qs;
        QCOMPARE((*store)->listKeys(q)->size(), 4);

        // And the desk carries on: a replay, a duplicate in progress, the reset key processed
        // again under a higher token, the old holder's finish still accepted.
        ClaimRequest c = claimOf(u"ep:done"_qs);
        c.fingerprint = "fp-ep:done";
        auto replay = (*store)->claim(c);
        QCOMPARE(name(replay->decision.action), name(ClaimAction::Replay));
        QCOMPARE(replay->record.result.body, QByteArray("the result"));
        c = claimOf(u"ep:busy"_qs);
        c.fingerprint = "fp-ep:busy";
        QCOMPARE(name((*store)->claim(c)->decision.action), name(ClaimAction::InProgress));
        c = claimOf(u"ep:again"_qs);
        c.fingerprint = "fp-ep:again";
        auto reclaimed = (*store)->claim(c);
        QCOMPARE(name(reclaimed->decision.action), name(ClaimAction::Reclaim));
        QVERIFY(reclaimed->record.token > again.value(2).toLongLong());
        QCOMPARE(reclaimed->record.history.size(), 4);
        FinishRequest f;
        f.key = u"ep:busy"_qs;
        f.token = busy.value(2).toLongLong();
        f.result = {200, {}, "late"};
        QCOMPARE(name(*(*store)->finish(f)), name(FinishVerdict::Accept));
        // A key deleted and its counter gone: claimed again, still above every v1 token.
        QVERIFY(redisCli(port, {u"DEL"_qs, QString::fromUtf8(redis::tokenKey(url.prefix.toUtf8(),
                                                                             u"ep:done"_qs))}));
        QCOMPARE(name(*(*store)->applyOperator(u"ep:done"_qs, OperatorAction::Delete, false, {})),
                 name(OperatorVerdict::Accept));
        c = claimOf(u"ep:done"_qs);
        QVERIFY((*store)->claim(c)->record.token > again.value(2).toLongLong());
    }

    // Listings and counts never pay for a purge: every index is scored by expiry, and they read
    // only the entries above the store's clock. The purge then makes the expired record a
    // tombstone and takes it out of its indexes, in one step.
    void listingsAndCountsLeaveExpiredKeysToThePurge()
    {
        const quint16 port = m_redis->port();
        auto store = RedisStore::connect(*StoreUrl::parse(m_redis->url() + u"?prefix=lazy:"_qs));
        QVERIFY(store.ok());
        const redis::Layout layout("lazy:", 1);
        const QString rk = QString::fromUtf8(layout.record(u"ep:brief"_qs));
        const QString failedIndex =
            QString::fromUtf8(layout.stateIndex(0, u"ep"_qs, KeyState::Failed));
        const QString all = QString::fromUtf8(layout.keys(0, u"ep"_qs));
        ClaimRequest brief = claimOf(u"ep:brief"_qs);
        brief.policy.ttlMs = 300;
        FinishRequest f;
        f.key = brief.key;
        f.token = (*store)->claim(brief)->record.token;
        f.state = KeyState::Failed;
        f.result = {500, {}, "no"};
        f.error = u"boom"_qs;
        QCOMPARE(name(*(*store)->finish(f)), name(FinishVerdict::Accept));
        QVERIFY((*store)->claim(claimOf(u"ep:kept"_qs))->claimed());
        QTRY_VERIFY_WITH_TIMEOUT(!(*(*store)->key(brief.key)).has_value(), 5000);

        KeyQuery q;
        const auto listed = *(*store)->listKeys(q);
        QCOMPARE(listed.size(), 1);
        QCOMPARE(listed.first().key, u"ep:kept"_qs);
        q.state = KeyState::Failed;
        QCOMPARE((*store)->listKeys(q)->size(), 0);
        const StateCounts counts = *(*store)->countKeys(u"ep"_qs);
        QCOMPARE(counts.total(), 1);
        QCOMPARE(counts.processing, 1);
        QCOMPARE(counts.failed, 0);
        QByteArray out;
        QVERIFY(redisCli(port, {u"ZSCORE"_qs, failedIndex, u"ep:brief"_qs}, &out));
        QVERIFY(!out.trimmed().isEmpty()); // left to the purge
        QVERIFY(redisCli(port, {u"HEXISTS"_qs, rk, u"q"_qs}, &out));
        QCOMPARE(out.trimmed(), QByteArray("1")); // nothing made it a tombstone yet

        QCOMPARE(*(*store)->purgeExpired(), 1);
        QVERIFY(redisCli(port, {u"HKEYS"_qs, rk}, &out));
        QCOMPARE(out.trimmed(), QByteArray("m"));
        for (const QString &index : {failedIndex, all}) {
            QVERIFY(redisCli(port, {u"ZSCORE"_qs, index, u"ep:brief"_qs}, &out));
            QCOMPARE(out.trimmed(), QByteArray());
        }
        QCOMPARE(*(*store)->purgeExpired(), 0);
        QCOMPARE((*store)->countKeys(u"ep"_qs)->total(), 1);
    }

    // A key that expired, or was deleted, leaves a tombstone: absent to every reader, its token
    // the floor of the key's next one for a day, whatever Redis's clock does meanwhile (here:
    // a tombstone token set an hour ahead, as if the clock had gone back an hour since).
    void expiredAndDeletedKeysLeaveTheirTokenFloor()
    {
        const quint16 port = m_redis->port();
        auto store = RedisStore::connect(*StoreUrl::parse(m_redis->url() + u"?prefix=tomb:"_qs));
        QVERIFY(store.ok());
        auto rk = [](const QString &k) { return recordOf(u"tomb:"_qs, k); };
        auto raiseToken = [&](const QString &k) {
            QByteArray out;
            if (!redisCli(port, {u"HGET"_qs, rk(k), u"m"_qs}, &out))
                return qint64(0);
            QList<QByteArray> meta = out.trimmed().split(' ');
            if (meta.size() < 11)
                return qint64(0);
            const qint64 high = wallMs() * 1000 + 3'600'000'000LL;
            meta[1] = QByteArray::number(high);
            return redisCli(port, {u"HSET"_qs, rk(k), u"m"_qs, QString::fromUtf8(meta.join(' '))})
                       ? high
                       : 0;
        };
        ClaimRequest brief = claimOf(u"ep:brief"_qs);
        brief.policy.ttlMs = 300;
        const ClaimResult first = *(*store)->claim(brief);
        FinishRequest f;
        f.key = brief.key;
        f.token = first.record.token;
        f.result = {200, {}, "done"};
        QCOMPARE(name(*(*store)->finish(f)), name(FinishVerdict::Accept));
        QTRY_VERIFY_WITH_TIMEOUT(!(*(*store)->key(brief.key)).has_value(), 5000);
        QByteArray out;
        QVERIFY(redisCli(port, {u"PTTL"_qs, rk(brief.key)}, &out));
        QVERIFY2(out.trimmed().toLongLong() > 86'000'000, out.constData()); // kept as a tombstone
        KeyQuery q;
        QCOMPARE((*store)->listKeys(q)->size(), 0);
        QCOMPARE((*store)->countKeys({})->total(), 0);
        QVERIFY((*store)->purgeExpired().ok());
        QVERIFY(redisCli(port, {u"HKEYS"_qs, rk(brief.key)}, &out));
        QCOMPARE(out.trimmed(), QByteArray("m")); // its payloads dropped, its meta kept
        auto expiresOf = [&](const QString &k) {
            QByteArray meta;
            redisCli(port, {u"HGET"_qs, rk(k), u"m"_qs}, &meta);
            return meta.trimmed().split(' ').value(6);
        };
        QCOMPARE(expiresOf(brief.key), QByteArray("0")); // absent even if the clock steps back
        QCOMPARE(name(*(*store)->finish(f)), name(FinishVerdict::Missing));
        const qint64 high = raiseToken(brief.key);
        QVERIFY(high > 0);
        const ClaimResult again = *(*store)->claim(brief);
        QCOMPARE(name(again.decision.action), name(ClaimAction::Create));
        QVERIFY(again.record.token > high);

        const ClaimRequest doomed = claimOf(u"ep:doomed"_qs);
        const ClaimResult doomedClaim = *(*store)->claim(doomed);
        QVERIFY(doomedClaim.claimed());
        FinishRequest done;
        done.key = doomed.key;
        done.token = doomedClaim.record.token;
        done.state = KeyState::Completed;
        done.result = {200, {}, "ok"};
        QCOMPARE(name(*(*store)->finish(done)), name(FinishVerdict::Accept));
        QCOMPARE(name(*(*store)->applyOperator(doomed.key, OperatorAction::Delete, true, {})),
                 name(OperatorVerdict::Accept));
        QVERIFY(!(*(*store)->key(doomed.key)).has_value());
        QCOMPARE(expiresOf(doomed.key), QByteArray("0"));
        QCOMPARE(name(*(*store)->applyOperator(doomed.key, OperatorAction::Delete, true, {})),
                 name(OperatorVerdict::Missing));
        const qint64 high2 = raiseToken(doomed.key);
        QVERIFY(high2 > 0);
        const ClaimResult reborn = *(*store)->claim(doomed);
        QCOMPARE(name(reborn.decision.action), name(ClaimAction::Create));
        QVERIFY(reborn.record.token > high2);
        QCOMPARE(reborn.record.attempts, 1);
    }

    // A record whose meta line does not read is never taken for an absent one: claim, finish
    // and the operator's actions refuse (503), and nothing is written.
    void anUnreadableRecordIsRefused()
    {
        const quint16 port = m_redis->port();
        auto store = RedisStore::connect(*StoreUrl::parse(m_redis->url() + u"?prefix=bad:"_qs));
        QVERIFY(store.ok());
        const QString rk = recordOf(u"bad:"_qs, u"ep:odd"_qs);
        QVERIFY(redisCli(port, {u"HSET"_qs, rk, u"m"_qs, u"completed not-a-token"_qs, u"s"_qs,
                                u"200\n[]\nold"_qs}));
        auto claimed = (*store)->claim(claimOf(u"ep:odd"_qs));
        QVERIFY(!claimed.ok());
        QCOMPARE(int(claimed.error().code), int(ErrorCode::Unavailable));
        QVERIFY2(claimed.error().message.contains(u"unreadable"_qs),
                 qPrintable(claimed.error().message));
        FinishRequest f;
        f.key = u"ep:odd"_qs;
        f.token = 1;
        f.state = KeyState::Completed;
        QVERIFY(!(*store)->finish(f).ok());
        QVERIFY(!(*store)->applyOperator(u"ep:odd"_qs, OperatorAction::Delete, true, {}).ok());
        QVERIFY(!(*store)->key(u"ep:odd"_qs).ok());
        QByteArray out;
        QVERIFY(redisCli(port, {u"HGET"_qs, rk, u"m"_qs}, &out));
        QCOMPARE(out.trimmed(), QByteArray("completed not-a-token"));
    }

    // A store of layout v2 is migrated (to v3 in place, then into its bucket): each record with
    // its state, TTL, token, result, request and history, indexed, v2's own indexes dropped; a
    // deleted key's token counter becomes its tombstone, the floor of its next token.
    void migratesLayoutTwo()
    {
        const quint16 port = m_redis->port();
        const QString p = u"v2mig:"_qs;
        const QByteArray prefix = p.toUtf8();
        auto rk = [&](const QString &k) {
            return QString::fromUtf8(redis::v3RecordKey(prefix, k));
        };
        auto tk = [&](const QString &k) { return QString::fromUtf8(redis::tokenKey(prefix, k)); };
        auto claimV2 = [&](const QString &key, const QString &ttlMs) {
            return runV2(port, "claim", {rk(key), tk(key)},
                         {u"ep"_qs, u"generic"_qs, u"fp-"_qs + key, u"60000"_qs, ttlMs, u"RM"_qs,
                          u"POST /hooks/ep\n[[\"X-A\",\"1\"]]"_qs, u"body of "_qs + key});
        };
        auto finishV2 = [&](const QString &key, const QByteArray &token, const QString &state,
                            const QString &status, const QString &headers, const QString &body,
                            const QString &error) {
            return runV2(port, "finish", {rk(key)},
                         {QString::fromLatin1(token), state, status, headers, body, error})
                .value(0);
        };
        const auto done = claimV2(u"ep:done"_qs, u"3600000"_qs);
        QCOMPARE(done.value(0), QByteArray("create"));
        QCOMPARE(finishV2(u"ep:done"_qs, done.value(2), u"completed"_qs, u"201"_qs,
                          u"[[\"X-R\",\"r\"]]"_qs, u"the result"_qs, QString()),
                 QByteArray("accept"));
        const auto busy = claimV2(u"ep:busy"_qs, u"3600000"_qs);
        QCOMPARE(busy.value(0), QByteArray("create"));
        const auto bad = claimV2(u"ep:bad"_qs, u"7200000"_qs);
        QCOMPARE(finishV2(u"ep:bad"_qs, bad.value(2), u"failed"_qs, u"502"_qs, u"[]"_qs, u"down"_qs,
                          u"downstream \"down\""_qs),
                 QByteArray("accept"));
        const auto againV2 = claimV2(u"ep:again"_qs, u"3600000"_qs);
        QCOMPARE(finishV2(u"ep:again"_qs, againV2.value(2), u"failed"_qs, u"500"_qs, u"[]"_qs,
                          u"x"_qs, u"boom"_qs),
                 QByteArray("accept"));
        QCOMPARE(
            runV2(port, "operator", {rk(u"ep:again"_qs)}, {u"reset"_qs, u"0"_qs, u"by hand"_qs})
                .value(0),
            QByteArray("accept"));
        const QStringList keys{u"ep:done"_qs, u"ep:busy"_qs, u"ep:bad"_qs, u"ep:again"_qs};

        // What v2 holds, and its indexes as that desk wrote them after the scripts.
        QHash<QString, QHash<QByteArray, QByteArray>> v2;
        QHash<QString, QByteArray> expiry;
        for (const QString &k : keys) {
            QByteArray out;
            for (const char *field :
                 {"state", "token", "attempts", "created", "updated", "lease_until", "expires_at",
                  "fingerprint", "res_status", "res_body", "error", "history",
                  "m"}) { // none holds a line break
                QVERIFY(redisCli(port, {u"HGET"_qs, rk(k), QString::fromLatin1(field)}, &out));
                v2[k].insert(field, out.chopped(1));
            }
            QVERIFY(!v2[k].value("state").isEmpty() && v2[k].value("m").isEmpty());
            QVERIFY(redisCli(port, {u"PEXPIRETIME"_qs, rk(k)}, &expiry[k]));
            const QString state = QString::fromLatin1(v2[k].value("state"));
            const QString updated = QString::fromLatin1(v2[k].value("updated"));
            QVERIFY(redisCli(port, {u"ZADD"_qs, p + u"i:s:"_qs + state, updated, k}));
            QVERIFY(redisCli(port, {u"ZADD"_qs, p + u"i:es:ep:"_qs + state, updated, k}));
            QVERIFY(redisCli(port, {u"ZADD"_qs, p + u"i:exp"_qs,
                                    QString::fromLatin1(v2[k].value("expires_at")), k}));
        }

        auto url = *StoreUrl::parse(m_redis->url() + u"?prefix="_qs + p);
        auto store = RedisStore::connect(url);
        QVERIFY(store.ok());
        auto ready = (*store)->ready();
        QVERIFY(!ready.ok());
        QVERIFY2(ready.error().message.contains(u"layout"_qs), qPrintable(ready.error().message));
        // A v2 key deleted: its record gone, its token counter left (the floor of its next token).
        const auto gone = claimV2(u"ep:gone"_qs, u"3600000"_qs);
        QCOMPARE(runV2(port, "operator", {rk(u"ep:gone"_qs)}, {u"delete"_qs, u"1"_qs, QString()})
                     .value(0),
                 QByteArray("accept"));
        QVERIFY(redisCli(port, {u"SET"_qs, tk(u"ep:gone"_qs),
                                QString::number(wallMs() * 1000 + 3'600'000'000LL), u"PX"_qs,
                                u"600000"_qs})); // as if Redis's clock had gone back an hour since
        QByteArray out;
        QVERIFY(redisCli(port, {u"GET"_qs, tk(u"ep:gone"_qs)}, &out));
        const qint64 floor = out.trimmed().toLongLong();
        QVERIFY(floor > gone.value(2).toLongLong());

        // A desk of the previous version may be writing (a delivery logged just now): the
        // migration at start refuses; `idemdesk migrate` (confirmed) goes ahead.
        DeliveryEvent logged;
        logged.endpoint = u"ep"_qs;
        logged.key = u"ep:busy"_qs;
        logged.atMs = *(*store)->clockMs();
        logged.instance = u"old-desk"_qs;
        QVERIFY((*store)->appendDeliveries({logged}).ok());
        auto refused = (*store)->migrateLayout();
        QVERIFY(!refused.ok());
        QVERIFY2(refused.error().message.contains(u"old-desk"_qs) &&
                     refused.error().message.contains(u"idemdesk migrate"_qs),
                 qPrintable(refused.error().message));
        QVERIFY(redisCli(port, {u"HGET"_qs, rk(u"ep:done"_qs), u"attempts"_qs}, &out));
        QCOMPARE(out.trimmed(), v2[u"ep:done"_qs].value("attempts")); // untouched

        auto migrated = (*store)->migrateLayout(true);
        QVERIFY2(migrated.ok(), migrated.ok() ? "" : qPrintable(migrated.error().message));
        QCOMPARE(*migrated, 5); // four records and the deleted key's floor
        QCOMPARE(*(*store)->migrateLayout(), 0);
        QVERIFY((*store)->ready().ok());
        QVERIFY(redisCli(port,
                         {u"EXISTS"_qs, p + u"i:s:completed"_qs, p + u"i:s:failed"_qs,
                          p + u"i:exp"_qs, p + u"i:es:ep:completed"_qs},
                         &out));
        QCOMPARE(out.trimmed(), QByteArray("0"));

        for (const QString &k : keys) {
            const auto record = *(*store)->key(k);
            QVERIFY2(record.has_value(), qPrintable(k));
            const auto &old = v2.value(k);
            QCOMPARE(toString(record->state), QString::fromLatin1(old.value("state")));
            QCOMPARE(record->token, old.value("token").toLongLong());
            QCOMPARE(record->attempts, old.value("attempts").toInt());
            QCOMPARE(record->createdMs, old.value("created").toLongLong());
            QCOMPARE(record->updatedMs, old.value("updated").toLongLong());
            QCOMPARE(record->leaseUntilMs, old.value("lease_until").toLongLong());
            QCOMPARE(record->expiresAtMs, old.value("expires_at").toLongLong());
            QCOMPARE(record->fingerprint, old.value("fingerprint"));
            QCOMPARE(record->endpoint, u"ep"_qs);
            QCOMPARE(record->request.method, QByteArray("POST"));
            QCOMPARE(record->request.path, QByteArray("/hooks/ep"));
            QCOMPARE(headerValue(record->request.headers, "X-A"), QByteArray("1"));
            QCOMPARE(record->request.body, "body of " + k.toUtf8());
            QCOMPARE(record->result.status, old.value("res_status").toInt());
            QCOMPARE(record->result.body, old.value("res_body"));
            QCOMPARE(record->error, QString::fromUtf8(old.value("error")));
            QCOMPARE(record->history.size(),
                     historyFromJson(parseJsonArray(old.value("history"))).size());
            QVERIFY(redisCli(port, {u"PEXPIRETIME"_qs, recordOf(p, k)}, &out));
            QCOMPARE(out.trimmed().toLongLong(),
                     expiry.value(k).trimmed().toLongLong() + kTombstoneMs);
            QVERIFY(redisCli(port, {u"EXISTS"_qs, rk(k)}, &out));
            QCOMPARE(out.trimmed(), QByteArray("0")); // moved, not copied
        }
        const auto doneRecord = **(*store)->key(u"ep:done"_qs);
        QCOMPARE(doneRecord.result.status, 201);
        QCOMPARE(headerValue(doneRecord.result.headers, "X-R"), QByteArray("r"));
        QCOMPARE(doneRecord.history.last().event, u"completed"_qs);
        QCOMPARE((**(*store)->key(u"ep:bad"_qs)).error, u"downstream \"down\""_qs);
        QCOMPARE((**(*store)->key(u"ep:again"_qs)).history.last().event, u"reset"_qs);

        const StateCounts counts = *(*store)->countKeys(u"ep"_qs);
        QCOMPARE(counts.completed, 1);
        QCOMPARE(counts.processing, 1);
        QCOMPARE(counts.failed, 1);
        QCOMPARE(counts.reset, 1);
        KeyQuery q;
        q.endpoint = u"ep"_qs;
        QCOMPARE((*store)->listKeys(q)->size(), 4);
        q.state = KeyState::Completed;
        QCOMPARE((*store)->listKeys(q)->size(), 1);
        // A migration cut short before it marked the layout is finished by the next one, which
        // finds nothing left to move and indexes nothing twice.
        QVERIFY(redisCli(port, {u"DEL"_qs, p + u"layout"_qs}));
        QVERIFY(!(*store)->ready().ok());
        QCOMPARE(*(*store)->migrateLayout(), 0);
        QVERIFY((*store)->ready().ok());
        const StateCounts again = *(*store)->countKeys(u"ep"_qs);
        QCOMPARE(again.completed, 1);
        QCOMPARE(again.processing, 1);
        QCOMPARE(again.failed, 1);
        QCOMPARE(again.reset, 1);

        // The desk carries on: a replay with the stored result, a duplicate in progress, the
        // holder's finish, the reset key processed again under a higher token.
        ClaimRequest c = claimOf(u"ep:done"_qs);
        c.fingerprint = "fp-ep:done";
        auto replay = (*store)->claim(c);
        QCOMPARE(name(replay->decision.action), name(ClaimAction::Replay));
        QCOMPARE(replay->record.result.body, QByteArray("the result"));
        QCOMPARE(replay->record.result.status, 201);
        c = claimOf(u"ep:busy"_qs);
        c.fingerprint = "fp-ep:busy";
        QCOMPARE(name((*store)->claim(c)->decision.action), name(ClaimAction::InProgress));
        FinishRequest f;
        f.key = u"ep:busy"_qs;
        f.token = busy.value(2).toLongLong();
        f.result = {200, {}, "late"};
        QCOMPARE(name(*(*store)->finish(f)), name(FinishVerdict::Accept));
        c = claimOf(u"ep:again"_qs);
        c.fingerprint = "fp-ep:again";
        auto reclaimed = (*store)->claim(c);
        QCOMPARE(name(reclaimed->decision.action), name(ClaimAction::Reclaim));
        QVERIFY(reclaimed->record.token > againV2.value(2).toLongLong());
        // The deleted key: its counter became its tombstone, its next token is above it.
        QVERIFY(redisCli(port, {u"EXISTS"_qs, tk(u"ep:gone"_qs)}, &out));
        QCOMPARE(out.trimmed(), QByteArray("0"));
        QVERIFY(!(*(*store)->key(u"ep:gone"_qs)).has_value());
        c = claimOf(u"ep:gone"_qs);
        auto again2 = (*store)->claim(c);
        QCOMPARE(name(again2->decision.action), name(ClaimAction::Create));
        QVERIFY2(again2->record.token > floor, qPrintable(QString::number(again2->record.token)));
    }

    // A store of layout v3 (the release before) is moved into layout v4: each record into its
    // bucket with its state, TTL, token, result, request and history, indexed in the same step,
    // v3's record and indexes gone; a tombstone keeps its token floor. Refused while a desk of
    // the previous version may be writing, unless confirmed.
    void migratesLayoutThree()
    {
        const quint16 port = m_redis->port();
        const QString p = u"v3mig:"_qs;
        auto rk = [&](const QString &k) {
            return QString::fromUtf8(redis::v3RecordKey(p.toUtf8(), k));
        };
        auto claimV3 = [&](const QString &key, const QString &ttlMs) {
            return runV3(port, "claim", {rk(key)},
                         {u"ep"_qs, u"generic"_qs, u"fp-"_qs + key, u"60000"_qs, ttlMs, u"RM"_qs,
                          u"POST /hooks/ep\n[[\"X-A\",\"1\"]]\nbody of "_qs + key});
        };
        auto finishV3 = [&](const QString &key, const QByteArray &token, const QString &state,
                            const QString &status, const QString &body, const QString &error) {
            return runV3(port, "finish", {rk(key)},
                         {QString::fromLatin1(token), state, status, u"[[\"X-R\",\"r\"]]"_qs, body,
                          error})
                .value(0);
        };
        const auto done = claimV3(u"ep:done"_qs, u"3600000"_qs);
        QCOMPARE(done.value(0), QByteArray("create"));
        QCOMPARE(finishV3(u"ep:done"_qs, done.value(2), u"completed"_qs, u"201"_qs,
                          u"the result"_qs, QString()),
                 QByteArray("accept"));
        const auto busy = claimV3(u"ep:busy"_qs, u"3600000"_qs);
        const auto bad = claimV3(u"ep:bad"_qs, u"7200000"_qs);
        QCOMPARE(finishV3(u"ep:bad"_qs, bad.value(2), u"failed"_qs, u"502"_qs, u"down"_qs,
                          u"downstream \"down\""_qs),
                 QByteArray("accept"));
        const auto again = claimV3(u"ep:again"_qs, u"3600000"_qs);
        QCOMPARE(
            finishV3(u"ep:again"_qs, again.value(2), u"failed"_qs, u"500"_qs, u"x"_qs, u"boom"_qs),
            QByteArray("accept"));
        QCOMPARE(
            runV3(port, "operator", {rk(u"ep:again"_qs)}, {u"reset"_qs, u"0"_qs, u"by hand"_qs})
                .value(0),
            QByteArray("accept"));
        const auto gone = claimV3(u"ep:gone"_qs, u"3600000"_qs);
        QCOMPARE(
            finishV3(u"ep:gone"_qs, gone.value(2), u"completed"_qs, u"200"_qs, u"y"_qs, QString()),
            QByteArray("accept"));
        QCOMPARE(runV3(port, "operator", {rk(u"ep:gone"_qs)}, {u"delete"_qs, u"1"_qs, QString()})
                     .value(0),
                 QByteArray("accept"));
        const QStringList keys{u"ep:done"_qs, u"ep:busy"_qs, u"ep:bad"_qs, u"ep:again"_qs};

        // What v3 holds, and its indexes as that desk wrote them after the scripts.
        QHash<QString, QByteArray> meta, expiry;
        QByteArray out;
        for (const QString &k : keys + QStringList{u"ep:gone"_qs}) {
            QVERIFY(redisCli(port, {u"HGET"_qs, rk(k), u"m"_qs}, &meta[k]));
            meta[k] = meta[k].trimmed();
            QVERIFY(redisCli(port, {u"PEXPIRETIME"_qs, rk(k)}, &expiry[k]));
            expiry[k] = expiry[k].trimmed();
            const QList<QByteArray> m = meta[k].split(' ');
            QVERIFY(m.size() >= 11);
            if (k == u"ep:gone"_qs)
                continue;
            QVERIFY(
                redisCli(port, {u"ZADD"_qs, p + u"i:k:ep"_qs, QString::fromLatin1(m.at(6)), k}));
            if (m.at(0) != "completed")
                QVERIFY(
                    redisCli(port, {u"ZADD"_qs, p + u"i:es:ep:"_qs + QString::fromLatin1(m.at(0)),
                                    QString::fromLatin1(m.at(4)), k}));
        }
        QVERIFY(redisCli(port, {u"SADD"_qs, p + u"i:eps"_qs, u"ep"_qs}));
        QVERIFY(redisCli(port, {u"SET"_qs, p + u"layout"_qs, u"3"_qs}));
        const qint64 floor = meta.value(u"ep:gone"_qs).split(' ').value(1).toLongLong();

        auto store = RedisStore::connect(*StoreUrl::parse(m_redis->url() + u"?prefix="_qs + p));
        QVERIFY(store.ok());
        QVERIFY(!(*store)->ready().ok());
        DeliveryEvent logged;
        logged.endpoint = u"ep"_qs;
        logged.key = u"ep:busy"_qs;
        logged.atMs = *(*store)->clockMs();
        logged.instance = u"old-desk"_qs;
        QVERIFY((*store)->appendDeliveries({logged}).ok());
        auto refused = (*store)->migrateLayout();
        QVERIFY(!refused.ok());
        QCOMPARE(int(refused.error().code), int(ErrorCode::Conflict));
        QVERIFY2(refused.error().message.contains(u"old-desk"_qs) &&
                     refused.error().message.contains(u"idemdesk migrate"_qs),
                 qPrintable(refused.error().message));
        QVERIFY(redisCli(port, {u"EXISTS"_qs, rk(u"ep:done"_qs)}, &out));
        QCOMPARE(out.trimmed(), QByteArray("1")); // untouched

        auto migrated = (*store)->migrateLayout(true);
        QVERIFY2(migrated.ok(), migrated.ok() ? "" : qPrintable(migrated.error().message));
        QCOMPARE(*migrated, 5); // four records and the deleted key's tombstone
        QCOMPARE(*(*store)->migrateLayout(), 0);
        QVERIFY((*store)->ready().ok());
        QVERIFY(redisCli(port,
                         {u"EXISTS"_qs, p + u"i:k:ep"_qs, p + u"i:es:ep:failed"_qs,
                          p + u"i:es:ep:processing"_qs, p + u"i:es:ep:reset"_qs, p + u"i:eps"_qs,
                          rk(u"ep:done"_qs), rk(u"ep:gone"_qs)},
                         &out));
        QCOMPARE(out.trimmed(), QByteArray("0"));
        for (const QString &k : keys) {
            QVERIFY(redisCli(port, {u"HGET"_qs, recordOf(p, k), u"m"_qs}, &out));
            QCOMPARE(out.trimmed(), meta.value(k)); // the meta line as it was
            QVERIFY(redisCli(port, {u"PEXPIRETIME"_qs, recordOf(p, k)}, &out));
            QCOMPARE(out.trimmed(), expiry.value(k));
        }
        const auto doneRecord = **(*store)->key(u"ep:done"_qs);
        QCOMPARE(doneRecord.result.status, 201);
        QCOMPARE(doneRecord.result.body, QByteArray("the result"));
        QCOMPARE(headerValue(doneRecord.result.headers, "X-R"), QByteArray("r"));
        QCOMPARE(doneRecord.request.body, QByteArray("body of ep:done"));
        QCOMPARE(doneRecord.history.size(), 2);
        QCOMPARE((**(*store)->key(u"ep:bad"_qs)).error, u"downstream \"down\""_qs);
        QCOMPARE((**(*store)->key(u"ep:again"_qs)).history.last().event, u"reset"_qs);
        QVERIFY(!(*(*store)->key(u"ep:gone"_qs)).has_value());

        const StateCounts counts = *(*store)->countKeys(u"ep"_qs);
        QCOMPARE(counts.completed, 1);
        QCOMPARE(counts.processing, 1);
        QCOMPARE(counts.failed, 1);
        QCOMPARE(counts.reset, 1);
        KeyQuery q;
        QCOMPARE((*store)->listKeys(q)->size(), 4);
        q.state = KeyState::Failed;
        QCOMPARE((*store)->listKeys(q)->size(), 1);
        QCOMPARE((*store)->keyNames({})->size(), 5); // and the tombstone: export reads each

        // The desk carries on: a replay, a duplicate in progress, the holder's finish, the
        // reset key again under a higher token, the deleted key above its tombstone's.
        ClaimRequest c = claimOf(u"ep:done"_qs);
        c.fingerprint = "fp-ep:done";
        auto replay = (*store)->claim(c);
        QCOMPARE(name(replay->decision.action), name(ClaimAction::Replay));
        QCOMPARE(replay->record.result.body, QByteArray("the result"));
        c = claimOf(u"ep:busy"_qs);
        c.fingerprint = "fp-ep:busy";
        QCOMPARE(name((*store)->claim(c)->decision.action), name(ClaimAction::InProgress));
        FinishRequest f;
        f.key = u"ep:busy"_qs;
        f.token = busy.value(2).toLongLong();
        f.result = {200, {}, "late"};
        QCOMPARE(name(*(*store)->finish(f)), name(FinishVerdict::Accept));
        c = claimOf(u"ep:again"_qs);
        c.fingerprint = "fp-ep:again";
        auto reclaimed = (*store)->claim(c);
        QCOMPARE(name(reclaimed->decision.action), name(ClaimAction::Reclaim));
        QVERIFY(reclaimed->record.token > again.value(2).toLongLong());
        auto reborn = (*store)->claim(claimOf(u"ep:gone"_qs));
        QCOMPARE(name(reborn->decision.action), name(ClaimAction::Create));
        QVERIFY(reborn->record.token > floor);
        QVERIFY(floor >= gone.value(2).toLongLong());
    }

    // Desks started together on a store to migrate (here: an empty one) all start: one marks
    // or migrates it, the others wait for it instead of giving up.
    void desksStartedTogetherAllMigrate()
    {
        const QString url = m_redis->url() + u"?prefix=together:"_qs;
        std::atomic<int> ok{0};
        std::vector<std::thread> desks;
        QStringList errors;
        std::mutex m;
        for (int i = 0; i < 6; ++i)
            desks.emplace_back([&] {
                auto store = RedisStore::connect(*StoreUrl::parse(url));
                auto r = store ? (*store)->migrateLayout() : Result<qint64>(store.error());
                if (r)
                    ++ok;
                else {
                    std::lock_guard lock(m);
                    errors << r.error().message;
                }
            });
        for (auto &t : desks)
            t.join();
        QVERIFY2(ok == 6, qPrintable(errors.join(u"; "_qs)));
        auto store = RedisStore::connect(*StoreUrl::parse(url));
        QVERIFY((*store)->ready().ok());
    }

    // A hostile or broken Redis (a shared store, a man in the middle) answers anything: the desk
    // reads every nested answer with its type and count checked, and says what it could not read
    // instead of crashing. Here the delivery log answers an entry that is a bare string: the key
    // is shown, and the unreadable timeline said.
    void aHostileRedisIsRefusedNotCrashedOn()
    {
        const QByteArray meta = "completed 1 1 1 1 0 99999999999999 200 generic ep f";
        QHash<QByteArray, QByteArray> answers = connectingAnswers();
        answers.insert("HGETALL", "*2\r\n" + bulk("m") + bulk(meta));
        answers.insert("XREVRANGE", "*1\r\n$1\r\nx\r\n");
        FakeRedis fake(answers);
        QProcess show;
        show.start(QStringLiteral(IDEMDESK_BIN), {u"keys"_qs, u"show"_qs, u"ep:a"_qs, u"--store"_qs,
                                                  u"redis://127.0.0.1:%1"_qs.arg(fake.port())});
        QVERIFY(show.waitForFinished(30'000));
        const QByteArray err = show.readAllStandardError();
        QCOMPARE(show.exitStatus(), QProcess::NormalExit); // no SIGSEGV
        QVERIFY2(show.exitCode() == 0 && err.contains("unreadable entry in the delivery log"),
                 qPrintable(u"exit %1: %2"_qs.arg(show.exitCode()).arg(QString::fromUtf8(err))));
        QVERIFY(show.readAllStandardOutput().contains("ep:a"));
    }

    // An answer that announces an array of hundreds of millions of elements (`*617000000`, as a
    // hostile or broken server or a man in the middle may send): the call fails at once as on a
    // lost link, on the blocking store and on the receiver's lane, and nothing is allocated for
    // the count. Without the guard hiredis allocates the element array (4.9 GB: the fuzzer's
    // abort; 16 MB for the second row) and waits for elements that never come.
    void anAnswerAnnouncingAHugeArrayFailsTheCallAtOnce_data()
    {
        QTest::addColumn<QByteArray>("answer");
        QTest::newRow("617000000") << QByteArray("*617000000\r\n");
        QTest::newRow("just past the bound")
            << "*" + QByteArray::number(redis::kMaxReplyElements + 1) + "\r\n";
        QTest::newRow("nested") << "*2\r\n$1\r\nm\r\n*" +
                                       QByteArray::number(redis::kMaxReplyElements + 1) + "\r\n";
    }
    void anAnswerAnnouncingAHugeArrayFailsTheCallAtOnce()
    {
        QFETCH(QByteArray, answer);
        // The server keeps the link open after its answer (for 10 s): an unguarded reader waits
        // for the elements until then, and the call fails as a lost link, not as refused.
        QHash<QByteArray, QByteArray> answers = connectingAnswers();
        answers.insert("HGETALL", answer);
        answers.insert("EVALSHA", answer);
        FakeRedis fake(answers);
        const QString url = u"redis://127.0.0.1:%1"_qs.arg(fake.port());
        RedisOptions patient;
        patient.commandTimeoutMs = 30'000;
        auto store = RedisStore::connect(*StoreUrl::parse(url), patient);
        QVERIFY2(store.ok(), store.ok() ? "" : qPrintable(store.error().message));
        const auto read = (*store)->key(u"ep:a"_qs);
        QVERIFY(!read.ok());
        // hiredis's words for a reply its reader refused to build.
        QVERIFY2(read.error().message.contains(u"Out of memory"_qs),
                 qPrintable(read.error().message));

        LaneOn on(url);
        QVERIFY(on.lane);
        const auto claimed = laneClaim(*on.lane, claimOf(u"ep:b"_qs));
        QVERIFY(!claimed.ok());
        QVERIFY2(claimed.error().message.contains(u"Out of memory"_qs),
                 qPrintable(claimed.error().message));
    }

    // A v3 record that had expired came over as a tombstone, in no index; claimed again, the
    // key is listed, counted and exported like any other (its endpoint listed in the bucket).
    void aKeyMigratedExpiredThenClaimedAgainIsListed()
    {
        const quint16 port = m_redis->port();
        const QString p = u"v3exp:"_qs;
        const QString v3 = QString::fromUtf8(redis::v3RecordKey(p.toUtf8(), u"ep:k1"_qs));
        const auto claimed =
            runV3(port, "claim", {v3},
                  {u"ep"_qs, u"generic"_qs, u"fp"_qs, u"60000"_qs, u"1"_qs, u"RM"_qs,
                   u"POST /hooks/ep\n[]\nbody"_qs});
        QCOMPARE(claimed.value(0), QByteArray("create"));
        QVERIFY(redisCli(port, {u"SET"_qs, p + u"layout"_qs, u"3"_qs}));
        QTest::qWait(5); // its 1 ms TTL over
        auto store = RedisStore::connect(*StoreUrl::parse(m_redis->url() + u"?prefix="_qs + p));
        QVERIFY(store.ok());
        QVERIFY((*store)->migrateLayout(true).ok());
        QVERIFY((*store)->ready().ok());
        QCOMPARE(name((*store)->claim(claimOf(u"ep:k1"_qs))->decision.action),
                 name(ClaimAction::Create));
        QCOMPARE(*(*store)->keyNames({}), QStringList{u"ep:k1"_qs});
        QCOMPARE((*store)->listKeys({})->size(), 1);
        QCOMPARE((*store)->countKeys(QString())->processing, 1);
    }

    // A migrator that paused past its lock (here: its v3 copy written after the migration
    // finished and a desk claimed and finished the key under layout v4) never replaces the newer
    // record: the duplicate still gets the v4 answer.
    void aMigrationNeverReplacesANewerRecord()
    {
        const quint16 port = m_redis->port();
        const QString p = u"late:"_qs;
        const QString v3 = QString::fromUtf8(redis::v3RecordKey(p.toUtf8(), u"ep:k"_qs));
        const auto old = runV3(port, "claim", {v3},
                               {u"ep"_qs, u"generic"_qs, u"f"_qs, u"60000"_qs, u"3600000"_qs,
                                u"RM"_qs, u"POST /hooks/ep\n[]\nbody"_qs});
        QCOMPARE(runV3(port, "finish", {v3},
                       {QString::fromLatin1(old.value(2)), u"completed"_qs, u"200"_qs, u"[]"_qs,
                        u"old answer"_qs, QString()})
                     .value(0),
                 QByteArray("accept"));
        auto store = RedisStore::connect(*StoreUrl::parse(m_redis->url() + u"?prefix="_qs + p));
        QVERIFY(store.ok());
        auto fresh = (*store)->claim(claimOf(u"ep:k"_qs));
        QVERIFY(fresh->claimed());
        FinishRequest f;
        f.key = u"ep:k"_qs;
        f.token = fresh->record.token;
        f.result = {201, {}, "new answer"};
        QCOMPARE(name(*(*store)->finish(f)), name(FinishVerdict::Accept));
        QVERIFY(redisCli(port, {u"SET"_qs, p + u"layout"_qs, u"3"_qs}));
        QVERIFY((*store)->migrateLayout(true).ok());
        const auto replay = (*store)->claim(claimOf(u"ep:k"_qs));
        QCOMPARE(name(replay->decision.action), name(ClaimAction::Replay));
        QCOMPARE(replay->record.result.body, QByteArray("new answer"));
        QByteArray out;
        QVERIFY(redisCli(port, {u"EXISTS"_qs, v3}, &out));
        QCOMPARE(out.trimmed(), QByteArray("0")); // the stale copy is gone all the same
    }

    // The migration lock is this desk's while its value is: a desk that finds it taken over
    // (it paused past the lock's lifetime, another desk holds it now) stops, and leaves the
    // other desk's lock where it is.
    void aMigratorThatLostItsLockStops()
    {
        const quint16 port = m_redis->port();
        const QString p = u"stolen:"_qs;
        // 20000 v3 records (20 SCAN pages), written in one script.
        const QString make =
            uR"(for i = 1, 20000 do
                  local k = ARGV[1] .. '{ep:k' .. i .. '}:r'
                  redis.call('HSET', k, 'm', 'completed ' .. i .. ' 1 1 1 0 ' .. ARGV[2] ..
                             ' 200 generic ep f', 'h', '[]', 'q', 'POST /hooks/ep\n[]\nb', 's', '[]\nok')
                end
                return 1)"_qs;
        const QString until = QString::number(QDateTime::currentMSecsSinceEpoch() + 3'600'000);
        QVERIFY(redisCli(port, {u"EVAL"_qs, make, u"0"_qs, p, until}));
        QVERIFY(redisCli(port, {u"SET"_qs, p + u"layout"_qs, u"3"_qs}));
        const QByteArray lock = (p + u"migrating"_qs).toUtf8();
        std::atomic<bool> stolen{false}, stop{false};
        std::thread other([&] {
            redisContext *c = redisConnect("127.0.0.1", port);
            while (c && !c->err && !stop && !stolen) {
                auto *r = static_cast<redisReply *>(
                    redisCommand(c, "SET %b other-desk XX PX 60000", lock.constData(),
                                 size_t(lock.size())));
                stolen = r && r->type == REDIS_REPLY_STATUS;
                if (r)
                    freeReplyObject(r);
            }
            if (c)
                redisFree(c);
        });
        auto store = RedisStore::connect(*StoreUrl::parse(m_redis->url() + u"?prefix="_qs + p));
        QVERIFY(store.ok());
        auto migrated = (*store)->migrateLayout(true);
        stop = true;
        other.join();
        QVERIFY(stolen);
        QVERIFY(!migrated.ok());
        QCOMPARE(int(migrated.error().code), int(ErrorCode::Conflict));
        QVERIFY2(migrated.error().message.contains(u"another desk took over"_qs),
                 qPrintable(migrated.error().message));
        QByteArray out;
        QVERIFY(redisCli(port, {u"GET"_qs, QString::fromUtf8(lock)}, &out));
        QCOMPARE(out.trimmed(), QByteArray("other-desk"));
        QVERIFY(redisCli(port, {u"GET"_qs, p + u"layout"_qs}, &out));
        QCOMPARE(out.trimmed(), QByteArray("3"));
        QVERIFY(redisCli(port, {u"DEL"_qs, QString::fromUtf8(lock)}));
        QCOMPARE(*(*store)->migrateLayout(true), 20000); // the next migration finishes it
    }

    // Export walks the records, not the indexes: a record whose index entries are gone (an
    // index evicted, a key written by hand) is exported all the same.
    void exportFindsRecordsWhoseIndexesAreGone()
    {
        const quint16 port = m_redis->port();
        const QString p = u"noindex:"_qs;
        auto store = RedisStore::connect(*StoreUrl::parse(m_redis->url() + u"?prefix="_qs + p));
        QVERIFY(store.ok());
        for (const QString &k : {u"ep:a"_qs, u"ep:b"_qs, u"other:c"_qs})
            QVERIFY((*store)->claim(claimOf(k))->claimed());
        const redis::Layout layout(p.toUtf8(), 1);
        QVERIFY(redisCli(port, {u"DEL"_qs, QString::fromUtf8(layout.keys(0, u"ep"_qs)),
                                QString::fromUtf8(layout.endpoints(0))}));
        QCOMPARE(*(*store)->keyNames({}), (QStringList{u"ep:a"_qs, u"ep:b"_qs, u"other:c"_qs}));
        KeyQuery q;
        q.endpoint = u"ep"_qs;
        QCOMPARE(*(*store)->keyNames(q), (QStringList{u"ep:a"_qs, u"ep:b"_qs}));
        q.glob = u"*b"_qs;
        QCOMPARE(*(*store)->keyNames(q), QStringList{u"ep:b"_qs});
    }

    // Records laid out in a cluster's buckets, copied to a single Redis (or back), are where no
    // desk there reads them: refused, not served as an empty store.
    void recordsOfAnotherBucketCountAreRefused()
    {
        const quint16 port = m_redis->port();
        const QString p = u"buckets:"_qs;
        auto store = RedisStore::connect(*StoreUrl::parse(m_redis->url() + u"?prefix="_qs + p));
        QVERIFY(store.ok());
        QVERIFY((*store)->migrateLayout().ok());
        QVERIFY((*store)->ready().ok());
        QVERIFY(redisCli(port, {u"SET"_qs, p + u"buckets"_qs, u"64"_qs}));
        const auto refused = (*store)->ready();
        QVERIFY(!refused.ok());
        QVERIFY2(refused.error().message.contains(u"in 64 buckets"_qs),
                 qPrintable(refused.error().message));
    }

    // A record Redis expired before a purge ran takes its state index entry's owner with it;
    // the key claimed again, the purge still drops that entry (it is read by nobody, but it
    // is memory).
    void purgeDropsStateEntriesOfRecordsRedisExpired()
    {
        const quint16 port = m_redis->port();
        const QString p = u"stale:"_qs;
        auto store = RedisStore::connect(*StoreUrl::parse(m_redis->url() + u"?prefix="_qs + p));
        QVERIFY(store.ok());
        ClaimRequest brief = claimOf(u"ep:k"_qs);
        brief.policy.ttlMs = 200;
        FinishRequest f;
        f.key = brief.key;
        f.token = (*store)->claim(brief)->record.token;
        f.state = KeyState::Failed;
        f.result = {500, {}, "no"};
        f.error = u"boom"_qs;
        QCOMPARE(name(*(*store)->finish(f)), name(FinishVerdict::Accept));
        QTRY_VERIFY_WITH_TIMEOUT(!(*(*store)->key(brief.key)).has_value(), 5000);
        const redis::Layout layout(p.toUtf8(), 1);
        QVERIFY(redisCli(port, {u"DEL"_qs, QString::fromUtf8(layout.record(brief.key))}));
        QVERIFY((*store)->claim(claimOf(u"ep:k"_qs))->claimed());
        const QString failed = QString::fromUtf8(layout.stateIndex(0, u"ep"_qs, KeyState::Failed));
        QByteArray out;
        QVERIFY(redisCli(port, {u"ZCARD"_qs, failed}, &out));
        QCOMPARE(out.trimmed(), QByteArray("1"));
        QVERIFY((*store)->purgeExpired().ok());
        QVERIFY(redisCli(port, {u"ZCARD"_qs, failed}, &out));
        QCOMPARE(out.trimmed(), QByteArray("0"));
        QCOMPARE((*store)->countKeys(u"ep"_qs)->processing, 1);
    }

    // Every command migrates a v1 store at start, and says so; `idemdesk migrate` too.
    void commandsMigrateAtStart()
    {
        const quint16 port = m_redis->port();
        const QString p = u"v1cli:"_qs;
        for (const QString &k : {u"ep:a"_qs, u"ep:b"_qs})
            QCOMPARE(runV1(port, "claim",
                           {p, k, u"ep"_qs, u"generic"_qs, u"fp"_qs, u"60000"_qs, u"3600000"_qs,
                            u"reprocess"_qs, u"reject"_qs, u"POST"_qs, u"/hooks/ep"_qs, u"[]"_qs,
                            u"{}"_qs, u"64"_qs})
                         .value(0),
                     QByteArray("create"));
        const QString url = m_redis->url() + u"?prefix="_qs + p;
        QProcess keys;
        keys.start(QStringLiteral(IDEMDESK_BIN), {u"keys"_qs, u"list"_qs, u"--store"_qs, url});
        QVERIFY(keys.waitForFinished(20'000));
        QCOMPARE(keys.exitCode(), 0);
        const QByteArray err = keys.readAllStandardError();
        QVERIFY2(err.contains("held 2 records in an earlier layout"), err.constData());
        const QByteArray listed = keys.readAllStandardOutput();
        QVERIFY2(listed.contains("ep:a") && listed.contains("ep:b"), listed.constData());

        QProcess migrate;
        migrate.start(QStringLiteral(IDEMDESK_BIN), {u"migrate"_qs, u"--store"_qs, url});
        QVERIFY(migrate.waitForFinished(20'000));
        QCOMPARE(migrate.exitCode(), 0);
        const QByteArray said = migrate.readAllStandardOutput();
        QVERIFY2(said.startsWith("0 records migrated"), said.constData());
    }
};

QTEST_GUILESS_MAIN(TestRedis)
#include "tst_redis.moc"
