// The store contract (docs/stores.md#the-store-contract): one suite, unchanged on every backend.
//   tst_store_contract sqlite | redis | cluster | postgres
// redis, cluster and postgres read IDEM_TEST_REDIS_URL / IDEM_TEST_REDIS_CLUSTER_URL /
// IDEM_TEST_POSTGRES_URL (./dev test sets them).
#include "store/redisprotocol.h"
#include "store/sqlitestore.h"
#include "store/storefactory.h"
#include "store/storepool.h"
#include "store/transfer.h"
#include "support/names.h"
#include "support/pgdiskfull.h"
#include "util/clock.h"
#include "util/crypto.h"

#include <QBuffer>
#include <QDeadlineTimer>
#include <QFileInfo>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QRandomGenerator>
#include <QScopeGuard>
#include <QSet>
#include <QTemporaryDir>
#include <QTest>

#include <limits>

#include <thread>

#include <sqlite3.h>

using namespace idem;
using idem::test::name;
using idem::test::PgDiskFull;

namespace {
QString g_backend;

// A real store, every call forwarded; the probes below change what they watch.
struct Forwarding : IdempotencyStore
{
    IdempotencyStore *inner;
    explicit Forwarding(IdempotencyStore *s) : inner(s) {}
    Result<ClaimResult> claim(const ClaimRequest &q) override { return inner->claim(q); }
    Result<FinishVerdict> finish(const FinishRequest &q) override { return inner->finish(q); }
    Result<std::optional<KeyRecord>> key(const QString &k) override { return inner->key(k); }
    Result<QList<KeyRecord>> listKeys(const KeyQuery &q) override { return inner->listKeys(q); }
    Result<KeyPage> findKeys(const KeyQuery &q) override { return inner->findKeys(q); }
    Result<QStringList> keyNames(const KeyQuery &q) override { return inner->keyNames(q); }
    Result<StateCounts> countKeys(const QString &e) override { return inner->countKeys(e); }
    Result<OperatorVerdict> applyOperator(const QString &k, OperatorAction a, bool f, const QString &d) override
    {
        return inner->applyOperator(k, a, f, d);
    }
    Result<qint64> purgeExpired() override { return inner->purgeExpired(); }
    Result<ImportVerdict> importRecord(const KeyRecord &r, qint64 t, qint64 l) override
    {
        return inner->importRecord(r, t, l);
    }
    Result<QString> serverVersion() override { return inner->serverVersion(); }
    Result<qint64> clockMs() override { return inner->clockMs(); }
    Result<void> appendDeliveries(const QList<DeliveryEvent> &e) override { return inner->appendDeliveries(e); }
    bool deliveriesIndexedByKey() const override { return inner->deliveriesIndexedByKey(); }
    Result<QList<DeliveryEvent>> deliveries(const DeliveryQuery &q) override { return inner->deliveries(q); }
    Result<void> ping() override { return inner->ping(); }
    bool batches() const override { return inner->batches(); }
    bool beginBatch() override { return inner->beginBatch(); }
    Result<void> endBatch() override { return inner->endBatch(); }
};

// A real store whose group commit can be made to fail, and which counts its batches.
struct CommitProbe final : Forwarding
{
    std::unique_ptr<IdempotencyStore> owned;
    std::atomic<int> *begun;
    std::atomic<bool> *failCommits;
    CommitProbe(std::unique_ptr<IdempotencyStore> s, std::atomic<int> *b, std::atomic<bool> *f)
        : Forwarding(s.get()), owned(std::move(s)), begun(b), failCommits(f)
    {}
    bool beginBatch() override
    {
        const bool ok = inner->beginBatch();
        *begun += ok;
        return ok;
    }
    Result<void> endBatch() override
    {
        if (*failCommits) // the batch rolled back, as SQLite does when its COMMIT fails
            sqlite3_exec(dynamic_cast<SqliteStore &>(*owned).handle(), "ROLLBACK", nullptr, nullptr,
                         nullptr);
        return inner->endBatch();
    }
};

// A real store whose key() first runs `onKey` (what other connections do meanwhile), and which
// counts deliveries() calls.
struct Moving final : Forwarding
{
    std::function<void(const QString &)> onKey;
    int deliveryReads = 0;
    using Forwarding::Forwarding;
    Result<std::optional<KeyRecord>> key(const QString &k) override
    {
        if (onKey)
            onKey(k);
        return inner->key(k);
    }
    Result<QList<DeliveryEvent>> deliveries(const DeliveryQuery &q) override
    {
        ++deliveryReads;
        return inner->deliveries(q);
    }
};

// A real store that refuses some imports (as a store refuses a value out of its range) and can
// stop answering altogether.
struct Refusing final : Forwarding
{
    QString refuse;    // importRecord() of this key fails
    bool down = false; // every import and ping fails
    using Forwarding::Forwarding;
    Result<ImportVerdict> importRecord(const KeyRecord &r, qint64 t, qint64 l) override
    {
        if (down || r.key == refuse)
            return makeError(ErrorCode::Unavailable, u"refused by the test"_qs);
        return inner->importRecord(r, t, l);
    }
    Result<void> ping() override
    {
        if (down)
            return makeError(ErrorCode::Unavailable, u"down"_qs);
        return inner->ping();
    }
};
int runTool(const QString &program, const QStringList &args)
{
    QProcess p;
    p.start(program, args);
    if (!p.waitForFinished(20'000))
        return -1;
    if (p.exitCode() != 0)
        qWarning("%s: %s", qPrintable(program), p.readAllStandardError().constData());
    return p.exitCode();
}
} // namespace

class TestStoreContract : public QObject
{
    Q_OBJECT
private:
    QTemporaryDir m_dir;
    StoreFactory m_factory;
    std::unique_ptr<IdempotencyStore> m_store;
    QString m_run; // keeps this run's keys apart from earlier runs on a shared server
    int m_seq = 0;

    QString endpoint() { return u"ep%1x%2"_qs.arg(m_run).arg(++m_seq); }
    ClaimRequest request(const QString &ep, const QString &k, const QByteArray &fp = "f1",
                         qint64 leaseMs = 60'000, qint64 ttlMs = 3'600'000)
    {
        ClaimRequest r;
        r.endpoint = ep;
        r.key = ep + u":"_qs + k;
        r.provider = u"generic"_qs;
        r.fingerprint = fp;
        r.request = {"POST", "/hooks/" + ep.toUtf8(), {{"Idempotency-Key", k.toUtf8()}, {"X-A", "1"}}, "{\"a\":1}"};
        r.policy.leaseMs = leaseMs;
        r.policy.ttlMs = ttlMs;
        return r;
    }
    // A failed key as `keys import` reads it from another store's export, with that store's token.
    static KeyRecord exported(const QString &ep, const QString &k, const QByteArray &fp,
                              qint64 token)
    {
        KeyRecord r;
        r.key = ep + u':' + k;
        r.endpoint = ep;
        r.provider = u"generic"_qs;
        r.state = KeyState::Failed;
        r.fingerprint = fp;
        r.token = token;
        r.attempts = 1;
        r.createdMs = r.updatedMs = 1'700'000'000'000;
        r.request = {"POST", "/hooks/x", {}, "{}"};
        r.result = {500, {{"Content-Type", "text/plain"}}, "down"};
        r.error = u"downstream said 500"_qs;
        return r;
    }
    ClaimResult claim(const ClaimRequest &r)
    {
        auto result = m_store->claim(r);
        if (!result)
            qFatal("claim failed: %s", qPrintable(result.error().message));
        return *result;
    }
    // The store's clock: leases and expiry are measured on it, so tests wait on it too.
    qint64 storeNow()
    {
        auto now = m_store->clockMs();
        if (!now)
            qFatal("clock failed: %s", qPrintable(now.error().message));
        return *now;
    }
    // Waits until the store's clock has passed `ms` (a lease's or a record's end).
    bool storeClockPasses(qint64 ms)
    {
        QDeadlineTimer deadline(15'000);
        while (storeNow() <= ms) { // polled like QTRY_VERIFY does
            if (deadline.hasExpired())
                return false;
            QTest::qWait(20);
        }
        return true;
    }
    FinishVerdict finish(const QString &key, qint64 token, KeyState state, int status = 200,
                         const QByteArray &body = "ok")
    {
        FinishRequest f;
        f.key = key;
        f.token = token;
        f.state = state;
        f.result = {status, {{"Content-Type", "application/json"}, {"X-R", "r"}}, body};
        f.error = state == KeyState::Failed ? u"boom"_qs : QString();
        auto v = m_store->finish(f);
        if (!v)
            qFatal("finish failed: %s", qPrintable(v.error().message));
        return *v;
    }

    // Makes the store refuse writes of `ep`'s keys (SQLite read-only, PostgreSQL out of disk,
    // Redis out of memory) until the returned function is called.
    std::function<void()> refuseWrites(const QString &ep)
    {
        if (g_backend == u"sqlite"_qs) {
            sqlite3 *db = dynamic_cast<SqliteStore &>(*m_store).handle();
            if (sqlite3_exec(db, "PRAGMA query_only = 1", nullptr, nullptr, nullptr) != SQLITE_OK)
                return {};
            return [db] { sqlite3_exec(db, "PRAGMA query_only = 0", nullptr, nullptr, nullptr); };
        }
        if (g_backend == u"postgres"_qs) {
            auto full =
                std::make_shared<PgDiskFull>(ep, QStringList{u"INSERT OR UPDATE ON idem_keys"_qs});
            if (!full->ok())
                return {};
            return [full] { full->lift(); };
        }
        const StoreUrl url = *StoreUrl::parse(qEnvironmentVariable("IDEM_TEST_REDIS_URL"));
        const QStringList cli{u"-h"_qs,     url.host,  u"-p"_qs,       QString::number(url.port),
                              u"CONFIG"_qs, u"SET"_qs, u"maxmemory"_qs};
        if (runTool(u"redis-cli"_qs, cli + QStringList{u"1"_qs}) != 0)
            return {};
        return [cli] { runTool(u"redis-cli"_qs, cli + QStringList{u"0"_qs}); };
    }

    // Removes a batch's shared content from the store behind its back, as an operator's
    // DELETE, a lost Redis key or a purge racing a batch would.
    bool dropShared(const QByteArray &ref)
    {
        if (g_backend == u"sqlite"_qs) {
            sqlite3 *db = dynamic_cast<SqliteStore &>(*m_store).handle();
            const QByteArray sql = "DELETE FROM idem_shared WHERE sha256 = '" + ref + "'";
            return sqlite3_exec(db, sql.constData(), nullptr, nullptr, nullptr) == SQLITE_OK &&
                   sqlite3_changes(db) == 1;
        }
        if (g_backend == u"postgres"_qs)
            return runTool(u"psql"_qs, {qEnvironmentVariable("IDEM_TEST_POSTGRES_URL"),
                                        u"-v"_qs, u"ON_ERROR_STOP=1"_qs, u"-qc"_qs,
                                        u"DELETE FROM idem_shared WHERE sha256 = '%1'"_qs.arg(
                                            QString::fromLatin1(ref))}) == 0;
        // Redis, or a cluster's first node (redis-cli -c follows MOVED to the key's node).
        const StoreUrl url = *StoreUrl::parse(qEnvironmentVariable(
            g_backend == u"cluster"_qs ? "IDEM_TEST_REDIS_CLUSTER_URL" : "IDEM_TEST_REDIS_URL"));
        QProcess cli;
        cli.start(u"redis-cli"_qs,
                  {u"-c"_qs, u"-h"_qs, url.host, u"-p"_qs, QString::number(url.port), u"DEL"_qs,
                   QString::fromUtf8(redis::sharedKey(url.prefix.toUtf8(), ref))});
        return cli.waitForFinished(20'000) && cli.readAllStandardOutput().trimmed() == "1";
    }

private Q_SLOTS:
    void initTestCase()
    {
        m_run = QString::number(QRandomGenerator::global()->bounded(1u << 30), 36);
        QString url;
        if (g_backend == u"sqlite"_qs) {
            url = u"sqlite:"_qs + m_dir.filePath(u"contract.db"_qs);
        } else {
            const char *var = g_backend == u"redis"_qs     ? "IDEM_TEST_REDIS_URL"
                              : g_backend == u"cluster"_qs ? "IDEM_TEST_REDIS_CLUSTER_URL"
                                                           : "IDEM_TEST_POSTGRES_URL";
            url = qEnvironmentVariable(var);
            if (url.isEmpty())
                QFAIL(qPrintable(u"%1 is not set: run the suite through ./dev test"_qs.arg(QLatin1String(var))));
        }
        auto parsed = StoreUrl::parse(url);
        QVERIFY2(parsed.ok(), parsed.ok() ? "" : qPrintable(parsed.error().message));
        m_factory = storeFactory(*parsed);
        auto store = m_factory();
        QVERIFY2(store.ok(), store.ok() ? "" : qPrintable(store.error().message));
        m_store = std::move(store.value());
        QVERIFY(m_store->ping().ok());
    }

    void claimNewKey()
    {
        const QString ep = endpoint();
        const ClaimResult r = claim(request(ep, u"a"_qs));
        QCOMPARE(name(r.decision.action), name(ClaimAction::Create));
        QCOMPARE(name(r.decision.outcome), name(Outcome::Processed));
        QVERIFY(r.claimed());
        QCOMPARE(name(r.record.state), name(KeyState::Processing));
        QVERIFY(r.record.token >= 1);
        QCOMPARE(r.record.attempts, 1);
        auto stored = m_store->key(ep + u":a"_qs);
        QVERIFY(stored.ok() && stored->has_value());
        const KeyRecord &k = **stored;
        QCOMPARE(name(k.state), name(KeyState::Processing));
        QCOMPARE(k.endpoint, ep);
        QCOMPARE(k.provider, u"generic"_qs);
        QCOMPARE(k.fingerprint, QByteArray("f1"));
        QCOMPARE(k.token, r.record.token);
        QCOMPARE(k.request.method, QByteArray("POST"));
        QCOMPARE(k.request.body, QByteArray("{\"a\":1}"));
        QCOMPARE(headerValue(k.request.headers, "x-a"), QByteArray("1"));
        // Decided on the store's clock, at the claim.
        QCOMPARE(k.leaseUntilMs, r.storeNowMs + 60'000);
        QCOMPARE(k.expiresAtMs, r.storeNowMs + 3'600'000);
        QCOMPARE(k.createdMs, r.storeNowMs);
        QVERIFY(qAbs(storeNow() - r.storeNowMs) < 10'000);
        QCOMPARE(k.history.size(), 1);
        QCOMPARE(k.history.first().event, u"claimed"_qs);
    }

    void duplicateWhileProcessingIsInProgress()
    {
        const QString ep = endpoint();
        const ClaimResult first = claim(request(ep, u"a"_qs));
        const ClaimResult second = claim(request(ep, u"a"_qs));
        QCOMPARE(name(second.decision.action), name(ClaimAction::InProgress));
        QVERIFY(!second.claimed());
        QCOMPARE(second.record.token, first.record.token);
        QVERIFY(second.record.leaseUntilMs > second.storeNowMs);
        QCOMPARE((*m_store->key(ep + u":a"_qs))->attempts, 2);
    }

    void completedIsReplayedByteForByte()
    {
        const QString ep = endpoint();
        const QString key = ep + u":a"_qs;
        const ClaimResult c = claim(request(ep, u"a"_qs));
        const QByteArray body("{\"x\":1}\0binary\xff", 15);
        QCOMPARE(name(finish(key, c.record.token, KeyState::Completed, 201, body)), name(FinishVerdict::Accept));
        const ClaimResult replay = claim(request(ep, u"a"_qs));
        QCOMPARE(name(replay.decision.action), name(ClaimAction::Replay));
        QCOMPARE(name(replay.decision.outcome), name(Outcome::Replayed));
        QCOMPARE(replay.record.result.status, 201);
        QCOMPARE(replay.record.result.body, body);
        QCOMPARE(headerValue(replay.record.result.headers, "X-R"), QByteArray("r"));
        const KeyRecord k = **m_store->key(key);
        QCOMPARE(name(k.state), name(KeyState::Completed));
        QCOMPARE(k.attempts, 2);
        QCOMPARE(k.history.last().event, u"completed"_qs);
    }

    void onlyTheTokenHolderFinishes()
    {
        const QString ep = endpoint();
        const QString key = ep + u":a"_qs;
        const ClaimResult c = claim(request(ep, u"a"_qs));
        QCOMPARE(name(finish(key, c.record.token + 1, KeyState::Completed)), name(FinishVerdict::StaleToken));
        QCOMPARE(name(finish(key, c.record.token - 1, KeyState::Failed)), name(FinishVerdict::StaleToken));
        QCOMPARE(name((*m_store->key(key))->state), name(KeyState::Processing));
        QCOMPARE(name(finish(key, c.record.token, KeyState::Completed)), name(FinishVerdict::Accept));
        QCOMPARE(name(finish(key, c.record.token, KeyState::Failed)), name(FinishVerdict::NotProcessing));
        QCOMPARE(name((*m_store->key(key))->state), name(KeyState::Completed));
        QCOMPARE(name(finish(ep + u":never"_qs, 1, KeyState::Completed)), name(FinishVerdict::Missing));
    }

    void expiredLeaseIsRecoveredAndTheOldWorkerRefused()
    {
        const QString ep = endpoint();
        const QString key = ep + u":a"_qs;
        const ClaimResult first = claim(request(ep, u"a"_qs, "f1", 1500));
        QCOMPARE(name(claim(request(ep, u"a"_qs, "f1", 1500)).decision.action), name(ClaimAction::InProgress));
        QVERIFY(storeClockPasses(first.record.leaseUntilMs));
        const ClaimResult second = claim(request(ep, u"a"_qs, "f1"));
        QVERIFY(second.claimed());
        QCOMPARE(name(second.decision.outcome), name(Outcome::Recovered));
        QVERIFY(second.record.token > first.record.token);
        QCOMPARE(name(finish(key, first.record.token, KeyState::Completed, 200, "old")), name(FinishVerdict::StaleToken));
        QCOMPARE(name(finish(key, second.record.token, KeyState::Completed, 200, "new")), name(FinishVerdict::Accept));
        const KeyRecord k = **m_store->key(key);
        QCOMPARE(k.result.body, QByteArray("new"));
        QStringList events;
        for (const auto &h : k.history)
            events << h.event;
        QCOMPARE(events, QStringList({u"claimed"_qs, u"recovered"_qs, u"completed"_qs}));
    }

    void failedIsReprocessedOrReplayed()
    {
        const QString ep = endpoint();
        const QString key = ep + u":a"_qs;
        ClaimResult c = claim(request(ep, u"a"_qs));
        QCOMPARE(name(finish(key, c.record.token, KeyState::Failed, 502, "down")), name(FinishVerdict::Accept));
        const KeyRecord failed = **m_store->key(key);
        QCOMPARE(name(failed.state), name(KeyState::Failed));
        QCOMPARE(failed.error, u"boom"_qs);

        ClaimRequest reject = request(ep, u"a"_qs);
        reject.policy.onFailed = OnFailed::Reject;
        const ClaimResult replayed = claim(reject);
        QCOMPARE(name(replayed.decision.action), name(ClaimAction::Replay));
        QCOMPARE(replayed.record.result.status, 502);
        QCOMPARE(replayed.record.result.body, QByteArray("down"));

        const ClaimResult again = claim(request(ep, u"a"_qs));
        QCOMPARE(name(again.decision.outcome), name(Outcome::Reprocessed));
        QVERIFY(again.record.token > c.record.token);
        QCOMPARE(name(finish(key, again.record.token, KeyState::Completed)), name(FinishVerdict::Accept));
        QCOMPARE((*m_store->key(key))->attempts, 3);
    }

    // A key failed and reprocessed again and again keeps its first history entry (how it
    // started) and the newest ones, kHistoryCap in all, on every store alike.
    void historyIsCappedKeepingTheFirstEntry()
    {
        const QString ep = endpoint();
        const QString key = ep + u":a"_qs;
        const ClaimResult first = claim(request(ep, u"a"_qs));
        qint64 token = first.record.token;
        for (int i = 0; i < kHistoryCap / 2 + 8; ++i) { // 1 + 2 entries a round: past the cap
            QCOMPARE(name(finish(key, token, KeyState::Failed, 502, "down")),
                     name(FinishVerdict::Accept));
            const ClaimResult again = claim(request(ep, u"a"_qs));
            QCOMPARE(name(again.decision.outcome), name(Outcome::Reprocessed));
            token = again.record.token;
            const QList<HistoryEntry> history = (*m_store->key(key))->history;
            QCOMPARE(history.size(), std::min(kHistoryCap, 3 + 2 * i));
        }
        QCOMPARE(name(finish(key, token, KeyState::Completed)), name(FinishVerdict::Accept));
        const QList<HistoryEntry> history = (*m_store->key(key))->history;
        QCOMPARE(history.size(), kHistoryCap);
        QCOMPARE(history.first().event, u"claimed"_qs);
        QCOMPARE(history.first().token, first.record.token);
        QCOMPARE(history.last().event, u"completed"_qs);
        QCOMPARE(history.last().token, token);
        QCOMPARE(history.at(history.size() - 2).event, u"reprocessed"_qs);
        QCOMPARE(history.at(1).event, u"failed"_qs); // the oldest kept after the first
        for (qsizetype i = 2; i < history.size(); ++i)
            QVERIFY(history.at(i).token >= history.at(i - 1).token);
    }

    void mismatchLeavesTheRecordUntouched()
    {
        const QString ep = endpoint();
        const QString key = ep + u":a"_qs;
        const ClaimResult c = claim(request(ep, u"a"_qs, "f1"));
        QCOMPARE(name(finish(key, c.record.token, KeyState::Completed)), name(FinishVerdict::Accept));
        const KeyRecord before = **m_store->key(key);
        const ClaimResult m = claim(request(ep, u"a"_qs, "f2"));
        QCOMPARE(name(m.decision.action), name(ClaimAction::Mismatch));
        QCOMPARE(m.record.fingerprint, QByteArray("f1"));
        const KeyRecord after = **m_store->key(key);
        QCOMPARE(after.attempts, before.attempts);
        QCOMPARE(after.fingerprint, QByteArray("f1"));
        QCOMPARE(after.updatedMs, before.updatedMs);
        QCOMPARE(name(after.state), name(KeyState::Completed));
    }

    void expiredRecordsCountAsAbsent()
    {
        const QString ep = endpoint();
        const QString key = ep + u":a"_qs;
        const ClaimResult c = claim(request(ep, u"a"_qs, "f1", 60'000, 1500));
        QCOMPARE(name(finish(key, c.record.token, KeyState::Completed)), name(FinishVerdict::Accept));
        QTRY_VERIFY_WITH_TIMEOUT(!m_store->key(key)->has_value(), 5000);
        KeyQuery q;
        q.endpoint = ep;
        QCOMPARE(m_store->listKeys(q)->size(), 0);
        QCOMPARE(m_store->countKeys(ep)->total(), 0);
        const ClaimResult fresh = claim(request(ep, u"a"_qs, "other-payload"));
        QCOMPARE(name(fresh.decision.action), name(ClaimAction::Create));
        QCOMPARE(fresh.record.attempts, 1);
    }

    void purgeRemovesExpired()
    {
        const QString ep = endpoint();
        claim(request(ep, u"gone"_qs, "f1", 60'000, 200));
        claim(request(ep, u"kept"_qs));
        QVERIFY(storeClockPasses((*m_store->key(ep + u":gone"_qs))->expiresAtMs));
        auto purged = m_store->purgeExpired();
        QVERIFY(purged.ok());
        QVERIFY(!m_store->key(ep + u":gone"_qs)->has_value());
        QVERIFY(m_store->key(ep + u":kept"_qs)->has_value());
    }

    void listAndCountByStateEndpointAndGlob()
    {
        const QString ep = endpoint();
        const QString other = endpoint();
        for (int i = 0; i < 3; ++i) {
            const ClaimResult c = claim(request(ep, u"done-%1"_qs.arg(i)));
            finish(c.record.key.isEmpty() ? ep + u":done-%1"_qs.arg(i) : c.record.key, c.record.token, KeyState::Completed);
        }
        for (int i = 0; i < 2; ++i) {
            const ClaimResult c = claim(request(ep, u"bad-%1"_qs.arg(i)));
            finish(ep + u":bad-%1"_qs.arg(i), c.record.token, KeyState::Failed);
        }
        claim(request(ep, u"busy"_qs));
        claim(request(other, u"elsewhere"_qs));

        const StateCounts counts = *m_store->countKeys(ep);
        QCOMPARE(counts.completed, 3);
        QCOMPARE(counts.failed, 2);
        QCOMPARE(counts.processing, 1);
        QCOMPARE(counts.total(), 6);

        KeyQuery q;
        q.endpoint = ep;
        QCOMPARE(m_store->listKeys(q)->size(), 6);
        q.state = KeyState::Failed;
        auto failed = *m_store->listKeys(q);
        QCOMPARE(failed.size(), 2);
        for (const auto &k : failed) {
            QCOMPARE(name(k.state), name(KeyState::Failed));
            QCOMPARE(k.endpoint, ep);
        }
        q.state.reset();
        q.glob = ep + u":done-*"_qs;
        QCOMPARE(m_store->listKeys(q)->size(), 3);
        q.glob.clear();
        q.limit = 4;
        QCOMPARE(m_store->listKeys(q)->size(), 4);
        q.offset = 4;
        QCOMPARE(m_store->listKeys(q)->size(), 2);
        KeyQuery all;
        all.glob = u"*elsewhere"_qs;
        all.limit = 1000;
        const auto found = *m_store->listKeys(all);
        QVERIFY(std::any_of(found.begin(), found.end(), [&](const KeyRecord &k) { return k.endpoint == other; }));
    }

    // Every page of a find from the newest key on, until the store says nothing older matches.
    QList<KeyRecord> findAll(KeyQuery q, int *pages = nullptr)
    {
        QList<KeyRecord> all;
        for (int page = 0; page < 10000; ++page) {
            auto found = m_store->findKeys(q);
            if (!found)
                qFatal("find failed: %s", qPrintable(found.error().message));
            if (found->records.size() > q.limit)
                qFatal("a page of %d records, the limit is %d", int(found->records.size()),
                       q.limit);
            all += found->records;
            if (pages)
                *pages = page + 1;
            if (found->next.isEmpty())
                return all;
            q.after = found->next;
        }
        qFatal("the find never ended");
    }
    static QStringList keysOf(const QList<KeyRecord> &records)
    {
        QStringList keys;
        for (const KeyRecord &r : records)
            keys << r.key;
        return keys;
    }

    void theEventTypeIsKeptWithTheRecordAndFiltersTheList()
    {
        const QString ep = endpoint();
        for (int i = 0; i < 5; ++i) {
            ClaimRequest r = request(ep, u"k%1"_qs.arg(i));
            r.type = i % 2 ? u"invoice.paid"_qs : u"payment_intent.succeeded"_qs;
            const ClaimResult c = claim(r);
            if (i < 3)
                finish(r.key, c.record.token, i == 2 ? KeyState::Failed : KeyState::Completed);
        }
        ClaimRequest untyped = request(ep, u"none"_qs);
        claim(untyped);
        auto stored = m_store->key(ep + u":k1"_qs);
        QVERIFY(stored.ok() && stored->has_value());
        QCOMPARE((*stored)->type, u"invoice.paid"_qs);
        QCOMPARE((**m_store->key(ep + u":none"_qs)).type, QString());
        KeyQuery q;
        q.endpoint = ep;
        q.type = u"payment_intent.succeeded"_qs;
        q.limit = 2;
        int pages = 0;
        QList<KeyRecord> paid = findAll(q, &pages);
        QCOMPARE(keysOf(paid), (QStringList{ep + u":k4"_qs, ep + u":k2"_qs, ep + u":k0"_qs}));
        QVERIFY(pages >= 2);
        for (const KeyRecord &r : paid)
            QCOMPARE(r.type, q.type);
        q.state = KeyState::Failed;
        QCOMPARE(keysOf(findAll(q)), QStringList{ep + u":k2"_qs});
        q.state.reset();
        q.type = u"invoice"_qs; // exact, not a prefix
        QVERIFY(findAll(q).isEmpty());
        // A failed key claimed again keeps the type its new delivery names.
        ClaimRequest again = request(ep, u"k2"_qs);
        again.type = u"payment_intent.succeeded"_qs;
        QVERIFY(claim(again).claimed());
        QCOMPARE((**m_store->key(ep + u":k2"_qs)).type, again.type);
        // The delivery log keeps each delivery's type.
        DeliveryEvent e;
        e.atMs = storeNow();
        e.endpoint = ep;
        e.key = ep + u":k1"_qs;
        e.type = u"invoice.paid"_qs;
        QVERIFY(m_store->appendDeliveries({e}).ok());
        DeliveryQuery dq;
        dq.endpoint = ep;
        dq.key = e.key;
        auto log = m_store->deliveries(dq);
        QVERIFY(log.ok() && !log->isEmpty());
        QCOMPARE(log->first().type, u"invoice.paid"_qs);
        // An import keeps it.
        KeyRecord imported = exported(ep, u"moved"_qs, "f9", 5);
        imported.type = u"charge.refunded"_qs;
        QVERIFY(m_store->importRecord(imported, 3'600'000, 60'000).ok());
        QCOMPARE((**m_store->key(imported.key)).type, u"charge.refunded"_qs);
    }

    void searchFindsTextInTheStoredBodiesPageByPage()
    {
        const QString ep = endpoint();
        const QList<QByteArray> bodies{"{\"customer\":\"ACME Corp\"}",
                                       "{\"customer\":\"globex\"}",
                                       "{\"note\":\"acme\"}",
                                       "{\"name\":\"caf\xc3\xa9\"}",
                                       "{\"x\":\"Acme-2\"}",
                                       "{\"x\":1}",
                                       "{\"who\":\"acmE\"}"};
        for (qsizetype i = 0; i < bodies.size(); ++i) {
            ClaimRequest r = request(ep, u"b%1"_qs.arg(i));
            r.request.body = bodies.at(i);
            r.request.headers.append(
                {QByteArray("X-Note"), QByteArray("acme in a header is not in the body")});
            r.fingerprint = sha256Hex(bodies.at(i));
            r.type = i == 4 ? u"t.two"_qs : u"t.one"_qs;
            const ClaimResult c = claim(r);
            if (i % 2 || i == 4)
                finish(r.key, c.record.token, KeyState::Completed);
        }
        KeyQuery q;
        q.endpoint = ep;
        q.search = u"acme"_qs;
        q.limit = 2;
        int pages = 0;
        const QList<KeyRecord> found = findAll(q, &pages);
        QCOMPARE(keysOf(found),
                 (QStringList{ep + u":b6"_qs, ep + u":b4"_qs, ep + u":b2"_qs, ep + u":b0"_qs}));
        QVERIFY(pages >= 2);
        // Without a body in the list (as listKeys()), with the type.
        QVERIFY(found.first().request.body.isEmpty());
        QCOMPARE(found.at(1).type, u"t.two"_qs);
        // With the other filters.
        q.type = u"t.one"_qs;
        QCOMPARE(keysOf(findAll(q)), (QStringList{ep + u":b6"_qs, ep + u":b2"_qs, ep + u":b0"_qs}));
        q.type.clear();
        q.state = KeyState::Processing;
        QCOMPARE(keysOf(findAll(q)), (QStringList{ep + u":b6"_qs, ep + u":b2"_qs, ep + u":b0"_qs}));
        q.state.reset();
        q.glob = ep + u":b[04]"_qs;
        QCOMPARE(keysOf(findAll(q)), (QStringList{ep + u":b4"_qs, ep + u":b0"_qs}));
        q.glob.clear();
        // Non-ASCII text is compared byte for byte; no match inside an escape of it.
        q.search = u"café"_qs;
        QCOMPARE(keysOf(findAll(q)), QStringList{ep + u":b3"_qs});
        q.search = u"303"_qs;
        QVERIFY(findAll(q).isEmpty());
        q.search = u"\"customer\":\"g"_qs; // quotes, a colon: text, not a pattern
        QCOMPARE(keysOf(findAll(q)), QStringList{ep + u":b1"_qs});
        q.search = u"%"_qs;
        QVERIFY(findAll(q).isEmpty());
        q.search = u".*"_qs;
        QVERIFY(findAll(q).isEmpty());
        // Nothing: an empty page and no next one.
        q.search = u"initech"_qs;
        auto none = m_store->findKeys(q);
        QVERIFY(none.ok());
        QVERIFY(none->records.isEmpty());
        QVERIFY(none->next.isEmpty());
        // Where no page stopped: refused, with what to give instead.
        q.after = u"not a position"_qs;
        auto bad = m_store->findKeys(q);
        QVERIFY(!bad.ok());
        QCOMPARE(int(bad.error().code), int(ErrorCode::Invalid));
    }

    void aSearchWithinItsBudgetSaysWhereToGoOn()
    {
        // A budget of 1 ms on a loaded machine: pages may come back short, or empty, but each
        // says where the next goes on, and together they find every match once.
        const QString ep = endpoint();
        QStringList expected;
        for (int i = 0; i < 300; ++i) {
            ClaimRequest r = request(ep, u"n%1"_qs.arg(i, 3, 10, QChar(u'0')));
            r.request.body = i % 50 == 7 ? "{\"needle\":true}" : QByteArray(2000, 'x');
            claim(r);
            if (i % 50 == 7)
                expected.prepend(r.key);
        }
        KeyQuery q;
        q.endpoint = ep;
        q.search = u"NEEDLE"_qs;
        q.limit = 100;
        q.budgetMs = 1;
        QStringList found = keysOf(findAll(q));
        QCOMPARE(QSet<QString>(found.begin(), found.end()).size(), found.size());
        std::sort(found.begin(), found.end());
        std::sort(expected.begin(), expected.end());
        QCOMPARE(found, expected);
    }

    void globsMatchAlikeOnEveryStore()
    {
        // The documented shell glob (keyGlobToRegex): '*' and '?' match a '/' too, a set may
        // hold one, a backslash is no escape, "[*]" is a literal '*'. What `keys list --match`
        // and `keys export --match` find, on every store.
        const QString ep = endpoint();
        const QStringList names{u"a/b/c"_qs, u"a/b"_qs, u"ab"_qs,   u"a-b"_qs,
                                u"a*b"_qs,   u"b/a"_qs, u"a\\b"_qs, u"a]b"_qs};
        for (const QString &n : names)
            claim(request(ep, n));
        const QList<QPair<QString, QStringList>> cases{
            {u"a*"_qs,
             {u"a/b/c"_qs, u"a/b"_qs, u"ab"_qs, u"a-b"_qs, u"a*b"_qs, u"a\\b"_qs, u"a]b"_qs}},
            {u"a/*"_qs, {u"a/b/c"_qs, u"a/b"_qs}},
            {u"*/c"_qs, {u"a/b/c"_qs}},
            {u"*"_qs, names},
            {u"a?b"_qs, {u"a/b"_qs, u"a-b"_qs, u"a*b"_qs, u"a\\b"_qs, u"a]b"_qs}},
            {u"a?"_qs, {u"ab"_qs}},
            {u"a[/-]b"_qs, {u"a/b"_qs, u"a-b"_qs}},
            {u"a[!/]b"_qs, {u"a-b"_qs, u"a*b"_qs, u"a\\b"_qs, u"a]b"_qs}},
            {u"a[^/*]b"_qs, {u"a-b"_qs, u"a\\b"_qs, u"a]b"_qs}},
            {u"a[]-]b"_qs, {u"a-b"_qs, u"a]b"_qs}},
            {u"a[*]b"_qs, {u"a*b"_qs}},
            {u"a\\b"_qs, {u"a\\b"_qs}},
            {u"[a-b]/?"_qs, {u"a/b"_qs, u"b/a"_qs}},
            {u"a[b"_qs, {}},
            {u"a.b"_qs, {}},
        };
        for (const auto &[glob, expected] : cases) {
            QStringList want;
            for (const QString &n : expected)
                want << ep + u":"_qs + n;
            want.sort();
            for (const bool byEndpoint : {true, false}) {
                KeyQuery q;
                q.endpoint = byEndpoint ? ep : QString();
                q.glob = ep + u":"_qs + glob;
                q.limit = 1000;
                auto listed = m_store->listKeys(q);
                QVERIFY2(listed.ok(), qPrintable(listed.ok() ? QString() : listed.error().message));
                QStringList got;
                for (const KeyRecord &k : *listed)
                    got << k.key;
                got.sort();
                QVERIFY2(got == want, qPrintable(u"listKeys %1: %2, expected %3"_qs.arg(
                                          glob, got.join(u' '), want.join(u' '))));
                auto named = m_store->keyNames(q);
                QVERIFY2(named.ok(), qPrintable(named.ok() ? QString() : named.error().message));
                got = *named;
                got.sort();
                QVERIFY2(got == want, qPrintable(u"keyNames %1: %2, expected %3"_qs.arg(
                                          glob, got.join(u' '), want.join(u' '))));
            }
        }
    }

    void operatorActions()
    {
        const QString ep = endpoint();
        const QString key = ep + u":a"_qs;
        ClaimRequest reject = request(ep, u"a"_qs, "f1", 300);
        reject.policy.onFailed = OnFailed::Reject;
        const ClaimResult c = claim(reject);
        QCOMPARE(name(*m_store->applyOperator(key, OperatorAction::Reset, false, u"op"_qs)), name(OperatorVerdict::WrongState));
        // While the lease is live a run may be going: nothing that would let the key run again
        // (the next delivery ran it beside the first run).
        QCOMPARE(name(*m_store->applyOperator(key, OperatorAction::ForceFail, false, u"stuck"_qs)),
                 name(OperatorVerdict::Leased));
        QCOMPARE(name(*m_store->applyOperator(key, OperatorAction::Reset, true, u"op"_qs)),
                 name(OperatorVerdict::Leased));
        QCOMPARE(name(*m_store->applyOperator(key, OperatorAction::Delete, false, {})),
                 name(OperatorVerdict::Leased));
        QCOMPARE(name((*m_store->key(key))->state), name(KeyState::Processing));
        QVERIFY(storeClockPasses(c.record.leaseUntilMs));
        QCOMPARE(name(*m_store->applyOperator(key, OperatorAction::ForceFail, false, u"stuck"_qs)), name(OperatorVerdict::Accept));
        const KeyRecord forced = **m_store->key(key);
        QCOMPARE(name(forced.state), name(KeyState::Failed));
        QCOMPARE(forced.error, u"stuck"_qs);
        // The worker that held the claim can no longer finish it; a failure with no result is
        // what the key already holds (decideFinish: same state, status 0, empty body): repeated.
        QCOMPARE(name(finish(key, c.record.token, KeyState::Completed)), name(FinishVerdict::NotProcessing));
        QCOMPARE(name(finish(key, c.record.token, KeyState::Failed, 500)),
                 name(FinishVerdict::NotProcessing));
        QCOMPARE(name(finish(key, c.record.token, KeyState::Failed, 0, {})),
                 name(FinishVerdict::Repeated));
        QCOMPARE(name(claim(reject).decision.action), name(ClaimAction::Replay));
        QCOMPARE(name(*m_store->applyOperator(key, OperatorAction::Reset, false, u"op"_qs)), name(OperatorVerdict::Accept));
        QCOMPARE(name((*m_store->key(key))->state), name(KeyState::Reset));
        const ClaimResult again = claim(reject);
        QCOMPARE(name(again.decision.outcome), name(Outcome::Reprocessed));
        QCOMPARE(name(finish(key, again.record.token, KeyState::Completed)), name(FinishVerdict::Accept));
        QCOMPARE(name(*m_store->applyOperator(key, OperatorAction::Reset, false, u"op"_qs)), name(OperatorVerdict::WrongState));
        QCOMPARE(name(*m_store->applyOperator(key, OperatorAction::Reset, true, u"op"_qs)), name(OperatorVerdict::Accept));
        QCOMPARE(name(*m_store->applyOperator(key, OperatorAction::Delete, false, {})), name(OperatorVerdict::Accept));
        QVERIFY(!m_store->key(key)->has_value());
        QCOMPARE(name(*m_store->applyOperator(key, OperatorAction::Delete, false, {})), name(OperatorVerdict::Missing));
        QCOMPARE(m_store->countKeys(ep)->total(), 0);
    }

    void importKeepsTheRecordWithThisStoresToken()
    {
        // `keys import`: a record from another store goes in whole (state, attempts, times,
        // request, result, error, history), its TTL and lease counted from this store's clock,
        // with a token of this store's counter, above the one it carries; a live key is left
        // alone.
        const QString ep = endpoint();
        const QString key = ep + u":imp"_qs;
        const qint64 tokenBefore = claim(request(ep, u"probe"_qs)).record.token;
        // Another store's token, below our counter.
        KeyRecord r = exported(ep, u"imp"_qs, "fp-imported", std::max<qint64>(1, tokenBefore / 2));
        r.provider = u"stripe"_qs;
        r.attempts = 3;
        r.updatedMs = 1'700'000'100'000;
        r.request = {
            "POST", "/hooks/x", {{"Stripe-Signature", "masked"}}, QByteArray("\x00\xff{}", 4)};
        r.history = {{r.createdMs, u"claimed"_qs, 7, {}},
                     {r.updatedMs, u"failed"_qs, 7, u"downstream said 500"_qs}};
        const qint64 before = storeNow();
        auto verdict = m_store->importRecord(r, 3'600'000, 0);
        QVERIFY2(verdict.ok(), verdict.ok() ? "" : qPrintable(verdict.error().message));
        QCOMPARE(name(*verdict), name(ImportVerdict::Imported));
        const KeyRecord k = **m_store->key(key);
        QCOMPARE(name(k.state), name(KeyState::Failed));
        QCOMPARE(k.provider, u"stripe"_qs);
        QCOMPARE(k.fingerprint, r.fingerprint);
        QCOMPARE(k.attempts, 3);
        QCOMPARE(k.createdMs, r.createdMs);
        QCOMPARE(k.updatedMs, r.updatedMs);
        QCOMPARE(k.request.body, r.request.body);
        QCOMPARE(k.request.headers, r.request.headers);
        QCOMPARE(k.result.status, 500);
        QCOMPARE(k.result.body, QByteArray("down"));
        QCOMPARE(k.error, r.error);
        QCOMPARE(k.history.size(), 2);
        QCOMPARE(k.history.last().detail, r.history.last().detail);
        QCOMPARE_GT(k.token, tokenBefore); // ours, still increasing
        QVERIFY(k.expiresAtMs >= before + 3'600'000 && k.expiresAtMs <= storeNow() + 3'600'000);
        QCOMPARE(k.leaseUntilMs, 0);
        // Listed and counted under its state and endpoint.
        KeyQuery q;
        q.endpoint = ep;
        q.state = KeyState::Failed;
        QCOMPARE(m_store->listKeys(q)->size(), 1);
        QCOMPARE(m_store->countKeys(ep)->failed, 1);
        // Imported again: left alone.
        KeyRecord other = r;
        other.error = u"changed"_qs;
        QCOMPARE(name(*m_store->importRecord(other, 3'600'000, 0)), name(ImportVerdict::Exists));
        QCOMPARE((*m_store->key(key))->error, r.error);
        // It behaves as a failed key: reset, then a delivery reprocesses it under a newer token.
        QCOMPARE(name(*m_store->applyOperator(key, OperatorAction::Reset, false, u"op"_qs)),
                 name(OperatorVerdict::Accept));
        ClaimRequest again = request(ep, u"imp"_qs, "fp-imported");
        const ClaimResult c = claim(again);
        QCOMPARE(name(c.decision.outcome), name(Outcome::Reprocessed));
        QVERIFY(c.record.token > k.token);
        // A processing key keeps a lease from now on; an expired record is replaced.
        KeyRecord processing = r;
        processing.key = ep + u":proc"_qs;
        processing.state = KeyState::Processing;
        QCOMPARE(name(*m_store->importRecord(processing, 1'000, 500)),
                 name(ImportVerdict::Imported));
        const KeyRecord p = **m_store->key(processing.key);
        QVERIFY(p.leaseUntilMs >= before + 500 && p.leaseUntilMs <= storeNow() + 500);
        QVERIFY(storeClockPasses(p.expiresAtMs));
        QCOMPARE(name(*m_store->importRecord(processing, 60'000, 0)),
                 name(ImportVerdict::Imported)); // expired: replaced
        QCOMPARE(m_store->countKeys(ep)->processing,
                 3); // the probe, the reclaimed key and the re-imported one
    }

    void importedTokenIsTheFloorOfTheKeysNextTokens()
    {
        // A key moved from another store: the app last saw its token there (Redis's are µs of
        // its clock, this one far ahead of any store's). Whatever this store's own counter or
        // clock, the imported record's token, and every later one of the key, is above it: an
        // app that refuses lower tokens takes the key's retry.
        const QString ep = endpoint();
        const QString key = ep + u":moved"_qs;
        const qint64 carried = 3'000'000'000'000'000;
        const KeyRecord r = exported(ep, u"moved"_qs, "fp-moved", carried);
        QCOMPARE(name(*m_store->importRecord(r, 3'600'000, 0)), name(ImportVerdict::Imported));
        const qint64 imported = (*m_store->key(key))->token;
        QCOMPARE_GT(imported, carried);
        // The sender's retry reprocesses it: above.
        const ClaimResult retry = claim(request(ep, u"moved"_qs, "fp-moved"));
        QCOMPARE(name(retry.decision.outcome), name(Outcome::Reprocessed));
        const qint64 retried = retry.record.token;
        QCOMPARE_GT(retried, std::max(imported, carried));
        QCOMPARE(name(finish(key, retried, KeyState::Failed, 502, "down")),
                 name(FinishVerdict::Accept));
        // Deleted, then claimed again: still above.
        QCOMPARE(name(*m_store->applyOperator(key, OperatorAction::Delete, false, {})),
                 name(OperatorVerdict::Accept));
        const ClaimResult again = claim(request(ep, u"moved"_qs, "fp-moved"));
        QCOMPARE(name(again.decision.action), name(ClaimAction::Create));
        QCOMPARE_GT(again.record.token, std::max(retried, carried));
        QCOMPARE(name(finish(key, again.record.token, KeyState::Completed)),
                 name(FinishVerdict::Accept));
        // Deleted and imported again from the same, older file: above the key's last token.
        QCOMPARE(name(*m_store->applyOperator(key, OperatorAction::Delete, false, {})),
                 name(OperatorVerdict::Accept));
        QCOMPARE(name(*m_store->importRecord(r, 3'600'000, 0)), name(ImportVerdict::Imported));
        QCOMPARE_GT((*m_store->key(key))->token, std::max(again.record.token, carried));
    }

    void exportIsOneSetWhileKeysMove()
    {
        // `keys export` while deliveries arrive: keys reset (they jump to the listing's top),
        // deleted after they were written (the rest move up), and new ones claimed. Every key
        // that lived through the export is written exactly once; a store whose log has no
        // per-key index is read once, not once per key.
        const QString ep = endpoint();
        QStringList all;
        for (int i = 0; i < 1100; ++i) {
            const ClaimResult c = claim(request(ep, u"k%1"_qs.arg(i, 4, 10, QChar(u'0'))));
            finish(c.record.key, c.record.token, KeyState::Failed, 500);
            all << c.record.key;
        }
        DeliveryEvent logged;
        logged.endpoint = ep;
        logged.key = all.at(7);
        logged.outcome = Outcome::Processed;
        logged.status = 500;
        for (int i = 0; i < 3; ++i) {
            logged.atMs = storeNow() + i;
            QVERIFY(m_store->appendDeliveries({logged}).ok());
        }
        Moving moving(m_store.get());
        QSet<QString> read, touched;
        int calls = 0, fresh = 0;
        QString previous;
        moving.onKey = [&](const QString &k) {
            ++calls;
            if (calls % 5 == 0) // an unread key gets a new state and the newest update
                for (const QString &other : std::as_const(all))
                    if (!read.contains(other) && other != k && !touched.contains(other)) {
                        touched.insert(other);
                        QCOMPARE(name(*m_store->applyOperator(other, OperatorAction::Reset, false,
                                                              u"meanwhile"_qs)),
                                 name(OperatorVerdict::Accept));
                        break;
                    }
            if (calls % 7 == 0 && !previous.isEmpty()) // a written key goes
                QVERIFY(m_store->applyOperator(previous, OperatorAction::Delete, true, {}).ok());
            if (calls % 10 == 0) // and new ones come
                claim(request(ep, u"new%1"_qs.arg(++fresh)));
            read.insert(k);
            previous = k;
        };
        KeyQuery filter;
        filter.endpoint = ep;
        QStringList written;
        QByteArray line7;
        auto report = exportKeys(moving, filter, {}, [&](const QByteArray &line) {
            const QJsonObject o = QJsonDocument::fromJson(line).object();
            written << o.value(u"record").toObject().value(u"key").toString();
            if (written.last() == all.at(7))
                line7 = line;
        });
        QVERIFY2(report.ok(), report.ok() ? "" : qPrintable(report.error().message));
        QCOMPARE(report->written, written.size());
        const QSet<QString> unique(written.cbegin(), written.cend());
        QCOMPARE(unique.size(), written.size()); // none twice
        for (const QString &k : std::as_const(all))
            QVERIFY2(unique.contains(k), qPrintable(k + u" was not exported"_qs));
        QVERIFY(touched.size() > 100);
        QCOMPARE(QJsonDocument::fromJson(line7).object().value(u"timeline").toArray().size(), 3);
        if (!m_store->deliveriesIndexedByKey())
            QCOMPARE(moving.deliveryReads, 1);
        // Named keys: each once, and one the store does not hold is reported.
        moving.onKey = {};
        report =
            exportKeys(moving, {}, {all.at(3), u"nope:x"_qs, all.at(3)}, [](const QByteArray &) {});
        QVERIFY(report.ok());
        QCOMPARE(report->written, 1);
        QCOMPARE(report->missing, QStringList{u"nope:x"_qs});
    }

    void importGoesOnPastAStoreErrorAndStopsWhenTheStoreIsGone()
    {
        // One line the store refuses is reported and the next ones still go in; a store that
        // no longer answers ends the run, saying how many went in.
        const QString ep = endpoint();
        KeyQuery filter;
        filter.endpoint = ep;
        QByteArray lines;
        for (int i = 0; i < 3; ++i) {
            ClaimRequest req = request(ep, u"t%1"_qs.arg(i), {});
            req.fingerprint = sha256Hex(req.request.body); // as the receiver makes it: importable
            const ClaimResult c = claim(req);
            finish(c.record.key, c.record.token, KeyState::Completed);
        }
        QVERIFY(exportKeys(*m_store, filter, {}, [&](const QByteArray &l) { lines += l + '\n'; }).ok());
        for (int i = 0; i < 3; ++i)
            QVERIFY(m_store->applyOperator(ep + u":t%1"_qs.arg(i), OperatorAction::Delete, true, {}).ok());
        Refusing refusing(m_store.get());
        refusing.refuse = ep + u":t1"_qs;
        QBuffer in(&lines);
        QVERIFY(in.open(QIODevice::ReadOnly));
        QStringList said;
        ImportReport report = importLines(refusing, in, Config::builtin(),
                                          [&](qint64 n, const Result<ImportedLine> &done) {
                                              said << u"%1 %2"_qs.arg(n).arg(
                                                  done ? done->key : done.error().message);
                                          });
        QVERIFY2(report.stopped.isEmpty(), qPrintable(report.stopped));
        QCOMPARE(report.imported, 2);
        QCOMPARE(report.refused, 1);
        QVERIFY2(said.contains(u"2 refused by the test"_qs), qPrintable(said.join(u" | "_qs)));
        QCOMPARE(m_store->countKeys(ep)->completed, 2);
        // The store gone: it stops at the first line.
        refusing.down = true;
        in.seek(0);
        report = importLines(refusing, in, Config::builtin(), [](qint64, const Result<ImportedLine> &) {});
        QVERIFY2(report.stopped.startsWith(u"line 1: refused by the test; stopped there (0 imported"_qs),
                 qPrintable(report.stopped));
    }

    void deliveryLog()
    {
        const QString ep = endpoint();
        const qint64 t0 = wallMs();
        QList<DeliveryEvent> events;
        for (int i = 0; i < 3; ++i) {
            DeliveryEvent e;
            e.atMs = t0 + i;
            e.endpoint = ep;
            e.key = ep + u":a"_qs;
            e.outcome = i == 0 ? Outcome::Processed : Outcome::Replayed;
            e.status = 200;
            e.latencyUs = 100 + i;
            e.token = 1;
            e.instance = u"test"_qs;
            events << e;
        }
        DeliveryEvent other = events.first();
        other.key = ep + u":b"_qs;
        other.outcome = Outcome::Mismatch;
        other.payload = QByteArray("{\"changed\":true}\0\xff", 18);
        events << other;
        QVERIFY(m_store->appendDeliveries(events).ok());
        DeliveryQuery q;
        q.key = ep + u":a"_qs;
        const auto found = *m_store->deliveries(q);
        QCOMPARE(found.size(), 3);
        QCOMPARE(found.first().atMs, t0 + 2); // newest first
        QCOMPARE(name(found.last().outcome), name(Outcome::Processed));
        QCOMPARE(found.last().latencyUs, 100);
        QCOMPARE(found.last().instance, u"test"_qs);
        DeliveryQuery byEndpoint;
        byEndpoint.endpoint = ep;
        byEndpoint.sinceMs = t0;
        const auto all = *m_store->deliveries(byEndpoint);
        QCOMPARE(all.size(), 4);
        const auto mismatch = std::find_if(all.begin(), all.end(), [](const DeliveryEvent &e) { return e.outcome == Outcome::Mismatch; });
        QVERIFY(mismatch != all.end());
        QCOMPARE(mismatch->payload, QByteArray("{\"changed\":true}\0\xff", 18));
    }

    // An entry may stand for many deliveries (a summary of rejected ones, DeliveryEvent::count):
    // the store keeps its count; an entry written without one counts as 1.
    void deliveryLogKeepsASummarysCount()
    {
        const QString ep = endpoint();
        const qint64 t0 = wallMs();
        DeliveryEvent single;
        single.atMs = t0;
        single.endpoint = ep;
        single.outcome = Outcome::Rejected;
        single.status = 401;
        single.detail = u"no valid signature"_qs;
        DeliveryEvent summary = single;
        summary.atMs = t0 + 1;
        summary.count = 4987;
        summary.detail = u"4987 rejected deliveries not logged one by one"_qs;
        QVERIFY(m_store->appendDeliveries({single, summary}).ok());
        DeliveryQuery q;
        q.endpoint = ep;
        const auto found = *m_store->deliveries(q);
        QCOMPARE(found.size(), 2);
        QCOMPARE(found.first().count, 4987); // newest first
        QCOMPARE(found.first().detail, summary.detail);
        QCOMPARE(found.last().count, 1);
    }

    // A count out of range (damage, or a hand-made entry) is read as one a reader can add up:
    // at least 1, at most kMaxDeliveryCount (sums of many never overflow).
    void deliveryCountsAreReadInRange()
    {
        const QString ep = endpoint();
        QList<DeliveryEvent> events;
        for (const qint64 count : {qint64(-5000), qint64(0), std::numeric_limits<qint64>::max()}) {
            DeliveryEvent e;
            e.atMs = wallMs() + events.size();
            e.endpoint = ep;
            e.outcome = Outcome::Rejected;
            e.status = 401;
            e.count = count;
            events.append(e);
        }
        QVERIFY(m_store->appendDeliveries(events).ok());
        DeliveryQuery q;
        q.endpoint = ep;
        const auto found = *m_store->deliveries(q);
        QCOMPARE(found.size(), 3);
        QCOMPARE(found.at(0).count, kMaxDeliveryCount); // newest first
        QCOMPARE(found.at(1).count, 1);
        QCOMPARE(found.at(2).count, 1);
    }

    // A store whose schema is from before the count (SQLite 3, PostgreSQL 2), with a log entry
    // written then: opened, it takes the schema step, and the old entry counts as 1.
    void logEntriesFromBeforeTheCountCountAsOne()
    {
        if (g_backend != u"sqlite"_qs && g_backend != u"postgres"_qs)
            QSKIP("Redis's stream has no schema: an entry without the field n counts as 1");
        const QString ep = endpoint();
        const QString insert =
            u"INSERT INTO idem_deliveries (at_ms, endpoint, key, outcome, status, latency_us, "
            u"token, instance, detail) VALUES (%1, '%2', '', 'rejected', 401, 0, 0, 'old', '');"_qs
                .arg(wallMs())
                .arg(ep);
        Result<std::unique_ptr<IdempotencyStore>> reopened = Error{};
        if (g_backend == u"sqlite"_qs) {
            const QString path = m_dir.filePath(u"before-count.db"_qs);
            QVERIFY(SqliteStore::open(path).ok());
            sqlite3 *db = nullptr;
            QCOMPARE(sqlite3_open(QFile::encodeName(path).constData(), &db), SQLITE_OK);
            // Back to step 3: what the later steps added goes too (step 6's ADD COLUMN, as
            // SQLite's, is not written to be run twice: the version decides).
            const QByteArray back = "ALTER TABLE idem_deliveries DROP COLUMN count;"
                                    " DROP INDEX idem_keys_type;"
                                    " ALTER TABLE idem_keys DROP COLUMN type;"
                                    " ALTER TABLE idem_deliveries DROP COLUMN type;"
                                    " PRAGMA user_version = 3; " +
                                    insert.toUtf8();
            const int rc = sqlite3_exec(db, back.constData(), nullptr, nullptr, nullptr);
            sqlite3_close(db);
            QCOMPARE(rc, SQLITE_OK);
            if (auto opened = SqliteStore::open(path); opened.ok())
                reopened = std::unique_ptr<IdempotencyStore>(std::move(*opened));
            else
                reopened = opened.error();
        } else {
            // The shared test database, put back one step: any store opened on it takes it again.
            const QString url = qEnvironmentVariable("IDEM_TEST_POSTGRES_URL");
            QCOMPARE(runTool(u"psql"_qs, {url, u"-v"_qs, u"ON_ERROR_STOP=1"_qs, u"-qc"_qs,
                                          u"BEGIN; ALTER TABLE idem_deliveries DROP COLUMN count;"
                                          u" DELETE FROM idem_schema WHERE version >= 3; "_qs +
                                              insert + u" COMMIT;"_qs}),
                     0);
            QVERIFY(!m_store->ready().ok()); // at version 2
            reopened = m_factory();
        }
        QVERIFY2(reopened.ok(), reopened.ok() ? "" : qPrintable(reopened.error().message));
        QVERIFY((*reopened)->ready().ok());
        DeliveryQuery q;
        q.endpoint = ep;
        const auto found = *(*reopened)->deliveries(q);
        QCOMPARE(found.size(), 1);
        QCOMPARE(found.first().count, 1);
        QVERIFY(m_store->ready().ok()); // the PostgreSQL schema taken again (SQLite: another file)
    }

    // A window read a page at a time, newest first: each page ends (untilMs, excluded) where
    // the one before stopped, so the pages together hold every delivery of the window once.
    void deliveryLogPagesBackwards()
    {
        const QString ep = endpoint();
        const qint64 t0 = wallMs() - 60'000;
        QList<DeliveryEvent> events;
        for (int i = 0; i < 6; ++i) {
            DeliveryEvent e;
            e.atMs = t0 + i / 2 * 10; // two a millisecond: t0, t0 + 10, t0 + 20
            e.endpoint = ep;
            e.key = ep + (i % 2 ? u":odd"_qs : u":even"_qs);
            e.outcome = Outcome::Processed;
            e.status = 200;
            e.token = i + 1;
            events << e;
        }
        QVERIFY(m_store->appendDeliveries(events).ok());
        DeliveryQuery q;
        q.endpoint = ep;
        q.sinceMs = t0;
        q.untilMs = t0 + 20; // the two at t0 + 20 are left out
        const auto page = *m_store->deliveries(q);
        QCOMPARE(page.size(), 4);
        QCOMPARE(page.first().atMs, t0 + 10);
        QCOMPARE(page.last().atMs, t0);
        q.untilMs = t0 + 10;
        q.limit = 1;
        const auto older = *m_store->deliveries(q);
        QCOMPARE(older.size(), 1);
        QCOMPARE(older.first().atMs, t0);
        q.untilMs = t0; // before the first: nothing
        QCOMPARE(m_store->deliveries(q)->size(), 0);
        // One key's, through its own index.
        DeliveryQuery ofKey;
        ofKey.key = ep + u":odd"_qs;
        ofKey.untilMs = t0 + 11;
        const auto odd = *m_store->deliveries(ofKey);
        QCOMPARE(odd.size(), 2);
        QCOMPARE(odd.first().token, 4); // t0 + 10
        QCOMPARE(odd.last().token, 2);  // t0
    }

    // Fencing tokens come from one counter per store: a key deleted and claimed again gets a
    // higher token, and the old worker's late finish is refused.
    void tokensAreNeverReusedAfterDelete()
    {
        const QString ep = endpoint();
        const QString key = ep + u":a"_qs;
        // A worker whose lease ran out (a key in processing is deleted only then: Leased).
        const ClaimResult first = claim(request(ep, u"a"_qs, "f1", 200));
        QVERIFY(storeClockPasses(first.record.leaseUntilMs));
        QCOMPARE(name(*m_store->applyOperator(key, OperatorAction::Delete, false, {})), name(OperatorVerdict::Accept));
        const ClaimResult second = claim(request(ep, u"a"_qs));
        QCOMPARE(name(second.decision.action), name(ClaimAction::Create));
        QVERIFY2(second.record.token > first.record.token,
                 qPrintable(u"token %1 after %2"_qs.arg(second.record.token).arg(first.record.token)));
        QCOMPARE(name(finish(key, first.record.token, KeyState::Completed, 200, "stale")), name(FinishVerdict::StaleToken));
        QCOMPARE(name((*m_store->key(key))->state), name(KeyState::Processing));
        QCOMPARE(name(finish(key, second.record.token, KeyState::Completed, 200, "new")), name(FinishVerdict::Accept));
        QCOMPARE((*m_store->key(key))->result.body, QByteArray("new"));
    }

    void tokensAreNeverReusedAfterExpiryAndPurge()
    {
        const QString ep = endpoint();
        const QString key = ep + u":a"_qs;
        const ClaimResult first = claim(request(ep, u"a"_qs, "f1", 200, 300));
        QVERIFY(storeClockPasses(first.record.expiresAtMs));
        QVERIFY(m_store->purgeExpired().ok());
        const ClaimResult second = claim(request(ep, u"a"_qs));
        QCOMPARE(name(second.decision.action), name(ClaimAction::Create));
        QVERIFY2(second.record.token > first.record.token,
                 qPrintable(u"token %1 after %2"_qs.arg(second.record.token).arg(first.record.token)));
        QCOMPARE(name(finish(key, first.record.token, KeyState::Completed, 200, "stale")), name(FinishVerdict::StaleToken));
        QCOMPARE(name(finish(key, second.record.token, KeyState::Completed, 200, "new")), name(FinishVerdict::Accept));
    }

    // A finish sent again after its answer was lost (timeout, dropped connection) is not refused.
    void repeatedFinishIsRecognised()
    {
        const QString ep = endpoint();
        const QString key = ep + u":a"_qs;
        const ClaimResult c = claim(request(ep, u"a"_qs));
        QCOMPARE(name(finish(key, c.record.token, KeyState::Completed, 200, "ok")), name(FinishVerdict::Accept));
        QCOMPARE(name(finish(key, c.record.token, KeyState::Completed, 200, "ok")), name(FinishVerdict::Repeated));
        QCOMPARE(name(finish(key, c.record.token, KeyState::Completed, 200, "other")), name(FinishVerdict::NotProcessing));
        QCOMPARE(name(finish(key, c.record.token, KeyState::Failed, 200, "ok")), name(FinishVerdict::NotProcessing));
        QCOMPARE(name(finish(key, c.record.token + 1, KeyState::Completed, 200, "ok")), name(FinishVerdict::StaleToken));
        const KeyRecord k = **m_store->key(key);
        QCOMPARE(k.history.size(), 2); // claimed, completed: the repeat wrote nothing
    }

    // A claim granted too late to start releases itself: finished as reset by its token (the
    // engine's ProcessResult::started), listed and counted as reset, and the next claim —
    // whatever on_failed says — reprocesses it under a higher token.
    void aClaimReleasedAsResetIsReprocessed()
    {
        const QString ep = endpoint();
        const QString key = ep + u":a"_qs;
        const ClaimResult c = claim(request(ep, u"a"_qs));
        QCOMPARE(name(finish(key, c.record.token + 1, KeyState::Reset, 0, "")),
                 name(FinishVerdict::StaleToken));
        QCOMPARE(name(finish(key, c.record.token, KeyState::Reset, 0, "")),
                 name(FinishVerdict::Accept));
        QCOMPARE(name(finish(key, c.record.token, KeyState::Reset, 0, "")),
                 name(FinishVerdict::Repeated));
        QCOMPARE(name((*m_store->key(key))->state), name(KeyState::Reset));
        QCOMPARE(m_store->countKeys(ep)->reset, 1);
        KeyQuery q;
        q.endpoint = ep;
        q.state = KeyState::Reset;
        QCOMPARE(m_store->listKeys(q)->size(), 1);
        ClaimRequest reject = request(ep, u"a"_qs);
        reject.policy.onFailed = OnFailed::Reject;
        const ClaimResult again = claim(reject);
        QCOMPARE(name(again.decision.outcome), name(Outcome::Reprocessed));
        QVERIFY(again.record.token > c.record.token);
        QCOMPARE(name(finish(key, again.record.token, KeyState::Completed)),
                 name(FinishVerdict::Accept));
        QCOMPARE(m_store->countKeys(ep)->reset, 0);
    }

    // A key that expired and is claimed again is listed and counted once, in its new state.
    void reclaimedAfterExpiryIsCountedOnce()
    {
        const QString ep = endpoint();
        const QString key = ep + u":a"_qs;
        const ClaimResult c = claim(request(ep, u"a"_qs, "f1", 200, 300));
        QCOMPARE(name(finish(key, c.record.token, KeyState::Completed)), name(FinishVerdict::Accept));
        QVERIFY(storeClockPasses(c.record.expiresAtMs));
        QTRY_VERIFY_WITH_TIMEOUT(!m_store->key(key)->has_value(), 5000);
        QCOMPARE(name(claim(request(ep, u"a"_qs)).decision.action), name(ClaimAction::Create));
        const StateCounts counts = *m_store->countKeys(ep);
        QCOMPARE(counts.processing, 1);
        QCOMPARE(counts.completed, 0);
        KeyQuery q;
        q.endpoint = ep;
        q.state = KeyState::Completed;
        QCOMPARE(m_store->listKeys(q)->size(), 0);
        q.state = KeyState::Processing;
        QCOMPARE(m_store->listKeys(q)->size(), 1);
    }

    // A batch is claimed and finished in one step; answers in the order asked.
    void batchClaimAndFinish()
    {
        const QString ep = endpoint();
        const ClaimResult busy = claim(request(ep, u"busy"_qs));
        auto claimed = m_store->claimBatch({request(ep, u"a"_qs), request(ep, u"busy"_qs), request(ep, u"b"_qs)});
        QVERIFY2(claimed.ok(), claimed.ok() ? "" : qPrintable(claimed.error().message));
        QCOMPARE(claimed->size(), 3);
        QCOMPARE(name(claimed->at(0).decision.action), name(ClaimAction::Create));
        QCOMPARE(name(claimed->at(1).decision.action), name(ClaimAction::InProgress));
        QCOMPARE(name(claimed->at(2).decision.action), name(ClaimAction::Create));
        QVERIFY(claimed->at(0).record.token != claimed->at(2).record.token);
        QList<FinishRequest> finishes;
        for (const auto &[k, token] : QList<QPair<QString, qint64>>{{u"a"_qs, claimed->at(0).record.token},
                                                                    {u"busy"_qs, busy.record.token + 1000},
                                                                    {u"b"_qs, claimed->at(2).record.token}}) {
            FinishRequest f;
            f.key = ep + u":"_qs + k;
            f.token = token;
            f.state = KeyState::Completed;
            f.result = {200, {}, "done"};
            finishes << f;
        }
        auto verdicts = m_store->finishBatch(finishes);
        QVERIFY2(verdicts.ok(), verdicts.ok() ? "" : qPrintable(verdicts.error().message));
        QCOMPARE(name(verdicts->at(0)), name(FinishVerdict::Accept));
        QCOMPARE(name(verdicts->at(1)), name(FinishVerdict::StaleToken));
        QCOMPARE(name(verdicts->at(2)), name(FinishVerdict::Accept));
        QCOMPARE(name((*m_store->key(ep + u":b"_qs))->state), name(KeyState::Completed));
        QCOMPARE(name((*m_store->key(ep + u":busy"_qs))->state), name(KeyState::Processing));
        QCOMPARE(name(m_store->finishBatch(finishes)->at(0)), name(FinishVerdict::Repeated));
    }

    // A batch's request headers are kept once for all its records (StoredRequest::headersRef),
    // and every read of a record has them again; a single claim keeps its own. Their name is
    // their hash: a second batch under the same headers writes nothing new, and the first
    // batch's records still read them.
    void sharedHeadersAreReadWithEveryRecordOfTheBatch()
    {
        const QString ep = endpoint();
        const HeaderList headers{{"Content-Type", "application/json"},
                                 {"X-Padding", QByteArray(4000, 'p')},
                                 {"X-Run", ep.toUtf8()}};
        const QByteArray ref = sharedRef(headersJson(headers));
        auto shared = [&](const QString &k) {
            ClaimRequest r = request(ep, k);
            r.request.headers = headers;
            r.request.headersRef = ref;
            return r;
        };
        auto claimed = m_store->claimBatch({shared(u"a"_qs), shared(u"b"_qs), shared(u"c"_qs)});
        QVERIFY2(claimed.ok(), claimed.ok() ? "" : qPrintable(claimed.error().message));
        QVERIFY(claimed->at(0).claimed() && claimed->at(2).claimed());
        auto again = m_store->claimBatch({shared(u"d"_qs), shared(u"a"_qs)});
        QVERIFY2(again.ok(), again.ok() ? "" : qPrintable(again.error().message));
        QCOMPARE(name(again->at(1).decision.action), name(ClaimAction::InProgress));
        for (const QString &k : {u"a"_qs, u"b"_qs, u"c"_qs, u"d"_qs}) {
            auto stored = m_store->key(ep + u":"_qs + k);
            QVERIFY2(stored.ok() && stored->has_value(), qPrintable(k));
            QCOMPARE((*stored)->request.headers, headers);
            QVERIFY((*stored)->request.headersRef.isEmpty());
            QCOMPARE((*stored)->request.body, QByteArray("{\"a\":1}"));
        }
        // A single claim (an operator's retry of such a record) keeps the headers in its record.
        ClaimRequest alone = shared(u"e"_qs);
        alone.request.headers.append({QByteArray("X-Alone"), QByteArray("1")});
        QVERIFY(claim(alone).claimed());
        QCOMPARE((*m_store->key(ep + u":e"_qs))->request.headers, alone.request.headers);
    }

    // A batch's one answer is kept once for all its records (StoredResult::ref): every read of
    // a record has it whole, a finish sent again is Repeated, and a failure replayed by a later
    // batch comes back with its body.
    void aSharedResultIsReadWithEveryRecordOfTheBatch()
    {
        const QString ep = endpoint();
        QList<FinishRequest> finishes;
        const StoredResult answer{500, {{"Content-Type", "text/plain"}, {"X-Run", ep.toUtf8()}},
                                  QByteArray("failed\n\0binary\xff", 15)};
        for (const QString &k : {u"a"_qs, u"b"_qs}) {
            const ClaimResult c = claim(request(ep, k));
            FinishRequest f;
            f.key = c.record.key;
            f.token = c.record.token;
            f.state = KeyState::Failed;
            f.result = answer;
            f.result.ref = sharedRef(sharedResultContent(answer));
            f.error = u"the downstream answered 500"_qs;
            f.ttlMs = 3'600'000;
            finishes << f;
        }
        auto verdicts = m_store->finishBatch(finishes);
        QVERIFY2(verdicts.ok(), verdicts.ok() ? "" : qPrintable(verdicts.error().message));
        QCOMPARE(name(verdicts->at(1)), name(FinishVerdict::Accept));
        for (const QString &k : {u"a"_qs, u"b"_qs}) {
            const KeyRecord r = **m_store->key(ep + u":"_qs + k);
            QCOMPARE(r.result.status, 500);
            QCOMPARE(r.result.headers, answer.headers);
            QCOMPARE(r.result.body, answer.body);
            QVERIFY(r.result.ref.isEmpty());
        }
        QCOMPARE(name(m_store->finishBatch(finishes)->at(0)), name(FinishVerdict::Repeated));
        ClaimRequest replay = request(ep, u"a"_qs);
        replay.policy.onFailed = OnFailed::Reject;
        auto replayed = m_store->claimBatch({replay});
        QVERIFY2(replayed.ok(), replayed.ok() ? "" : qPrintable(replayed.error().message));
        QCOMPARE(name(replayed->at(0).decision.action), name(ClaimAction::Replay));
        QCOMPARE(replayed->at(0).record.result.body, answer.body);
    }

    // A record whose shared content is gone from the store reads with the ref it names left
    // unresolved, says what it lost, and is not exported as if it were whole: the export
    // names it and writes the records that are whole.
    void aRecordWhoseSharedContentIsGoneIsNotExportedAsWhole()
    {
        const QString ep = endpoint();
        const HeaderList headers{{"Content-Type", "application/json"}, {"X-Run", ep.toUtf8()}};
        const QByteArray headersRef = sharedRef(headersJson(headers));
        QList<ClaimRequest> batch;
        for (const QString &k : {u"a"_qs, u"b"_qs}) {
            ClaimRequest r = request(ep, k);
            r.request.headers = headers;
            r.request.headersRef = headersRef;
            batch << r;
        }
        auto claimed = m_store->claimBatch(batch);
        QVERIFY2(claimed.ok(), claimed.ok() ? "" : qPrintable(claimed.error().message));
        const StoredResult answer{200, {{"X-Run", ep.toUtf8()}}, "ok"};
        FinishRequest f;
        f.key = ep + u":a"_qs;
        f.token = claimed->at(0).record.token;
        f.state = KeyState::Completed;
        f.result = answer;
        f.result.ref = sharedRef(sharedResultContent(answer));
        f.ttlMs = 3'600'000;
        QCOMPARE(name(m_store->finishBatch({f})->at(0)), name(FinishVerdict::Accept));
        QVERIFY(claim(request(ep, u"whole"_qs)).claimed());
        QVERIFY(dropShared(headersRef));
        QVERIFY(dropShared(f.result.ref));

        auto fresh = m_factory(); // reads nothing remembered from the batch
        QVERIFY2(fresh.ok(), fresh.ok() ? "" : qPrintable(fresh.error().message));
        const KeyRecord a = **(*fresh)->key(ep + u":a"_qs);
        QCOMPARE(lostSharedContent(a), u"its request headers and its result"_qs);
        QCOMPARE(lostSharedContent(**(*fresh)->key(ep + u":b"_qs)), u"its request headers"_qs);
        QCOMPARE(lostSharedContent(**(*fresh)->key(ep + u":whole"_qs)), QString());

        KeyQuery filter;
        filter.endpoint = ep;
        QStringList written;
        auto report = exportKeys(**fresh, filter, {}, [&](const QByteArray &line) {
            written << QJsonDocument::fromJson(line)[u"record"_qs][u"key"_qs].toString();
        });
        QVERIFY2(report.ok(), report.ok() ? "" : qPrintable(report.error().message));
        QCOMPARE(written, QStringList{ep + u":whole"_qs});
        QCOMPARE(report->written, 1);
        QStringList incomplete = report->incomplete;
        incomplete.sort();
        QCOMPARE(incomplete, (QStringList{ep + u":a: its request headers and its result"_qs,
                                          ep + u":b: its request headers"_qs}));
    }

    // Many connections racing for keys whose lease ran out, and for failed keys: each is taken
    // over exactly once (recovered, reprocessed), never twice.
    void concurrentReclaimsAreExclusive()
    {
        const QString ep = endpoint();
        constexpr int kThreads = 8;
        constexpr int kKeys = 60; // even: leased, odd: failed
        qint64 lastLease = 0;
        for (int k = 0; k < kKeys; ++k) {
            const ClaimResult c = claim(request(ep, QString::number(k), "f1", 300));
            lastLease = std::max(lastLease, c.record.leaseUntilMs);
            if (k % 2)
                QCOMPARE(name(finish(ep + u":"_qs + QString::number(k), c.record.token, KeyState::Failed)),
                         name(FinishVerdict::Accept));
        }
        QVERIFY(storeClockPasses(lastLease));
        std::vector<std::atomic<int>> recovered(kKeys), reprocessed(kKeys);
        std::atomic<int> errors{0};
        std::vector<std::thread> threads;
        for (int t = 0; t < kThreads; ++t) {
            threads.emplace_back([&, t] {
                auto store = m_factory();
                if (!store) {
                    ++errors;
                    return;
                }
                for (int i = 0; i < kKeys; ++i) {
                    const int k = (i * 7 + t * 13) % kKeys;
                    auto r = (*store)->claim(request(ep, QString::number(k)));
                    if (!r)
                        ++errors;
                    else if (r->claimed())
                        ++(r->decision.outcome == Outcome::Recovered ? recovered : reprocessed)[k];
                }
            });
        }
        for (auto &t : threads)
            t.join();
        QCOMPARE(errors.load(), 0);
        for (int k = 0; k < kKeys; ++k) {
            QCOMPARE(recovered[k].load(), k % 2 ? 0 : 1);
            QCOMPARE(reprocessed[k].load(), k % 2 ? 1 : 0);
        }
    }

    // Many connections racing for the same keys: each key is claimed exactly once.
    void concurrentClaimsAreExclusive()
    {
        const QString ep = endpoint();
        constexpr int kThreads = 8;
        constexpr int kKeys = 100;
        std::vector<std::atomic<int>> claims(kKeys);
        std::atomic<int> errors{0};
        std::vector<std::thread> threads;
        for (int t = 0; t < kThreads; ++t) {
            threads.emplace_back([&, t] {
                auto store = m_factory();
                if (!store) {
                    ++errors;
                    return;
                }
                for (int i = 0; i < kKeys; ++i) {
                    const int k = (i * 7 + t * 13) % kKeys; // every thread in its own order
                    auto r = (*store)->claim(request(ep, QString::number(k)));
                    if (!r)
                        ++errors;
                    else if (r->claimed())
                        ++claims[k];
                }
            });
        }
        for (auto &t : threads)
            t.join();
        QCOMPARE(errors.load(), 0);
        for (int k = 0; k < kKeys; ++k)
            QCOMPARE(claims[k].load(), 1);
        QCOMPARE((*m_store->key(ep + u":0"_qs))->attempts, kThreads);
    }

    // A store that answers but refuses writes (a full disk, a read-only or out-of-memory server):
    // a duplicate whose answer needs no write still gets it — the stored result, in progress, a
    // mismatch — with its count left as it was and the refusal said (ClaimResult::uncounted);
    // a claim that would take a key is refused. Alone and in a batch.
    void duplicatesAreAnsweredWhileWritesAreRefused()
    {
        if (g_backend == u"cluster"_qs)
            QSKIP("a setting of every node; the scripts are the single Redis's (contract_redis)");
        const QString ep = endpoint();
        const ClaimResult done = claim(request(ep, u"done"_qs));
        QCOMPARE(
            name(finish(done.record.key, done.record.token, KeyState::Completed, 201, "stored")),
            name(FinishVerdict::Accept));
        QVERIFY(claim(request(ep, u"running"_qs)).claimed());
        const ClaimResult lapsed = claim(request(ep, u"lapsed"_qs, "f1", 100));
        QVERIFY(storeClockPasses(lapsed.record.leaseUntilMs));
        const std::function<void()> allowWrites = refuseWrites(ep);
        QVERIFY(allowWrites);
        auto allowOnFailure = qScopeGuard(allowWrites); // a failed QVERIFY returns early

        const auto replay = m_store->claim(request(ep, u"done"_qs));
        QVERIFY2(replay.ok(), replay.ok() ? "" : qPrintable(replay.error().message));
        QCOMPARE(name(replay->decision.action), name(ClaimAction::Replay));
        QCOMPARE(replay->record.result.status, 201);
        QCOMPARE(replay->record.result.body, QByteArray("stored"));
        QCOMPARE(replay->record.attempts, 1);
        QVERIFY(!replay->uncounted.isEmpty());
        const auto running = m_store->claim(request(ep, u"running"_qs));
        QVERIFY2(running.ok(), running.ok() ? "" : qPrintable(running.error().message));
        QCOMPARE(name(running->decision.action), name(ClaimAction::InProgress));
        QVERIFY(!running->uncounted.isEmpty());
        const auto mismatch = m_store->claim(request(ep, u"done"_qs, "f2"));
        QVERIFY2(mismatch.ok(), mismatch.ok() ? "" : qPrintable(mismatch.error().message));
        QCOMPARE(name(mismatch->decision.action), name(ClaimAction::Mismatch));
        QVERIFY(!m_store->claim(request(ep, u"new"_qs)).ok());
        // Taking a key whose lease ended is a write too (on Redis it went through: taken and
        // run, its finish refused, once a lease).
        QVERIFY(!m_store->claim(request(ep, u"lapsed"_qs, "f1", 100)).ok());
        const auto both =
            m_store->claimBatch({request(ep, u"done"_qs), request(ep, u"running"_qs)});
        QVERIFY2(both.ok(), both.ok() ? "" : qPrintable(both.error().message));
        QCOMPARE(name(both->at(0).decision.action), name(ClaimAction::Replay));
        QCOMPARE(name(both->at(1).decision.action), name(ClaimAction::InProgress));
        QVERIFY(!m_store->claimBatch({request(ep, u"done"_qs), request(ep, u"new"_qs)}).ok());

        allowOnFailure.dismiss();
        allowWrites();
        QVERIFY(!(*m_store->key(ep + u":new"_qs)).has_value());
        const ClaimResult counted = claim(request(ep, u"done"_qs));
        QCOMPARE(counted.record.attempts, 2);
        QVERIFY(counted.uncounted.isEmpty());
        QVERIFY(claim(request(ep, u"new"_qs)).claimed());
    }

    // SQLite rolls a whole transaction back by itself on some errors (SQLITE_FULL, IOERR): the
    // rest of a group commit must then fail, not commit call by call.
    // The file holds request bodies: its owner alone may read it (and its -wal and -shm).
    void sqliteFilesAreTheOwnersOnly()
    {
        if (g_backend != u"sqlite"_qs)
            QSKIP("a file of SQLite's");
        const QString path = m_dir.filePath(u"private.db"_qs);
        auto opened = SqliteStore::open(path);
        QVERIFY(opened.ok());
        QVERIFY((*opened)->claim(request(endpoint(), u"a"_qs)).ok());
        for (const QString &suffix : {QString(), u"-wal"_qs, u"-shm"_qs}) {
            const QFileInfo file(path + suffix);
            QVERIFY2(file.exists(), qPrintable(file.filePath()));
            QCOMPARE(file.permissions() & (QFileDevice::ReadGroup | QFileDevice::WriteGroup | QFileDevice::ReadOther
                                           | QFileDevice::WriteOther),
                     QFileDevice::Permissions());
        }
    }

    void sqliteRollbackFailsTheRestOfTheBatch()
    {
        if (g_backend != u"sqlite"_qs)
            QSKIP("SQLite's own rollback of a transaction");
        auto opened = SqliteStore::open(m_dir.filePath(u"rollback.db"_qs));
        QVERIFY(opened.ok());
        SqliteStore &store = **opened;
        const QString ep = endpoint();
        QVERIFY(store.beginBatch());
        QVERIFY(store.claim(request(ep, u"a"_qs)).ok());
        sqlite3_exec(store.handle(), "ROLLBACK", nullptr, nullptr, nullptr); // as SQLite does on SQLITE_FULL
        auto later = store.claim(request(ep, u"b"_qs));
        QVERIFY(!later.ok());
        QVERIFY2(later.error().message.contains(u"rolled back"_qs), qPrintable(later.error().message));
        QVERIFY(!store.endBatch().ok());
        QVERIFY(!(*store.key(ep + u":a"_qs)).has_value());
        QVERIFY(!(*store.key(ep + u":b"_qs)).has_value());
        // The connection works again afterwards.
        QVERIFY(store.claim(request(ep, u"c"_qs)).ok());
    }

    void groupCommit()
    {
        if (!m_store->batches()) {
            QVERIFY(!m_store->beginBatch()); // every call commits on its own
            QSKIP("this store commits each call on its own");
        }
        // One transaction: another connection sees nothing of the batch before its commit.
        const QString ep = endpoint();
        auto other = m_factory();
        QVERIFY(other.ok());
        QVERIFY(m_store->beginBatch());
        QVERIFY(claim(request(ep, u"a"_qs)).claimed());
        QVERIFY(claim(request(ep, u"b"_qs)).claimed());
        QCOMPARE(name(claim(request(ep, u"a"_qs)).decision.action), name(ClaimAction::InProgress));
        QVERIFY(!(*(*other)->key(ep + u":a"_qs)).has_value());
        QVERIFY(m_store->endBatch().ok());
        QCOMPARE((*(*other)->key(ep + u":a"_qs))->attempts, 2);
        QVERIFY((*(*other)->key(ep + u":b"_qs)).has_value());

        // Through the pool: what waits is run in batches, and each caller hears back only
        // after its batch's commit — after a failed commit, each call runs again on its own.
        std::atomic<int> batches{0};
        std::atomic<bool> failCommits{false};
        StoreFactory probed = [&]() -> Result<std::unique_ptr<IdempotencyStore>> {
            auto store = m_factory();
            if (!store)
                return store.error();
            return std::unique_ptr<IdempotencyStore>(
                std::make_unique<CommitProbe>(std::move(store.value()), &batches, &failCommits));
        };
        for (bool failing : {false, true}) {
            failCommits = failing;
            const QString pep = endpoint();
            StorePool pool(probed, 1);
            auto connected = pool.run<Ok>([](IdempotencyStore &s) -> Result<Ok> {
                if (auto p = s.ping(); !p)
                    return p.error();
                return Ok{};
            });
            QVERIFY(connected.ok());
            QObject context;
            int answered = 0, claimed = 0, errors = 0;
            const int before = batches;
            for (int i = 0; i < 400; ++i) {
                const ClaimRequest r = request(pep, QString::number(i % 200));
                pool.submit<ClaimResult>(
                    &context, [r](IdempotencyStore &s) { return s.claim(r); },
                    [&](Result<ClaimResult> result) {
                        ++answered;
                        claimed += result.ok() && result->claimed();
                        errors += !result.ok();
                    },
                    StorePool::Batch::Grouped);
            }
            QTRY_COMPARE_WITH_TIMEOUT(answered, 400, 30'000);
            QVERIFY2(batches - before > 0 && batches - before < 400, qPrintable(QString::number(batches - before)));
            // Each key claimed once, and no error: when a batch's commit failed, none of its
            // calls was answered from it (each key would have been claimed again), and each ran
            // again on its own (each would have failed).
            QCOMPARE(claimed, 200);
            QCOMPARE(errors, 0);
        }
    }
};

int main(int argc, char **argv)
{
    QCoreApplication app(argc, argv);
    QStringList args = app.arguments();
    g_backend = args.size() > 1 && !args.at(1).startsWith(u'-') ? args.takeAt(1) : u"sqlite"_qs;
    if (g_backend != u"sqlite"_qs && g_backend != u"redis"_qs && g_backend != u"cluster"_qs &&
        g_backend != u"postgres"_qs) {
        qCritical("unknown backend %s", qPrintable(g_backend));
        return 2;
    }
    TestStoreContract suite;
    return QTest::qExec(&suite, args);
}

#include "tst_store_contract.moc"
