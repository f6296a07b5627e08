// The receiver end to end: real HTTP in, a real store, a real counting downstream.
#include "receiver/receiver.h"
#include "store/storefactory.h"
#include "store/sqlitestore.h"
#include "support/downstream.h"
#include "http/blockingclient.h"
#include "support/names.h"
#include "util/clock.h"

#include <QJsonDocument>
#include <QJsonObject>
#include <QTemporaryDir>
#include <QTest>

#include <thread>

using namespace idem;
using namespace idem::test;

namespace {

struct Desk
{
    std::shared_ptr<StorePool> pool;
    std::unique_ptr<Receiver> receiver;
    quint16 port = 0;
};

} // namespace

class TestReceiver : public QObject
{
    Q_OBJECT
    QTemporaryDir m_dir;
    int m_seq = 0;

    Desk start(const QByteArray &endpointsJson, const QString &storeUrl = {})
    {
        auto config = Config::parse("{\"endpoints\": " + endpointsJson + "}", QStringLiteral("test"));
        if (!config)
            qFatal("config: %s", qPrintable(config.error().message));
        Desk desk;
        const QString url = storeUrl.isEmpty() ? u"sqlite:"_qs + m_dir.filePath(u"r%1.db"_qs.arg(++m_seq)) : storeUrl;
        auto pool = openStorePool(url);
        if (!pool)
            qFatal("store: %s", qPrintable(pool.error().message));
        desk.pool = *pool;
        desk.receiver = std::make_unique<Receiver>(*config, desk.pool);
        ListenAddress any;
        any.port = 0;
        desk.port = desk.receiver->start(any)->port;
        return desk;
    }
    static QByteArray forwardTo(const CountingDownstream &d, const QByteArray &extra = {})
    {
        return "[{\"name\": \"orders\", \"forward_to\": \"" + d.url().toString().toUtf8() + "\"" + extra + "}]";
    }
    static ClientResponse deliver(quint16 port, const QByteArray &key, const QByteArray &body = "{\"a\":1}",
                                  const QByteArray &endpoint = "orders")
    {
        HeaderList headers;
        if (!key.isEmpty())
            headers.append({"Idempotency-Key", key});
        return post(port, "/hooks/" + endpoint, body, headers);
    }
    static std::optional<KeyRecord> record(Desk &desk, const QString &key)
    {
        auto r = desk.pool->run<std::optional<KeyRecord>>([&](IdempotencyStore &s) { return s.key(key); });
        return r ? *r : std::nullopt;
    }

private Q_SLOTS:
    void firstDeliveryProcessedThenReplayed()
    {
        CountingDownstream down;
        Desk desk = start(forwardTo(down));
        const ClientResponse first = deliver(desk.port, "k1", "{\"a\":1}");
        QCOMPARE(first.status, 200);
        QCOMPARE(first.header("Idempotency-Outcome"), QByteArray("processed"));
        QCOMPARE(first.header("Idempotency-Key"), QByteArray("orders:k1"));
        QCOMPARE(first.header("X-Downstream"), QByteArray("counting"));
        QVERIFY(first.header("Idempotent-Replayed").isEmpty());
        const ClientResponse second = deliver(desk.port, "k1", "{\"a\":1}");
        QCOMPARE(second.status, 200);
        QCOMPARE(second.header("Idempotency-Outcome"), QByteArray("replayed"));
        QCOMPARE(second.header("Idempotent-Replayed"), QByteArray("true"));
        QCOMPARE(second.body, first.body);
        QCOMPARE(down.total(), 1);

        // The downstream got the original headers and body, plus the key.
        const HttpRequest forwarded = down.requests().first();
        QCOMPARE(forwarded.body, QByteArray("{\"a\":1}"));
        QCOMPARE(forwarded.header("Idempotency-Key"), QByteArray("orders:k1"));
        QCOMPARE(forwarded.header("Content-Type"), QByteArray("application/json"));
        const KeyRecord k = *record(desk, u"orders:k1"_qs);
        QCOMPARE(name(k.state), name(KeyState::Completed));
        QCOMPARE(k.attempts, 2);
        QCOMPARE(k.result.status, 200);
    }

