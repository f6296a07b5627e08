// The receiver end to end: real HTTP in, a real store, a real counting downstream. What goes
// through the store's own path (the Redis lane, the pool's workers) runs on every store: a fresh
// SQLite file, and the Redis and PostgreSQL servers of IDEM_TEST_REDIS_URL / IDEM_TEST_POSTGRES_URL.
#include "engine/stats.h"
#include "http/blockingclient.h"
#include "receiver/receiver.h"
#include "store/sqlitestore.h"
#include "store/storefactory.h"
#include "support/desk.h"
#include "support/downstream.h"
#include "support/faultproxy.h"
#include "support/names.h"
#include "util/clock.h"

#include <QElapsedTimer>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QRandomGenerator>
#include <QTemporaryDir>
#include <QTest>

#include <future>
#include <thread>

using namespace idem;
using namespace idem::test;

namespace {


// Stalls the thread `object` lives on, as a process paused by the OS or a debugger, until
// released (at the latest when this goes out of scope).
class Stall
{
public:
    explicit Stall(QObject *object)
    {
        auto released = m_release.get_future().share();
        QMetaObject::invokeMethod(object, [this, released] {
            m_stalled = true;
            released.wait();
        });
    }
    ~Stall() { release(); }
    bool stalled() const { return m_stalled.load(); }
    void release()
    {
        if (!m_released.exchange(true))
            m_release.set_value();
    }

private:
    std::promise<void> m_release;
    std::atomic<bool> m_stalled{false};
    std::atomic<bool> m_released{false};
};

// How often each SendGrid event (sg_event_id) reached the downstream, across every batch.
QHash<QString, int> forwardedEvents(const CountingDownstream &down)
{
    QHash<QString, int> n;
    for (const HttpRequest &r : down.requests())
        for (const QJsonValue &e : QJsonDocument::fromJson(r.body).array())
            n[e.toObject().value(u"sg_event_id").toString()] += 1;
    return n;
}

} // namespace

class TestReceiver : public QObject
{
    Q_OBJECT
    QTemporaryDir m_dir;
    int m_seq = 0;
    // Keys of this run: the Redis and PostgreSQL servers keep earlier runs' keys.
    const QByteArray m_run = QByteArray::number(QRandomGenerator::global()->bounded(1u << 30), 36);

    // One row per store.
    static void everyStore()
    {
        QTest::addColumn<QString>("store");
        QTest::newRow("sqlite") << u"sqlite"_qs;
        QTest::newRow("redis") << u"IDEM_TEST_REDIS_URL"_qs;
        QTest::newRow("postgres") << u"IDEM_TEST_POSTGRES_URL"_qs;
    }
    // The row's store URL: a fresh SQLite file, or the server ./dev test started (empty: not set).
    QString storeUrl(const QString &store)
    {
        if (store == u"sqlite"_qs)
            return u"sqlite:"_qs + m_dir.filePath(u"r%1.db"_qs.arg(++m_seq));
        return qEnvironmentVariable(store.toLatin1().constData());
    }

