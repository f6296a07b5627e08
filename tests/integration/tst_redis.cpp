// What only Redis has: the script cache can be flushed under the desk, prefixes keep desks
// apart on one server, and a hung server times out (503) instead of hanging the receiver; and
// the receiver thread's own asynchronous lane (RedisLane) keeps all of that too.
#include "store/redislane.h"
#include "store/redisstore.h"
#include "store/storefactory.h"
#include "support/names.h"
#include "support/servers.h"
#include "util/clock.h"

#include <QElapsedTimer>
#include <QProcess>
#include <QScopeGuard>
#include <QTemporaryDir>
#include <QTest>

#include <csignal>

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

bool redisCli(quint16 port, const QStringList &args)
{
    QProcess cli;
    cli.start(u"redis-cli"_qs, QStringList{u"-p"_qs, QString::number(port)} + args);
    return cli.waitForFinished(5000) && cli.exitCode() == 0;
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
};

QTEST_GUILESS_MAIN(TestRedis)
#include "tst_redis.moc"