    void stormOf64IdenticalDeliveriesForwardsOnce()
    {
        CountingDownstream down;
        down.setDelayMs(150); // the others arrive while the first is being processed
        Desk desk = start(forwardTo(down));
        for (int round = 0; round < 3; ++round) {
            const QByteArray key = "storm-" + QByteArray::number(round);
            std::vector<ClientResponse> answers(64);
            std::vector<std::thread> senders;
            for (int i = 0; i < 64; ++i)
                senders.emplace_back([&, i] { answers[i] = deliver(desk.port, key, "{\"order\":42}"); });
            for (auto &t : senders)
                t.join();
            int processed = 0;
            for (const ClientResponse &a : answers) {
                const QByteArray outcome = a.header("Idempotency-Outcome");
                if (outcome == "processed") {
                    ++processed;
                    QCOMPARE(a.status, 200);
                } else if (outcome == "in-progress") {
                    QCOMPARE(a.status, 409);
                    QVERIFY(a.header("Retry-After").toInt() >= 1);
                } else {
                    QCOMPARE(outcome, QByteArray("replayed"));
                    QCOMPARE(a.status, 200);
                }
            }
            QCOMPARE(processed, 1);
            QCOMPARE(down.count("orders:" + key), 1);
        }
        QCOMPARE(down.total(), 3);
    }

    void inProgressAnswersWithRetryAfterOrTheConfiguredStatus()
    {
        CountingDownstream down;
        down.setDelayMs(600);
        Desk desk = start("[{\"name\": \"orders\", \"forward_to\": \"" + down.url().toString().toUtf8()
                          + "\"}, {\"name\": \"accepting\", \"in_progress_status\": 202, \"forward_to\": \""
                          + down.url().toString().toUtf8() + "\"}]");
        for (const QByteArray &endpoint : {QByteArray("orders"), QByteArray("accepting")}) {
            std::thread first([&] { deliver(desk.port, "slow", "{}", endpoint); });
            QTRY_VERIFY(record(desk, QString::fromLatin1(endpoint) + u":slow"_qs).has_value());
            const ClientResponse dup = deliver(desk.port, "slow", "{}", endpoint);
            QCOMPARE(dup.status, endpoint == "orders" ? 409 : 202);
            QCOMPARE(dup.header("Idempotency-Outcome"), QByteArray("in-progress"));
            QCOMPARE(dup.header("Content-Type"), QByteArray("application/problem+json"));
            QVERIFY(dup.header("Retry-After").toInt() >= 1);
            first.join();
        }
    }

    void failedIsReprocessedOrReplayedByPolicy()
    {
        CountingDownstream down;
        down.setStatus(500);
        Desk desk = start("[{\"name\": \"orders\", \"forward_to\": \"" + down.url().toString().toUtf8()
                          + "\"}, {\"name\": \"strict\", \"on_failed\": \"reject\", \"forward_to\": \""
                          + down.url().toString().toUtf8() + "\"}]");
        const ClientResponse failed = deliver(desk.port, "f");
        QCOMPARE(failed.status, 500); // the downstream's answer
        QCOMPARE(failed.header("Idempotency-Outcome"), QByteArray("processed"));
        QCOMPARE(name(record(desk, u"orders:f"_qs)->state), name(KeyState::Failed));
        down.setStatus(200);
        const ClientResponse again = deliver(desk.port, "f");
        QCOMPARE(again.status, 200);
        QCOMPARE(again.header("Idempotency-Outcome"), QByteArray("reprocessed"));
        QCOMPARE(name(record(desk, u"orders:f"_qs)->state), name(KeyState::Completed));
        QCOMPARE(down.count("orders:f"), 2);

        down.setStatus(503);
        QCOMPARE(deliver(desk.port, "f", "{\"a\":1}", "strict").status, 503);
        down.setStatus(200);
        const ClientResponse replayedFailure = deliver(desk.port, "f", "{\"a\":1}", "strict");
        QCOMPARE(replayedFailure.status, 503);
        QCOMPARE(replayedFailure.header("Idempotency-Outcome"), QByteArray("replayed"));
        QCOMPARE(replayedFailure.header("Idempotent-Replayed"), QByteArray("true"));
        QCOMPARE(down.count("strict:f"), 1);
    }

    void mismatchIs422AndLeavesTheRecord()
    {
        CountingDownstream down;
        Desk desk = start(forwardTo(down));
        QCOMPARE(deliver(desk.port, "m", "{\"amount\":10}").status, 200);
        const ClientResponse other = deliver(desk.port, "m", "{\"amount\":99}");
        QCOMPARE(other.status, 422);
        QCOMPARE(other.header("Idempotency-Outcome"), QByteArray("mismatch"));
        QVERIFY(QJsonDocument::fromJson(other.body).object().value(u"detail").toString().contains(u"differs"));
        QCOMPARE(record(desk, u"orders:m"_qs)->request.body, QByteArray("{\"amount\":10}"));
        QCOMPARE(down.total(), 1);
    }

