// The fault suite's own tools hold to their contract: FaultProxy's modes, in front of a real
// Redis spoken to over a raw socket, and what RecordingDownstream records of a run.
#include "support/faultproxy.h"
#include "support/recordingdownstream.h"
#include "support/servers.h"

#include <QElapsedTimer>
#include <QTemporaryDir>
#include <QTest>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

using namespace idem::test;

QByteArray forwarded(const QByteArray &key, const QByteArray &token = {})
{
    QByteArray request =
        "POST /run/x1 HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: " + key + "\r\n";
    if (!token.isEmpty())
        request += "Idempotency-Fencing-Token: " + token + "\r\n";
    return request + "Delivery-Attempt: " + key + ".c0.a0\r\nContent-Length: 2\r\n\r\n{}";
}

namespace {

// A blocking client on a raw socket: what arrives, and how the connection ended.
class Client
{
public:
    explicit Client(quint16 port)
    {
        m_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_port = htons(port);
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        m_connected = ::connect(m_fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr) == 0;
    }
    ~Client() { close(); }
    void close()
    {
        if (m_fd >= 0)
            ::close(m_fd);
        m_fd = -1;
    }

    bool connected() const { return m_connected; }
    void send(const QByteArray &bytes)
    {
        if (::send(m_fd, bytes.constData(), size_t(bytes.size()), MSG_NOSIGNAL) < 0)
            noteError(errno);
    }

    // What arrives within timeoutMs (until `until` is in it).
    QByteArray receive(int timeoutMs, const QByteArray &until = {})
    {
        QByteArray got;
        QElapsedTimer clock;
        clock.start();
        while (clock.elapsed() < timeoutMs && (until.isEmpty() || !got.contains(until))) {
            pollfd p{m_fd, POLLIN, 0};
            if (::poll(&p, 1, int(timeoutMs - clock.elapsed())) <= 0)
                break;
            char chunk[512];
            const ssize_t n = ::recv(m_fd, chunk, sizeof chunk, 0);
            if (n <= 0) {
                noteError(n == 0 ? 0 : errno);
                break;
            }
            got.append(chunk, n);
        }
        return got;
    }

    QByteArray error; // the first: "reset" (RST), "closed" (FIN) or another errno's text

private:
    void noteError(int code)
    {
        if (error.isEmpty())
            error = code == 0            ? QByteArrayLiteral("closed")
                    : code == ECONNRESET ? QByteArrayLiteral("reset")
                                         : QByteArray(strerror(code));
    }

    int m_fd = -1;
    bool m_connected = false;
};

} // namespace

class TestFaultProxy : public QObject
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

    void passes()
    {
        FaultProxy proxy(m_redis->port());
        Client client(proxy.port());
        QVERIFY(client.connected());
        client.send("PING\r\n");
        QCOMPARE(client.receive(2000, "\r\n"), QByteArray("+PONG\r\n"));
        QCOMPARE(proxy.connectionsAccepted(), 1);
    }

    void delaysEachWay()
    {
        FaultProxy proxy(m_redis->port());
        proxy.setMode(FaultProxy::Mode::Delay, 300);
        Client client(proxy.port());
        QElapsedTimer clock;
        clock.start();
        client.send("PING\r\n");
        QCOMPARE(client.receive(3000, "\r\n"), QByteArray("+PONG\r\n"));
        QVERIFY2(clock.elapsed() >= 600, qPrintable(QString::number(clock.elapsed())));
    }

    void blackholeHoldsBytesUntilItEnds()
    {
        FaultProxy proxy(m_redis->port());
        proxy.setMode(FaultProxy::Mode::Blackhole);
        Client client(proxy.port());
        QVERIFY(client.connected()); // accepted, as a partition's peer would seem to
        client.send("PING\r\n");
        QCOMPARE(client.receive(500),
                 QByteArray()); // waiting for the partition's length is the point
        QVERIFY(client.error.isEmpty());
        proxy.setMode(FaultProxy::Mode::Pass);
        QCOMPARE(client.receive(2000, "\r\n"),
                 QByteArray("+PONG\r\n")); // the held command went through, late
    }

    void resetClosesEveryConnectionAndRefusesNewOnes()
    {
        FaultProxy proxy(m_redis->port());
        Client open(proxy.port());
        open.send("PING\r\n");
        QCOMPARE(open.receive(2000, "\r\n"), QByteArray("+PONG\r\n"));
        proxy.setMode(FaultProxy::Mode::Reset);
        open.receive(2000);
        QCOMPARE(open.error, QByteArray("reset"));
        Client late(proxy.port());
        late.send("PING\r\n");
        late.receive(2000);
        QCOMPARE(late.error, QByteArray("reset"));
        QCOMPARE(proxy.connectionsReset(), 3); // both sides of the open link, and the new one
        proxy.setMode(FaultProxy::Mode::Pass);
        Client after(proxy.port());
        after.send("PING\r\n");
        QCOMPARE(after.receive(2000, "\r\n"), QByteArray("+PONG\r\n"));
    }

    void downstreamRecordsRuns()
    {
        RecordingDownstream downstream([](const QByteArray &key, int earlierRuns) {
            if (key == "hang" && earlierRuns == 0)
                return RunPlan{RunPlan::Kind::Answer, 200, 10'000};
            if (key == "trickle")
                return RunPlan{RunPlan::Kind::Trickle, 200, 20};
            return RunPlan{RunPlan::Kind::Answer, 500, 0};
        });
        Client failing(downstream.port());
        failing.send(forwarded("failing", "7"));
        QVERIFY(failing.receive(2000, "}").startsWith("HTTP/1.1 500"));
        Client trickle(downstream.port());
        trickle.send(forwarded("trickle"));
        QVERIFY(trickle.receive(5000, "}").endsWith("\"token\":0}"));
        QList<DownstreamRun> runs = downstream.runs();
        QCOMPARE(runs.size(), 2);
        QCOMPARE(runs[0].key, QByteArray("failing"));
        QCOMPARE(runs[0].token, 7);
        QCOMPARE(runs[0].instance, QByteArray("x1"));
        QCOMPARE(runs[0].delivery, QByteArray("failing.c0.a0"));
        QCOMPARE(runs[0].plan.status, 500);
        QVERIFY(!runs[0].cut);
        QCOMPARE(runs[1].plan.kind, RunPlan::Kind::Trickle);
        QVERIFY(runs[1].endMs - runs[1].startMs >= 100); // the body left 4 bytes every 20 ms
        QVERIFY(!runs[1].cut);

        // A run the desk gives up on ends when it closes the connection, and before the next
        // run of the key starts, whichever event the downstream handles first.
        Client first(downstream.port());
        first.send(forwarded("hang"));
        QTRY_COMPARE_WITH_TIMEOUT(downstream.openRuns("x1"), 1, 2000);
        first.close();
        Client second(downstream.port());
        second.send(forwarded("hang"));
        QVERIFY(second.receive(2000, "}").startsWith("HTTP/1.1 500"));
        runs = downstream.runs();
        QCOMPARE(runs.size(), 4);
        QVERIFY(runs[2].cut);
        QVERIFY(runs[2].endMs >= 0 && runs[2].endMs <= runs[3].startMs);
        QCOMPARE(downstream.openRuns("x1"), 0);
    }
};

QTEST_GUILESS_MAIN(TestFaultProxy)
#include "tst_faultproxy.moc"
