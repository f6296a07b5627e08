// What only Redis has: the script cache can be flushed under the desk, prefixes keep desks
// apart on one server, and a hung server times out (503) instead of hanging the receiver.
#include "store/redisstore.h"
#include "store/storefactory.h"
#include "support/names.h"
#include "support/servers.h"
#include "util/clock.h"

#include <QElapsedTimer>
#include <QProcess>
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
    c.nowMs = wallMs();
    return c;
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
        QCOMPARE((*(*store)->key(u"flush:a"_qs, wallMs()))->attempts, 2);
    }

    void prefixesKeepDesksApart()
    {
        auto one = RedisStore::connect(*StoreUrl::parse(m_redis->url() + u"?prefix=desk1:"_qs));
        auto two = RedisStore::connect(*StoreUrl::parse(m_redis->url() + u"?prefix=desk2:"_qs));
        QVERIFY(one.ok() && two.ok());
        QVERIFY((*one)->claim(claimOf(u"shared:k"_qs))->claimed());
        QVERIFY((*two)->claim(claimOf(u"shared:k"_qs))->claimed()); // another desk: its own key
        QCOMPARE((*one)->countKeys(u"shared"_qs, wallMs())->total(), 1);
        KeyQuery q;
        q.nowMs = wallMs();
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
};

QTEST_GUILESS_MAIN(TestRedis)
#include "tst_redis.moc"