    void rejectionsStoreNothing()
    {
        CountingDownstream down;
        Desk desk = start(forwardTo(down, ", \"max_body_bytes\": 64"));
        const ClientResponse noKey = deliver(desk.port, {});
        QCOMPARE(noKey.status, 400);
        QCOMPARE(noKey.header("Idempotency-Outcome"), QByteArray("rejected"));
        QCOMPARE(noKey.header("Content-Type"), QByteArray("application/problem+json"));
        QCOMPARE(deliver(desk.port, "caf\xc3\xa9").status, 400);
        QCOMPARE(deliver(desk.port, "big", QByteArray(65, 'x')).status, 413);
        QCOMPARE(deliver(desk.port, "k", "{}", "nope").status, 404);
        RawConnection get(desk.port);
        get.send("GET /hooks/orders HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        const ClientResponse notPost = get.readResponse();
        QCOMPARE(notPost.status, 405);
        QCOMPARE(notPost.header("Allow"), QByteArray("POST"));
        QCOMPARE(down.total(), 0);
        auto counts = desk.pool->run<StateCounts>([](IdempotencyStore &s) { return s.countKeys({}); });
        QCOMPARE(counts->total(), 0);
        const EngineCounters c = desk.receiver->engine()->counters();
        QCOMPARE(c.byOutcome[size_t(Outcome::Rejected)], 5);
    }

    void keysFromHeaderPointerOrCompositeFields()
    {
        Desk desk = start("[{\"name\": \"p\", \"key\": {\"json_pointer\": \"/id\"}},"
                          " {\"name\": \"c\", \"key\": {\"composite\": [\"/type\", \"/data/order\"]}},"
                          " {\"name\": \"h\", \"key\": {\"header\": \"X-Event-Id\", \"json_pointer\": \"/id\"}},"
                          " {\"name\": \"open\", \"on_missing_key\": \"passthrough\"}]");
        ClientResponse r = deliver(desk.port, {}, "{\"id\":\"evt_1\"}", "p");
        QCOMPARE(r.header("Idempotency-Key"), QByteArray("p:evt_1"));
        QCOMPARE(deliver(desk.port, {}, "{\"id\":\"evt_1\"}", "p").header("Idempotency-Outcome"), QByteArray("replayed"));
        QCOMPARE(deliver(desk.port, {}, "not json", "p").status, 400);
        r = deliver(desk.port, {}, "{\"type\":\"paid\",\"data\":{\"order\":7}}", "c");
        QCOMPARE(r.status, 200);
        QCOMPARE(r.header("Idempotency-Key").size(), 2 + 64); // "c:" + SHA-256 hex
        const ClientResponse same = deliver(desk.port, {}, "{\"type\":\"paid\",\"data\":{\"order\":7}}", "c");
        QCOMPARE(same.header("Idempotency-Key"), r.header("Idempotency-Key"));
        QCOMPARE(same.header("Idempotency-Outcome"), QByteArray("replayed"));
        const ClientResponse otherOrder = deliver(desk.port, {}, "{\"type\":\"paid\",\"data\":{\"order\":8}}", "c");
        QVERIFY(otherOrder.header("Idempotency-Key") != r.header("Idempotency-Key"));
        ClientResponse h = post(desk.port, "/hooks/h", "{\"id\":\"fromBody\"}", {{"X-Event-Id", "fromHeader"}});
        QCOMPARE(h.header("Idempotency-Key"), QByteArray("h:fromHeader"));
        h = post(desk.port, "/hooks/h", "{\"id\":\"fromBody\"}");
        QCOMPARE(h.header("Idempotency-Key"), QByteArray("h:fromBody"));
        const ClientResponse pass = deliver(desk.port, {}, "{}", "open");
        QCOMPARE(pass.status, 200);
        QCOMPARE(pass.header("Idempotency-Outcome"), QByteArray("processed"));
        QVERIFY(pass.header("Idempotency-Key").isEmpty());
    }

    void leaseExpiryRecoversAndTheLateCompletionIsRefused()
    {
        CountingDownstream down;
        down.setDelayMs(2500); // longer than the 1 s lease
        Desk desk = start(forwardTo(down, ", \"lease_seconds\": 1"));
        ClientResponse firstAnswer;
        std::thread first([&] { firstAnswer = deliver(desk.port, "L"); });
        QTRY_VERIFY(record(desk, u"orders:L"_qs).has_value());
        const qint64 leaseEnd = record(desk, u"orders:L"_qs)->leaseUntilMs;
        QTRY_VERIFY_WITH_TIMEOUT(wallMs() > leaseEnd, 5000);
        down.setDelayMs(0);
        const ClientResponse second = deliver(desk.port, "L");
        QCOMPARE(second.header("Idempotency-Outcome"), QByteArray("recovered"));
        QCOMPARE(second.status, 200);
        first.join();
        // The first worker finished after its lease was taken over: its result is refused.
        QCOMPARE(firstAnswer.status, 409);
        QCOMPARE(firstAnswer.header("Idempotency-Outcome"), QByteArray("in-progress"));
        const KeyRecord k = *record(desk, u"orders:L"_qs);
        QCOMPARE(name(k.state), name(KeyState::Completed));
        QCOMPARE(k.token, 2);
        QCOMPARE(down.count("orders:L"), 2);
        QCOMPARE(deliver(desk.port, "L").header("Idempotency-Outcome"), QByteArray("replayed"));
    }

    void downstreamUnreachableOrSlowFails()
    {
        CountingDownstream down;
        down.setDelayMs(3000);
        quint16 deadPort;
        {
            CountingDownstream gone;
            deadPort = gone.port();
        }
        Desk desk = start("[{\"name\": \"dead\", \"forward_to\": \"http://127.0.0.1:" + QByteArray::number(deadPort)
                          + "/x\"}, {\"name\": \"slow\", \"forward_timeout_seconds\": 1, \"forward_to\": \""
                          + down.url().toString().toUtf8() + "\"}]");
        const ClientResponse dead = deliver(desk.port, "d", "{}", "dead");
        QCOMPARE(dead.status, 502);
        QCOMPARE(dead.header("Content-Type"), QByteArray("application/problem+json"));
        QCOMPARE(name(record(desk, u"dead:d"_qs)->state), name(KeyState::Failed));
        QVERIFY(record(desk, u"dead:d"_qs)->error.contains(u"unreachable"));
        const ClientResponse slow = deliver(desk.port, "s", "{}", "slow");
        QCOMPARE(slow.status, 504);
        QCOMPARE(name(record(desk, u"slow:s"_qs)->state), name(KeyState::Failed));
    }

    void storeUnavailableRefusesWith503AndNeverProcesses()
    {
        CountingDownstream down;
        auto config = Config::parse("{\"endpoints\": " + forwardTo(down) + "}", QStringLiteral("test"));
        // A store whose file cannot be opened: a real SQLite error on every call.
        QFile blocker(m_dir.filePath(u"not-a-dir"_qs));
        QVERIFY(blocker.open(QIODevice::WriteOnly));
        blocker.close();
        const QString path = m_dir.filePath(u"not-a-dir/store.db"_qs);
        auto pool = std::make_shared<StorePool>(storeFactory(*StoreUrl::parse(u"sqlite:"_qs + path)), 2);
        Receiver receiver(*config, pool);
        ListenAddress any;
        any.port = 0;
        const quint16 port = receiver.start(any)->port;
        const ClientResponse r = deliver(port, "x");
        QCOMPARE(r.status, 503);
        QCOMPARE(r.header("Idempotency-Outcome"), QByteArray("unavailable"));
        QCOMPARE(r.header("Retry-After"), QByteArray("5"));
        QCOMPARE(down.total(), 0);
        QVERIFY(!pool->health().healthy);
        QVERIFY(!pool->health().lastError.isEmpty());
    }

    void deliveriesAreLogged()
    {
        Desk desk = start("[{\"name\": \"orders\"}]");
        QCOMPARE(deliver(desk.port, "log").status, 200);
        QCOMPARE(deliver(desk.port, "log").status, 200);
        QCOMPARE(deliver(desk.port, {}).status, 400);
        DeliveryQuery q;
        q.endpoint = u"orders"_qs;
        QTRY_COMPARE_WITH_TIMEOUT(desk.pool->run<QList<DeliveryEvent>>([&](IdempotencyStore &s) { return s.deliveries(q); })->size(), 3, 5000);
        q.key = u"orders:log"_qs;
        const auto events = *desk.pool->run<QList<DeliveryEvent>>([&](IdempotencyStore &s) { return s.deliveries(q); });
        QCOMPARE(events.size(), 2);
        QCOMPARE(name(events.last().outcome), name(Outcome::Processed));
        QCOMPARE(name(events.first().outcome), name(Outcome::Replayed));
        QVERIFY(events.first().latencyUs > 0);
    }
};

QTEST_GUILESS_MAIN(TestReceiver)
#include "tst_receiver.moc"