    Desk start(const QByteArray &endpointsJson, const QString &storeUrl = {})
    {
        return startDesk("{\"endpoints\": " + endpointsJson + "}",
                         storeUrl.isEmpty() ? u"sqlite:"_qs + m_dir.filePath(u"r%1.db"_qs.arg(++m_seq)) : storeUrl);
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
    static QString stateOf(Desk &desk, const QString &key)
    {
        const auto r = record(desk, key);
        return r ? name(r->state) : u"absent"_qs;
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
        Desk desk = start(forwardTo(down));
        for (int round = 0; round < 3; ++round) {
            const QByteArray key = "storm-" + QByteArray::number(round);
            // The first delivery to win the claim is held at the downstream until every other
            // copy has its answer: all 63 arrive while it is being processed.
            down.closeGate();
            std::vector<ClientResponse> answers(64);
            std::atomic<int> answered{0};
            std::vector<std::jthread> senders;
            for (int i = 0; i < 64; ++i)
                senders.emplace_back([&, i] {
                    answers[i] = deliver(desk.port, key, "{\"order\":42}");
                    ++answered;
                });
            QTRY_COMPARE_WITH_TIMEOUT(answered.load(), 63, 15000);
            QCOMPARE(down.held(), 1);
            down.openGate();
            for (auto &t : senders)
                t.join();
            int processed = 0, inProgress = 0;
            for (const ClientResponse &a : answers) {
                const QByteArray outcome = a.header("Idempotency-Outcome");
                if (outcome == "processed") {
                    ++processed;
                    QCOMPARE(a.status, 200);
                } else {
                    ++inProgress;
                    QCOMPARE(outcome, QByteArray("in-progress"));
                    QCOMPARE(a.status, 409);
                    QVERIFY(a.header("Retry-After").toInt() >= 1);
                }
            }
            QCOMPARE(processed, 1);
            QCOMPARE(inProgress, 63);
            QCOMPARE(down.count("orders:" + key), 1);
            QCOMPARE(deliver(desk.port, key, "{\"order\":42}").header("Idempotency-Outcome"), QByteArray("replayed"));
        }
        QCOMPARE(down.total(), 3);
    }

    void inProgressAnswersWithRetryAfterOrTheConfiguredStatus_data() { everyStore(); }
    void inProgressAnswersWithRetryAfterOrTheConfiguredStatus()
    {
        QFETCH(QString, store);
        const QString url = storeUrl(store);
        QVERIFY2(!url.isEmpty(), "IDEM_TEST_REDIS_URL / IDEM_TEST_POSTGRES_URL are not set: run through ./dev test");
        CountingDownstream down;
        Desk desk = start("[{\"name\": \"orders\", \"forward_to\": \"" + down.url().toString().toUtf8()
                          + "\"}, {\"name\": \"accepting\", \"in_progress_status\": 202, \"forward_to\": \""
                          + down.url().toString().toUtf8() + "\"}]", url);
        const QByteArray key = "slow-" + m_run;
        for (const QByteArray &endpoint : {QByteArray("orders"), QByteArray("accepting")}) {
            // The first delivery is held at the downstream until the duplicate has its answer.
            down.closeGate();
            ClientResponse firstAnswer;
            std::jthread first([&] { firstAnswer = deliver(desk.port, key, "{}", endpoint); });
            QTRY_COMPARE(down.count(endpoint + ":" + key), 1);
            const ClientResponse dup = deliver(desk.port, key, "{}", endpoint);
            QCOMPARE(dup.status, endpoint == "orders" ? 409 : 202);
            QCOMPARE(dup.header("Idempotency-Outcome"), QByteArray("in-progress"));
            QCOMPARE(dup.header("Content-Type"), QByteArray("application/problem+json"));
            QVERIFY(dup.header("Retry-After").toInt() >= 1);
            down.openGate();
            first.join();
            QCOMPARE(firstAnswer.status, 200);
            QCOMPARE(firstAnswer.header("Idempotency-Outcome"), QByteArray("processed"));
            QCOMPARE(deliver(desk.port, key, "{}", endpoint).header("Idempotency-Outcome"), QByteArray("replayed"));
            QCOMPARE(down.count(endpoint + ":" + key), 1);
        }
    }

    void failedIsReprocessedOrReplayedByPolicy_data() { everyStore(); }
    void failedIsReprocessedOrReplayedByPolicy()
    {
        QFETCH(QString, store);
        const QString url = storeUrl(store);
        QVERIFY2(!url.isEmpty(), "IDEM_TEST_REDIS_URL / IDEM_TEST_POSTGRES_URL are not set: run through ./dev test");
        CountingDownstream down;
        down.setStatus(500);
        Desk desk = start("[{\"name\": \"orders\", \"forward_to\": \"" + down.url().toString().toUtf8()
                          + "\"}, {\"name\": \"strict\", \"on_failed\": \"reject\", \"forward_to\": \""
                          + down.url().toString().toUtf8() + "\"}]", url);
        const QByteArray key = "f-" + m_run;
        const QString stored = u"orders:"_qs + QString::fromLatin1(key);
        const ClientResponse failed = deliver(desk.port, key);
        QCOMPARE(failed.status, 500); // the downstream's answer
        QCOMPARE(failed.header("Idempotency-Outcome"), QByteArray("processed"));
        QCOMPARE(stateOf(desk, stored), name(KeyState::Failed));
        down.setStatus(200);
        const ClientResponse again = deliver(desk.port, key);
        QCOMPARE(again.status, 200);
        QCOMPARE(again.header("Idempotency-Outcome"), QByteArray("reprocessed"));
        QCOMPARE(stateOf(desk, stored), name(KeyState::Completed));
        QCOMPARE(down.count("orders:" + key), 2);

        down.setStatus(503);
        QCOMPARE(deliver(desk.port, key, "{\"a\":1}", "strict").status, 503);
        down.setStatus(200);
        const ClientResponse replayedFailure = deliver(desk.port, key, "{\"a\":1}", "strict");
        QCOMPARE(replayedFailure.status, 503);
        QCOMPARE(replayedFailure.header("Idempotency-Outcome"), QByteArray("replayed"));
        QCOMPARE(replayedFailure.header("Idempotent-Replayed"), QByteArray("true"));
        QCOMPARE(stateOf(desk, u"strict:"_qs + QString::fromLatin1(key)), name(KeyState::Failed));
        QCOMPARE(down.count("strict:" + key), 1);
    }

    // A key force-failed by an operator has no answer stored: its duplicates (on_failed: reject)
    // get a 500 that says so. It replayed "HTTP/1.1 0 OK" before, which no client can read. A
    // stuck key is force-failed (its run's outcome unknown, its lease over); while the lease is
    // live the operator is refused: a run may be going.
    void aForceFailedKeyReplaysAnErrorNotStatusZero_data() { everyStore(); }
    void aForceFailedKeyReplaysAnErrorNotStatusZero()
    {
        QFETCH(QString, store);
        const QString url = storeUrl(store);
        QVERIFY2(
            !url.isEmpty(),
            "IDEM_TEST_REDIS_URL / IDEM_TEST_POSTGRES_URL are not set: run through ./dev test");
        CountingDownstream down;
        Desk desk = start(
            "[{\"name\": \"strict\", \"on_failed\": \"reject\", \"forward_timeout_seconds\": 1,"
            " \"lease_seconds\": 3, \"forward_to\": \"" +
                down.url().toString().toUtf8() + "\"}]",
            url);
        const QByteArray key = "ff-" + m_run;
        const QString stored = u"strict:"_qs + QString::fromLatin1(key);
        down.closeGate();
        const ClientResponse first = deliver(desk.port, key, "{}", "strict");
        QCOMPARE(first.status, 504); // no answer: left processing until its lease ends
        auto forceFail = [&] {
            return *desk.pool->run<OperatorVerdict>([&](IdempotencyStore &s) {
                return s.applyOperator(stored, OperatorAction::ForceFail, true,
                                       u"operator (test)"_qs);
            });
        };
        QCOMPARE(name(forceFail()), name(OperatorVerdict::Leased));
        const qint64 leaseUntil =
            (*desk.pool->run<std::optional<KeyRecord>>([&](IdempotencyStore &s) {
                return s.key(stored);
            }))->leaseUntilMs;
        QVERIFY(QTest::qWaitFor(
            [&] {
                return *desk.pool->run<qint64>([](IdempotencyStore &s) { return s.clockMs(); }) >
                       leaseUntil;
            },
            10'000));
        QCOMPARE(name(forceFail()), name(OperatorVerdict::Accept));
        const ClientResponse dup = deliver(desk.port, key, "{}", "strict");
        QCOMPARE(dup.status, 500);
        QCOMPARE(dup.header("Idempotency-Outcome"), QByteArray("replayed"));
        QCOMPARE(dup.header("Content-Type"), QByteArray("application/problem+json"));
        QVERIFY2(dup.body.contains("no answer stored"), dup.body.constData());
        down.openGate();
        QCOMPARE(stateOf(desk, stored), name(KeyState::Failed));
        QCOMPARE(deliver(desk.port, key, "{}", "strict").status, 500);
        QCOMPARE(down.count("strict:" + key), 1);
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
        // The stored body's hash stays in the store: the sender learns nothing it could guess with.
        const QByteArray stored = record(desk, u"orders:m"_qs)->fingerprint;
        QVERIFY(!stored.isEmpty());
        QVERIFY2(!other.body.contains(stored) && !other.body.contains(stored.toUpper()), other.body.constData());
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

    void leaseExpiryRecoversAndTheLateCompletionIsRefused_data() { everyStore(); }
    void leaseExpiryRecoversAndTheLateCompletionIsRefused()
    {
        QFETCH(QString, store);
        const QString url = storeUrl(store);
        QVERIFY2(!url.isEmpty(), "IDEM_TEST_REDIS_URL / IDEM_TEST_POSTGRES_URL are not set: run through ./dev test");
        CountingDownstream down;
        // The shortest legal lease (the forward's deadline plus 2 s); two desks on one store.
        const QByteArray endpoints = forwardTo(down, ", \"lease_seconds\": 3, \"forward_timeout_seconds\": 1");
        Desk first = start(endpoints, url);
        Desk second = start(endpoints, url);
        const QByteArray key = "L-" + m_run;
        const QString stored = u"orders:"_qs + QString::fromLatin1(key);

        // The first desk's worker reaches the downstream, then its whole receiver thread stalls
        // there (well within its forward deadline: the stall follows the arrival at once).
        down.closeGate();
        ClientResponse firstAnswer;
        std::jthread sender([&] { firstAnswer = deliver(first.port, key); });
        QTRY_COMPARE(down.count("orders:" + key), 1);
        Stall stall(first.receiver->engine());
        QTRY_VERIFY(stall.stalled());
        const KeyRecord claimed = *record(second, stored);
        QVERIFY2(claimed.state == KeyState::Processing,
                 qPrintable(u"the first worker already finished (%1): it did not stall in time"_qs.arg(name(claimed.state))));
        down.openGate(); // its answer waits, unread, for the stalled thread

        // Once the lease the store holds has ended, the other desk recovers the key.
        QTRY_VERIFY_WITH_TIMEOUT(wallMs() > claimed.leaseUntilMs, 10000);
        const ClientResponse recovered = deliver(second.port, key);
        QCOMPARE(recovered.header("Idempotency-Outcome"), QByteArray("recovered"));
        QCOMPARE(recovered.status, 200);
        QCOMPARE(down.count("orders:" + key), 2);

        // The first worker wakes up and finishes after its lease was taken over: refused.
        stall.release();
        sender.join();
        QCOMPARE(firstAnswer.status, 409);
        QCOMPARE(firstAnswer.header("Idempotency-Outcome"), QByteArray("in-progress"));
        const KeyRecord k = *record(second, stored);
        QCOMPARE(name(k.state), name(KeyState::Completed));
        QVERIFY2(k.token > claimed.token, qPrintable(u"token %1 after %2"_qs.arg(k.token).arg(claimed.token)));
        QCOMPARE(k.result.body, recovered.body); // the newer worker's result stands
        QCOMPARE(deliver(second.port, key).header("Idempotency-Outcome"), QByteArray("replayed"));
        QCOMPARE(deliver(first.port, key).body, recovered.body);
        QCOMPARE(down.count("orders:" + key), 2);
    }

    // A 503 always means that nothing ran: an event the app processed whose result the store
    // would not take until the lease ended is answered 504, and the key is processed again once
    // the lease is over. The store is cut (every connection reset) while the app is at it.
    void aProcessedEventWhoseResultIsNotRecordedIsNeverAnswered503_data()
    {
        QTest::addColumn<QString>("store");
        QTest::addColumn<bool>("batch"); // a SendGrid batch, finished in one step
        for (const bool batch : {false, true}) {
            const char *kind = batch ? "sendgrid" : "generic";
            QTest::addRow("redis %s", kind) << u"IDEM_TEST_REDIS_URL"_qs << batch;
            QTest::addRow("postgres %s", kind) << u"IDEM_TEST_POSTGRES_URL"_qs << batch;
        }
    }
    void aProcessedEventWhoseResultIsNotRecordedIsNeverAnswered503()
    {
        QFETCH(QString, store);
        QFETCH(bool, batch);
        const QString direct = storeUrl(store);
        QVERIFY2(!direct.isEmpty(), "IDEM_TEST_REDIS_URL / IDEM_TEST_POSTGRES_URL are not set: run through ./dev test");
        QUrl url(direct);
        FaultProxy proxy(quint16(url.port()));
        url.setPort(proxy.port());
        CountingDownstream down;
        const QByteArray lease = ", \"lease_seconds\": 3, \"forward_timeout_seconds\": 1";
        Desk desk = start(batch ? "[{\"name\": \"orders\", \"provider\": \"sendgrid\", "
                                  "\"forward_to\": \"" +
                                      down.url().toString().toUtf8() + "\"" + lease + "}]"
                                : forwardTo(down, lease),
                          url.toString());
        const QByteArray key = (batch ? "NRB-" : "NR-") + m_run;
        auto send = [&] {
            if (!batch)
                return deliver(desk.port, key);
            return post(desk.port, "/hooks/orders",
                        "[{\"event\":\"open\",\"sg_event_id\":\"" + key + "\",\"timestamp\":1}]");
        };

        down.closeGate();
        ClientResponse answer;
        std::jthread sender([&] { answer = send(); });
        QTRY_COMPARE(down.total(), 1);
        proxy.setMode(FaultProxy::Mode::Reset); // the store is gone while the app works
        down.openGate();
        sender.join();
        QCOMPARE(answer.status, 504);
        QVERIFY2(answer.body.contains("Result not recorded"), answer.body.constData());
        QVERIFY(!answer.header("Retry-After").isEmpty());
        QCOMPARE(down.total(), 1);

        // The store back, the key is the lease's: processed again once the lease is over.
        proxy.setMode(FaultProxy::Mode::Pass);
        const KeyRecord left = *record(desk, u"orders:"_qs + QString::fromLatin1(key));
        QCOMPARE(name(left.state), name(KeyState::Processing));
        QTRY_VERIFY_WITH_TIMEOUT(wallMs() > left.leaseUntilMs, 10000);
        const ClientResponse again = send();
        QCOMPARE(again.status, 200);
        if (!batch)
            QCOMPARE(again.header("Idempotency-Outcome"), QByteArray("recovered"));
        QCOMPARE(down.total(), 2);
    }

    // SendGrid batches (docs/http.md#sendgrid-batches): each element its own key; only what is not
    // completed yet is forwarded; 2xx only when every element is completed. Through the pool on
    // every store.
    void sendgridPartialBatches_data() { everyStore(); }
    void sendgridPartialBatches()
    {
        QFETCH(QString, store);
        const QString url = storeUrl(store);
        QVERIFY2(!url.isEmpty(), "IDEM_TEST_REDIS_URL / IDEM_TEST_POSTGRES_URL are not set: run through ./dev test");
        CountingDownstream down;
        // in_progress_status 202 (allowed for single events) must not make a batch 2xx while one
        // of its events may still fail (docs/http.md#sendgrid-batches): batches answer 409 then.
        Desk desk = start("[{\"name\": \"sg\", \"provider\": \"sendgrid\", \"in_progress_status\": "
                          "202, \"forward_to\": \"" +
                              down.url().toString().toUtf8() + "\"}]",
                          url);
        auto id = [&](const char *n) { return "e" + QByteArray(n) + "-" + m_run; };
        auto batch = [](const QList<QByteArray> &ids) {
            QByteArray body = "[";
            for (const QByteArray &i : ids)
                body += (body.size() > 1 ? "," : "") + QByteArray("{\"event\":\"open\",\"sg_event_id\":\"") + i + "\",\"timestamp\":1}";
            return body + "]";
        };
        auto send = [&](const QList<QByteArray> &ids) { return post(desk.port, "/hooks/sg", batch(ids)); };
        auto state = [&](const char *n) { return stateOf(desk, u"sg:"_qs + QString::fromLatin1(id(n))); };

        ClientResponse r = send({id("a"), id("b")});
        QCOMPARE(r.status, 200);
        QCOMPARE(r.header("Idempotency-Outcome"), QByteArray("processed"));
        // Re-sent with a new element: only that element is forwarded.
        r = send({id("a"), id("b"), id("c")});
        QCOMPARE(r.status, 200);
        QCOMPARE(QJsonDocument::fromJson(r.body).object().value(u"replayed").toInt(), 2);
        QCOMPARE(QJsonDocument::fromJson(down.requests().last().body).array().size(), 1);
        QCOMPARE(forwardedEvents(down).value(QString::fromLatin1(id("c"))), 1);

        // One element fails: the batch is not 2xx although the other is completed.
        down.setStatus(500);
        r = send({id("c"), id("d")});
        QCOMPARE(r.status, 500);
        QCOMPARE(state("c"), name(KeyState::Completed));
        QCOMPARE(state("d"), name(KeyState::Failed));
        // SendGrid retries it: only the failed element runs again, and now the batch is 2xx.
        down.setStatus(200);
        r = send({id("c"), id("d")});
        QCOMPARE(r.status, 200);
        QCOMPARE(state("d"), name(KeyState::Completed));

        // One element is still being processed by an earlier delivery: not 2xx, with Retry-After.
        down.closeGate();
        ClientResponse earlier;
        std::jthread sender([&] { earlier = send({id("e")}); });
        QTRY_COMPARE(forwardedEvents(down).value(QString::fromLatin1(id("e"))), 1);
        r = send({id("c"), id("e")});
        QCOMPARE(r.status, 409);
        QCOMPARE(r.header("Idempotency-Outcome"), QByteArray("in-progress"));
        QVERIFY(r.header("Retry-After").toInt() >= 1);
        down.openGate();
        sender.join();
        QCOMPARE(earlier.status, 200);
        r = send({id("c"), id("e")});
        QCOMPARE(r.status, 200);
        QCOMPARE(r.header("Idempotency-Outcome"), QByteArray("replayed"));
        QCOMPARE(r.header("Idempotent-Replayed"), QByteArray("true"));

        // How often each event reached the downstream: once, and the failed one twice.
        const QHash<QString, int> n = forwardedEvents(down);
        QCOMPARE(n.size(), 5);
        for (const char *e : {"a", "b", "c", "e"})
            QVERIFY2(n.value(QString::fromLatin1(id(e))) == 1, e);
        QCOMPARE(n.value(QString::fromLatin1(id("d"))), 2);
    }

    // When every element is new the downstream gets the batch as the sender sent it, byte for
    // byte (not re-serialised: key order, spacing and escapes kept).
    void sendgridNewBatchIsForwardedAsSent_data() { everyStore(); }
    void sendgridNewBatchIsForwardedAsSent()
    {
        QFETCH(QString, store);
        const QString url = storeUrl(store);
        QVERIFY2(!url.isEmpty(), "IDEM_TEST_REDIS_URL / IDEM_TEST_POSTGRES_URL are not set: run through ./dev test");
        CountingDownstream down;
        Desk desk = start("[{\"name\": \"sg\", \"provider\": \"sendgrid\", \"forward_to\": \""
                          + down.url().toString().toUtf8() + "\"}]", url);
        const QByteArray body = "[ {\"sg_event_id\": \"n1-" + m_run + "\", \"event\": \"open\", \"email\": \"caf\\u00e9@example.com\", \"timestamp\": 1.50},\n"
                                "  {\"sg_event_id\": \"n2-" + m_run + "\", \"event\": \"click\", \"timestamp\": 2} ]";
        const ClientResponse r = post(desk.port, "/hooks/sg", body, {{"Content-Type", "application/json"}});
        QCOMPARE(r.status, 200);
        QCOMPARE(down.total(), 1);
        QCOMPARE(down.requests().first().body, body);
    }

    void downstreamUnreachableOrSlowFails()
    {
        CountingDownstream down;
        down.closeGate(); // never answers while the test runs
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
        QCOMPARE(name(record(desk, u"slow:s"_qs)->state),
                 name(KeyState::Processing)); // left to its lease
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

    // What one delivery can put in the delivery log is bounded: a mismatch's body is kept for
    // 60 a minute (a burst of 60), not for each 422 of a sender reusing a key with other bodies
    // (64 KB each filled Redis); a provider's note, read from a header, is cut to 256 characters.
    void theDeliveryLogKeepsBoundedEntries()
    {
        Desk desk = start("[{\"name\": \"orders\"}, {\"name\": \"gh\", \"provider\": \"github\"}]");
        QCOMPARE(deliver(desk.port, "m", "{\"n\":0}").status, 200);
        for (int i = 1; i <= 200; ++i)
            QCOMPARE(deliver(desk.port, "m", "{\"n\":" + QByteArray::number(i) + "}").status, 422);
        const HeaderList github{{"X-GitHub-Hook-ID", "7"},
                                {"X-GitHub-Delivery", "d1"},
                                {"X-GitHub-Event", QByteArray(15000, 'e')}};
        const ClientResponse gh = post(desk.port, "/hooks/gh", "{}", github);
        QVERIFY2(gh.status == 200, gh.body.constData());
        auto logOf = [&desk](const QString &key, const QString &endpoint = {}) {
            DeliveryQuery q;
            q.key = key;
            q.endpoint = endpoint;
            q.limit = 1000;
            return *desk.pool->run<QList<DeliveryEvent>>(
                [&](IdempotencyStore &s) { return s.deliveries(q); });
        };
        QTRY_COMPARE_WITH_TIMEOUT(logOf(u"orders:m"_qs).size(), 201, 10'000);
        int kept = 0, notKept = 0;
        for (const DeliveryEvent &e : logOf(u"orders:m"_qs)) {
            if (e.outcome != Outcome::Mismatch)
                continue;
            kept += !e.payload.isEmpty();
            notKept += e.payload.isEmpty() && e.detail.contains(u"body not kept"_qs);
        }
        // 200 mismatches take well under the 40 s that would refill 40 more.
        QVERIFY2(kept >= 60 && kept < 100, qPrintable(QString::number(kept)));
        QCOMPARE(kept + notKept, 200);
        QTRY_COMPARE_WITH_TIMEOUT(logOf({}, u"gh"_qs).size(), 1,
                                  10'000); // its key is scoped by hook
        const QString note = logOf({}, u"gh"_qs).first().detail;
        QVERIFY2(note.size() <= 256 && note.startsWith(u"event eee"_qs) && note.endsWith(u'…'),
                 qPrintable(note.left(300)));
    }

    // A flood of rejected deliveries (bad signatures: anyone who reaches the port can send them;
    // 16k a second filled an SQL log by ~9 GB an hour, and pushed every real delivery out of
    // Redis's capped stream) leaves a bounded log: the first 100 of an endpoint logged one by one,
    // then one a second, and for the others one summary entry a second with their count. Every
    // reader that counts deliveries from the log (`stats`, the per-endpoint outcomes) still counts
    // each one, and so does the engine (the metrics). On every store.
    void aFloodOfRejectedDeliveriesIsSummarised_data() { everyStore(); }
    void aFloodOfRejectedDeliveriesIsSummarised()
    {
        QFETCH(QString, store);
        const QString url = storeUrl(store);
        QVERIFY2(
            !url.isEmpty(),
            "IDEM_TEST_REDIS_URL / IDEM_TEST_POSTGRES_URL are not set: run through ./dev test");
        const QString ep = u"flood"_qs + QString::fromLatin1(m_run);
        const QByteArray config = "{\"endpoints\": [{\"name\": \"" + ep.toUtf8() +
                                  "\", \"provider\": \"github\", \"secret\": \"s3cret\"}]}";
        Desk desk = startDesk(config, url);
        constexpr int kFlood = 5000;
        const qint64 t0 = wallMs();
        QElapsedTimer elapsed;
        elapsed.start();
        {
            RawConnection c(desk.port);
            QVERIFY(c.isOpen());
            const HeaderList headers{{"X-GitHub-Hook-ID", "1"},
                                     {"X-GitHub-Delivery", "d"},
                                     {"X-Hub-Signature-256", "sha256=00"}};
            const QByteArray request = buildPost("/hooks/" + ep.toUtf8(), "{}", headers, false);
            for (int i = 0; i < kFlood; ++i) {
                QVERIFY(c.send(request));
                const ClientResponse r = c.readResponse();
                QCOMPARE(r.status, 401);
            }
        }
        // Counted as it is logged, just after the answer went out.
        QTRY_COMPARE(desk.receiver->engine()->counters().byOutcome[size_t(Outcome::Rejected)],
                     qint64(kFlood));
        const auto logOf = [&] {
            DeliveryQuery q;
            q.endpoint = ep;
            q.sinceMs = t0 - 1000;
            q.limit = 100'000;
            return *desk.pool->run<QList<DeliveryEvent>>(
                [&](IdempotencyStore &s) { return s.deliveries(q); });
        };
        const auto counted = [](const QList<DeliveryEvent> &log) {
            qint64 n = 0;
            for (const DeliveryEvent &e : log)
                n += e.outcome == Outcome::Rejected ? e.count : 0;
            return n;
        };
        // The last summary is written within a second or so of the flood's end.
        QTRY_COMPARE_WITH_TIMEOUT(counted(logOf()), qint64(kFlood), 30'000);
        const QList<DeliveryEvent> log = logOf();
        const qint64 seconds = elapsed.elapsed() / 1000 + 1;
        qint64 singles = 0, summaries = 0;
        for (const DeliveryEvent &e : log) {
            QCOMPARE(name(e.outcome), name(Outcome::Rejected));
            QCOMPARE(e.status, 401);
            if (e.count == 1) {
                ++singles;
                continue;
            }
            ++summaries;
            QVERIFY2(e.count > 1 && e.key.isEmpty() &&
                         e.detail.contains(u"not logged one by one"_qs) &&
                         e.detail.contains(u"rejected deliveries 401 in"_qs),
                     qPrintable(e.detail));
        }
        qInfo("%d rejected: %lld logged one by one, %lld summaries, in %lld s", kFlood, singles,
              summaries, seconds);
        // A burst of 100, then one a second; at most one summary a second (each covers a second
        // or more), however slow the machine was.
        QVERIFY2(singles >= 100 && singles <= 100 + seconds + 1,
                 qPrintable(u"%1 logged one by one in %2 s"_qs.arg(singles).arg(seconds)));
        QVERIFY2(summaries >= 1 && summaries <= seconds + 1,
                 qPrintable(u"%1 summaries in %2 s"_qs.arg(summaries).arg(seconds)));
        // `idemdesk stats` counts each delivery, from the same log.
        const auto parsed = Config::parse(config, u"test"_qs);
        QVERIFY(parsed.ok());
        const auto stats = desk.pool->run<StatsReport>(
            [&](IdempotencyStore &s) { return collectStats(s, *parsed, t0 - 1000); });
        QVERIFY2(stats.ok(), stats.ok() ? "" : qPrintable(stats.error().message));
        const auto mine = std::find_if(stats->endpoints.cbegin(), stats->endpoints.cend(),
                                       [&](const EndpointStats &e) { return e.name == ep; });
        QVERIFY(mine != stats->endpoints.cend());
        QCOMPARE(mine->outcomes[size_t(Outcome::Rejected)], qint64(kFlood));
        QCOMPARE(mine->deliveries(), qint64(kFlood));

        // A desk stopping writes the rejections it counted since its last summary.
        for (int i = 0; i < 300; ++i)
            QCOMPARE(post(desk.port, "/hooks/" + ep.toUtf8(), "{}").status, 401);
        desk.receiver.reset();
        QCOMPARE(counted(logOf()), qint64(kFlood + 300));
    }

    // A summary is written up to a second after its first rejection; what other endpoints'
    // deliveries were logged meanwhile is still read from a time after that first rejection. Redis
    // reads its stream newest first and stops at the first entry older than asked: a summary dated
    // at its first rejection stopped it short of them (`stats --since`, the Traffic view
    // undercounted).
    void aSummaryHidesNothingWrittenBeforeIt_data() { everyStore(); }
    void aSummaryHidesNothingWrittenBeforeIt()
    {
        QFETCH(QString, store);
        const QString url = storeUrl(store);
        QVERIFY2(
            !url.isEmpty(),
            "IDEM_TEST_REDIS_URL / IDEM_TEST_POSTGRES_URL are not set: run through ./dev test");
        const QString flood = u"hide"_qs + QString::fromLatin1(m_run);
        const QString other = u"seen"_qs + QString::fromLatin1(m_run);
        const QByteArray config = "{\"endpoints\": [{\"name\": \"" + flood.toUtf8() +
                                  "\", \"provider\": \"github\", \"secret\": \"s3cret\"}, "
                                  "{\"name\": \"" +
                                  other.toUtf8() + "\"}]}";
        Desk desk = startDesk(config, url);
        {
            RawConnection c(desk.port);
            QVERIFY(c.isOpen());
            const QByteArray request = buildPost("/hooks/" + flood.toUtf8(), "{}",
                                                 {{"X-GitHub-Hook-ID", "1"},
                                                  {"X-GitHub-Delivery", "d"},
                                                  {"X-Hub-Signature-256", "sha256=00"}},
                                                 false);
            for (int i = 0; i < 150; ++i) { // past the burst of 100: a summary to come
                QVERIFY(c.send(request));
                QCOMPARE(c.readResponse().status, 401);
            }
        }
        const qint64 since = wallMs() + 1; // after every rejection, the summary's first included
        QTest::qWait(5);
        for (int i = 0; i < 20; ++i)
            QCOMPARE(post(desk.port, "/hooks/" + other.toUtf8(), "{}",
                          {{"Idempotency-Key", QByteArray::number(i)}})
                         .status,
                     200);
        const auto logOf = [&](const QString &endpoint, qint64 sinceMs) {
            DeliveryQuery q;
            q.endpoint = endpoint;
            q.sinceMs = sinceMs;
            q.limit = 100'000;
            return *desk.pool->run<QList<DeliveryEvent>>(
                [&](IdempotencyStore &s) { return s.deliveries(q); });
        };
        const auto counted = [](const QList<DeliveryEvent> &log) {
            qint64 n = 0;
            for (const DeliveryEvent &e : log)
                n += e.count;
            return n;
        };
        QTRY_COMPARE_WITH_TIMEOUT(counted(logOf(flood, since - 60'000)), qint64(150), 30'000);
        QCOMPARE(logOf(other, since).size(), 20);
    }

    // Past the budget, each status has its summary: a flood of cheap 405s, sent last, does not
    // turn a real sender's 401s (a wrong secret) into 405s in the log. (One summary an endpoint
    // carried the last one's status and reason for all of them.)
    void eachStatusHasItsSummary()
    {
        Desk desk =
            start("[{\"name\": \"mixed\", \"provider\": \"github\", \"secret\": \"s3cret\"}]");
        RawConnection c(desk.port);
        QVERIFY(c.isOpen());
        const QByteArray badSignature = buildPost("/hooks/mixed", "{}",
                                                  {{"X-GitHub-Hook-ID", "1"},
                                                   {"X-GitHub-Delivery", "d"},
                                                   {"X-Hub-Signature-256", "sha256=00"}},
                                                  false);
        const QByteArray notPost = "GET /hooks/mixed HTTP/1.1\r\nHost: x\r\n\r\n";
        for (int i = 0; i < 250; ++i) { // 100 of them the burst, the rest each with a 405 after it
            QVERIFY(c.send(badSignature));
            QCOMPARE(c.readResponse().status, 401);
            if (i < 100)
                continue;
            QVERIFY(c.send(notPost));
            QCOMPARE(c.readResponse().status, 405);
        }
        const auto byStatus = [&] {
            DeliveryQuery q;
            q.endpoint = u"mixed"_qs;
            q.limit = 100'000;
            QMap<int, qint64> counted;
            const auto log = desk.pool->run<QList<DeliveryEvent>>(
                [&](IdempotencyStore &s) { return s.deliveries(q); });
            if (!log)
                return counted;
            for (const DeliveryEvent &e : *log)
                counted[e.status] += e.count;
            return counted;
        };
        QTRY_COMPARE_WITH_TIMEOUT(byStatus().value(405), qint64(150), 10'000);
        QCOMPARE(byStatus().value(401), qint64(250));
        QCOMPARE(byStatus().size(), 2);
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
