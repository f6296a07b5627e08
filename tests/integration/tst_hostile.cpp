// Hostile clients: each gets its documented answer or is closed, nothing is stored, and a
// normal client keeps being served meanwhile (its latency is printed beside the baseline).
#include "http/blockingclient.h"
#include "receiver/receiver.h"
#include "store/storefactory.h"
#include "util/clock.h"

#include <QElapsedTimer>
#include <QTemporaryDir>
#include <QTest>

#include <atomic>
#include <sys/resource.h>
#include <thread>

using namespace idem;

class TestHostile : public QObject
{
    Q_OBJECT
    QTemporaryDir m_dir;
    std::shared_ptr<StorePool> m_pool;
    std::unique_ptr<Receiver> m_receiver;
    quint16 m_port = 0;
    std::atomic<int> m_normalSeq{0};

    qint64 storedKeys()
    {
        return m_pool->run<StateCounts>([](IdempotencyStore &s) { return s.countKeys({}); })->total();
    }
    // Median latency (ms) of `n` normal deliveries, each with a new key.
    double normalLatency(int n)
    {
        QList<double> ms;
        for (int i = 0; i < n; ++i) {
            QElapsedTimer t;
            t.start();
            const ClientResponse r = post(m_port, "/hooks/orders", "{\"n\":1}",
                                          {{"Idempotency-Key", "normal-" + QByteArray::number(++m_normalSeq)}});
            if (r.status != 200)
                qWarning("normal delivery got %d %s", r.status, qPrintable(r.error));
            ms << double(t.nsecsElapsed()) / 1e6;
        }
        std::sort(ms.begin(), ms.end());
        return ms.at(ms.size() / 2);
    }
    static ClientResponse raw(quint16 port, const QByteArray &bytes)
    {
        RawConnection c(port, 5000);
        c.send(bytes);
        return c.readResponse();
    }

private Q_SLOTS:
    void initTestCase()
    {
        rlimit limit;
        getrlimit(RLIMIT_NOFILE, &limit);
        limit.rlim_cur = limit.rlim_max;
        setrlimit(RLIMIT_NOFILE, &limit);
        auto config = Config::parse("{\"endpoints\": [{\"name\": \"orders\", \"max_body_bytes\": 65536},"
                                    " {\"name\": \"byid\", \"key\": {\"json_pointer\": \"/id\"}}]}", u"hostile"_qs);
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

    void senderThatDisconnectsMidBody()
    {
        const qint64 before = storedKeys();
        for (int i = 0; i < 20; ++i) {
            RawConnection c(m_port);
            c.send("POST /hooks/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: cut-" + QByteArray::number(i)
                   + "\r\nContent-Length: 1000\r\n\r\n{\"half\":");
            c.close();
        }
        QTest::qWait(200);
        QCOMPARE(storedKeys(), before);
        QCOMPARE(post(m_port, "/hooks/orders", "{}", {{"Idempotency-Key", "after-cut"}}).status, 200);
    }

    void normalClientIsServedDuringAnAttack()
    {
        const qint64 storedBefore = storedKeys();
        const double baseline = normalLatency(200);
        const int normalBefore = m_normalSeq.load();

        // Thousands of idle keep-alive connections, slowloris senders, and garbage, all at once.
        std::vector<std::unique_ptr<RawConnection>> idle;
        for (int i = 0; i < 2000; ++i) {
            idle.push_back(std::make_unique<RawConnection>(m_port, 2000));
            QVERIFY(idle.back()->isOpen());
        }
        std::atomic<bool> stop{false};
        std::atomic<int> slowAnswered408{0};
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
                raw(m_port, "POST /hooks/orders HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxx");
                raw(m_port, QByteArray("\x00\xff\xfe garbage\r\n\r\n", 14));
            }
        });
        QTest::qWait(500);
        const double underAttack = normalLatency(200);
        stop = true;
        for (auto &t : attackers)
            t.join();
        qInfo("normal client median latency: %.2f ms alone, %.2f ms during the attack (%.1fx) with %d idle connections open",
              baseline, underAttack, underAttack / baseline, int(idle.size()));
        QVERIFY(slowAnswered408.load() > 0); // slow senders get 408 and are closed
        // Only the normal deliveries were stored.
        QCOMPARE(storedKeys(), storedBefore + 400);
        QCOMPARE(m_normalSeq.load() - normalBefore, 200);
        // The idle connections are still usable: keep-alive, not dropped by the attack.
        QCOMPARE(idle.front()->send(buildPost("/hooks/orders", "{}", {{"Idempotency-Key", "idle-0"}}, false)), true);
        QCOMPARE(idle.front()->readResponse().status, 200);
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
        QTest::qWait(200);
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
