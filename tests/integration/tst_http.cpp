// The HTTP layer alone: keep-alive, pipelining, limits, timeouts, hostile input.
#include "http/httpserver.h"
#include "http/blockingclient.h"

#include <QDir>
#include <QElapsedTimer>
#include <QFile>
#include <QScopeGuard>
#include <QTest>
#include <QThread>
#include <QTimer>

#include <atomic>

#include <signal.h>
#include <sys/time.h>

using namespace idem;

class TestHttp : public QObject
{
    Q_OBJECT
    QThread m_thread;
    HttpServer *m_server = nullptr;
    quint16 m_port = 0;
    std::atomic<int> m_handled{0};
    std::atomic<int> m_lateAnswers{0};

private Q_SLOTS:
    void initTestCase()
    {
        HttpLimits limits;
        limits.maxBodyFor = [](const QByteArray &path) -> qint64 { return path == "/small" ? 16 : 1024 * 1024; };
        limits.idleTimeoutMs = 500;
        limits.requestTimeoutMs = 700;
        limits.maxHeaders = 20;
        limits.maxHeaderBytes = 2048;
        m_server = new HttpServer(limits, [this](HttpRequest request, Responder responder) {
            ++m_handled;
            HttpResponse r;
            r.status = 200;
            r.body = request.method + ' ' + request.path + ' ' + request.body;
            if (request.path == "/headers") { // the header list a handler gets, one line each
                r.body.clear();
                for (const auto &[name, value] : request.headers)
                    r.body += name + ": " + value + '\n';
            }
            r.setHeader("X-Query", request.query);
            if (request.path == "/split") { // what a store may hold: any bytes, any status
                r.status = request.header("X-Status").toInt();
                r.headers = {{"X-Fine", "ok"},
                             {"X-Evil", "a\r\nSet-Cookie: session=attacker\r\n\r\nHTTP/1.1 200 OK"},
                             {"X-Lf", "a\nSet-Cookie: lf=1"},
                             {"X-Nul", QByteArray("a\0b", 3)},
                             {"Bad Name", "x"},
                             {"Set-Cookie:x", "y"},
                             {"", "nameless"},
                             {"X-Obs", "caf\xe9\tok"}};
            }
            const int delay = request.header("X-Delay").toInt();
            if (delay <= 0)
                return responder.send(r);
            QTimer::singleShot(delay, m_server, [this, responder, r] {
                m_lateAnswers += responder.connected() ? 0 : 1;
                responder.send(r); // a gone client: nothing happens
            });
        });
        m_server->moveToThread(&m_thread);
        m_thread.start();
        QMetaObject::invokeMethod(m_server, [this] {
            QVERIFY(m_server->listen(QHostAddress::LocalHost, 0));
            m_port = m_server->port();
        }, Qt::BlockingQueuedConnection);
    }
    void cleanupTestCase()
    {
        QMetaObject::invokeMethod(m_server, [this] { delete m_server; }, Qt::BlockingQueuedConnection);
        m_thread.quit();
        m_thread.wait();
    }

    void aPostCarriesOneContentType()
    {
        // `send` of a form (Slack's slash command) says form, once; JSON is only the default.
        const QByteArray form = buildPost("/hooks/slack", "a=1",
                                          {{"Content-Type", "application/x-www-form-urlencoded"}});
        QCOMPARE(form.toLower().count("content-type:"), 1);
        QVERIFY(form.contains("Content-Type: application/x-www-form-urlencoded\r\n"));
        const QByteArray json = buildPost("/hooks/x", "{}", {});
        QCOMPARE(json.toLower().count("content-type:"), 1);
        QVERIFY(json.contains("Content-Type: application/json\r\n"));
    }

    void keepAliveServesSeveralRequests()
    {
        RawConnection c(m_port);
        for (int i = 0; i < 3; ++i) {
            QVERIFY(c.send(buildPost("/echo?i=" + QByteArray::number(i), "b" + QByteArray::number(i), {}, false)));
            const ClientResponse r = c.readResponse();
            QCOMPARE(r.status, 200);
            QCOMPARE(r.body, "POST /echo b" + QByteArray::number(i));
            QCOMPARE(r.header("X-Query"), "i=" + QByteArray::number(i));
            QVERIFY(r.header("Connection").isEmpty());
            QVERIFY(!r.header("Date").isEmpty());
        }
    }

    void pipelinedAnswersKeepTheirOrder()
    {
        RawConnection c(m_port);
        // The first is answered last by its handler's clock, yet its answer leaves first.
        QByteArray burst = buildPost("/one", "1", {{"X-Delay", "150"}}, false)
                           + buildPost("/two", "2", {}, false) + buildPost("/three", "3", {}, false);
        QVERIFY(c.send(burst));
        QCOMPARE(c.readResponse().body, QByteArray("POST /one 1"));
        QCOMPARE(c.readResponse().body, QByteArray("POST /two 2"));
        QCOMPARE(c.readResponse().body, QByteArray("POST /three 3"));
    }

    void oversizedBodyIs413BeforeItIsRead()
    {
        RawConnection c(m_port);
        // Announce 50 MB and send none of it: the answer must not wait for the body.
        QVERIFY(c.send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 52428800\r\n\r\n"));
        const ClientResponse r = c.readResponse();
        QCOMPARE(r.status, 413);
        QCOMPARE(r.header("Content-Type"), QByteArray("application/problem+json"));
        QCOMPARE(r.header("Connection"), QByteArray("close"));
        QVERIFY(c.waitClosed(2000));
    }

    void perPathLimitAndChunkedBodies()
    {
        QCOMPARE(post(m_port, "/small", QByteArray(17, 'x')).status, 413);
        QCOMPARE(post(m_port, "/small", QByteArray(16, 'x')).status, 200);
        RawConnection c(m_port);
        QVERIFY(c.send("POST /small HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                       "a\r\n0123456789\r\na\r\n0123456789\r\n0\r\n\r\n"));
        QCOMPARE(c.readResponse().status, 413);
        RawConnection ok(m_port);
        QVERIFY(ok.send("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                        "3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"));
        QCOMPARE(ok.readResponse().body, QByteArray("POST /echo abcde"));
    }

    void oversizedHeadersAre431()
    {
        QCOMPARE(post(m_port, "/echo", "x", {{"X-Big", QByteArray(4096, 'a')}}).status, 431);
        HeaderList many;
        for (int i = 0; i < 30; ++i)
            many.append({"X-H" + QByteArray::number(i), "v"});
        QCOMPARE(post(m_port, "/echo", "x", many).status, 431);
        QCOMPARE(post(m_port, "/" + QByteArray(3000, 'p'), "x").status, 431);
    }

    void malformedRequestsAre400_data()
    {
        QTest::addColumn<QByteArray>("raw");
        QTest::newRow("garbage") << QByteArray("HELLO\r\n\r\n");
        QTest::newRow("header without colon") << QByteArray("POST /echo HTTP/1.1\r\nHost: x\r\nBroken\r\nContent-Length: 1\r\n\r\nx");
        // Stored, it would be replayed as an invalid line, and no store export would read it back.
        QTest::newRow("header without a name")
            << QByteArray("POST /echo HTTP/1.1\r\nHost: x\r\n: evil\r\nContent-Length: 0\r\n\r\n");
        QTest::newRow("two content-lengths") << QByteArray("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxx");
        QTest::newRow("content-length with chunked") << QByteArray("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n");
        QTest::newRow("bad chunk size") << QByteArray("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n");
        QTest::newRow("control byte in header") << QByteArray("POST /echo HTTP/1.1\r\nHost: x\r\nX-A: a\x01" "b\r\nContent-Length: 0\r\n\r\n");
        QTest::newRow("bad version") << QByteArray("POST /echo HTTP/9.9\r\nHost: x\r\n\r\n");
        // RFC 9112 §5.2: obs-fold in a request is refused, wherever it is.
        QTest::newRow("obs-fold") << QByteArray("POST /echo HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\nContent-Length: 0\r\n\r\n");
        QTest::newRow("obs-fold with a tab") << QByteArray("POST /echo HTTP/1.1\r\nHost: x\r\nX-A: a\r\n\tb\r\nContent-Length: 0\r\n\r\n");
        QTest::newRow("obs-fold of transfer-encoding") << QByteArray("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:\r\n chunked\r\n\r\n1\r\na\r\n0\r\n\r\n");
        QTest::newRow("obs-fold in the last header") << QByteArray("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nX-A:\r\n  a\r\n\r\n");
        // RFC 9112 §3.2: exactly one Host in HTTP/1.1.
        QTest::newRow("HTTP/1.1 without Host") << QByteArray("POST /echo HTTP/1.1\r\nContent-Length: 1\r\n\r\nx");
        QTest::newRow("two Hosts") << QByteArray("POST /echo HTTP/1.1\r\nHost: a\r\nHost: b\r\nContent-Length: 1\r\n\r\nx");
        // RFC 9112 §6: chunked must be the final coding; HTTP/1.0 has no Transfer-Encoding.
        QTest::newRow("gzip alone") << QByteArray("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\nxx");
        QTest::newRow("chunked, gzip") << QByteArray("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n");
        QTest::newRow("chunked in HTTP/1.0") << QByteArray("POST /echo HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n");
    }
    void malformedRequestsAre400()
    {
        QFETCH(QByteArray, raw);
        const int before = m_handled.load();
        RawConnection c(m_port);
        QVERIFY(c.send(raw));
        const ClientResponse r = c.readResponse();
        QCOMPARE(r.status, 400);
        QCOMPARE(r.header("Connection"), QByteArray("close"));
        QVERIFY(c.waitClosed(2000));
        QCOMPARE(m_handled.load(), before); // no handler saw it
    }

    void unknownTransferCodingsAre501_data()
    {
        QTest::addColumn<QByteArray>("codings");
        QTest::newRow("gzip, chunked") << QByteArray("gzip, chunked");
        QTest::newRow("deflate, chunked") << QByteArray("deflate, chunked");
        QTest::newRow("on two lines") << QByteArray("gzip\r\nTransfer-Encoding: chunked");
    }
    void unknownTransferCodingsAre501()
    {
        // Nothing here decodes gzip: the body must not be taken as plain bytes.
        QFETCH(QByteArray, codings);
        const int before = m_handled.load();
        RawConnection c(m_port);
        QVERIFY(c.send("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: " + codings + "\r\n\r\n2\r\nab\r\n0\r\n\r\n"));
        const ClientResponse r = c.readResponse();
        QCOMPARE(r.status, 501);
        QCOMPARE(r.header("Connection"), QByteArray("close"));
        QVERIFY(r.body.contains("gzip") || r.body.contains("deflate"));
        QCOMPARE(m_handled.load(), before);
    }

    void trailersAreNotHeaders()
    {
        // Trailer fields of a chunked body are read and dropped: none becomes a header, none
        // replaces one (the last header used to be duplicated, every trailer but the last added).
        RawConnection c(m_port);
        QVERIFY(c.send("POST /headers HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nX-User: alice\r\n\r\n"
                       "3\r\nabc\r\n0\r\nIdempotency-Key: forged\r\nX-User: admin\r\nX-Pad: 1\r\n\r\n"));
        const ClientResponse r = c.readResponse();
        QCOMPARE(r.status, 200);
        QCOMPARE(r.body, QByteArray("Host: x\nTransfer-Encoding: chunked\nX-User: alice\n"));
        // The connection goes on with the next request.
        QVERIFY(c.send(buildPost("/echo", "next", {}, false)));
        QCOMPARE(c.readResponse().body, QByteArray("POST /echo next"));
    }

    void aRepeatedFieldIsOneLine()
    {
        // The handler gets the field once, as everyone after it (engine, forwarder) reads it.
        RawConnection c(m_port);
        QVERIFY(c.send("POST /headers HTTP/1.1\r\nHost: x\r\nX-User: alice\r\nCookie: a=1\r\nx-user: bob\r\n"
                       "Cookie: b=2\r\nX-Empty:\r\nX-Empty: e\r\nContent-Length: 0\r\n\r\n"));
        const ClientResponse r = c.readResponse();
        QCOMPARE(r.status, 200);
        QCOMPARE(r.body, QByteArray("Host: x\nX-User: alice, bob\nCookie: a=1; b=2\nX-Empty: e\nContent-Length: 0\n"));
    }

    void expectContinue()
    {
        RawConnection c(m_port);
        QVERIFY(c.send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"));
        // The interim answer arrives, byte for byte, before the body is sent.
        QCOMPARE(c.readBytes(25), QByteArray("HTTP/1.1 100 Continue\r\n\r\n"));
        QVERIFY(c.send("hello"));
        const ClientResponse r = c.readResponse();
        QCOMPARE(r.status, 200);
        QCOMPARE(r.body, QByteArray("POST /echo hello"));
        RawConnection big(m_port);
        QVERIFY(big.send("POST /small HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\nExpect: 100-continue\r\n\r\n"));
        QCOMPARE(big.readResponse().status, 413);
        RawConnection odd(m_port);
        QVERIFY(odd.send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nExpect: teapot\r\n\r\nx"));
        QCOMPARE(odd.readResponse().status, 417);
    }

    void headIsAGetWithoutItsBody()
    {
        // The handler answers a HEAD with a body, as it would a GET: the server sends the
        // headers, that body's Content-Length included, and none of the body (RFC 9110 9.3.2),
        // so the next answer on the connection is read from its first byte.
        RawConnection c(m_port);
        QVERIFY(c.send("HEAD /page HTTP/1.1\r\nHost: x\r\n\r\n"
                       "GET /page HTTP/1.1\r\nHost: x\r\n\r\n"));
        const ClientResponse head = c.readResponse(true);
        QCOMPARE(head.status, 200);
        QCOMPARE(head.header("Content-Length"),
                 QByteArray::number(QByteArray("HEAD /page ").size()));
        const ClientResponse get = c.readResponse();
        QCOMPARE(get.status, 200);
        QCOMPARE(get.body, QByteArray("GET /page "));
    }

    void idleConnectionsAreClosed()
    {
        RawConnection c(m_port);
        QVERIFY(c.send(buildPost("/echo", "x", {}, false)));
        QCOMPARE(c.readResponse().status, 200);
        QVERIFY(c.waitClosed(3000)); // idle timeout 500 ms
    }

    void slowClientGets408()
    {
        RawConnection c(m_port);
        QVERIFY(c.send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc"));
        const ClientResponse r = c.readResponse(); // request timeout 700 ms
        QCOMPARE(r.status, 408);
        QVERIFY(c.waitClosed(2000));
    }

    void clientGoneBeforeTheAnswer()
    {
        const int late = m_lateAnswers.load();
        for (int i = 0; i < 20; ++i) {
            RawConnection c(m_port);
            QVERIFY(c.send(buildPost("/echo", "x", {{"X-Delay", "100"}})));
            c.close();
        }
        QTRY_COMPARE_WITH_TIMEOUT(m_lateAnswers.load(), late + 20, 5000);
        // The server is still well.
        QCOMPARE(post(m_port, "/echo", "alive").body, QByteArray("POST /echo alive"));
    }

    void fuzzerInputsStayHarmless()
    {
        // Inputs the HTTP fuzzer kept (tests/fuzz/seeds/http): answered or closed, and the
        // server keeps serving.
        const QDir seeds(QStringLiteral(IDEM_FUZZ_SEEDS));
        const QStringList files = seeds.entryList(QDir::Files);
        QVERIFY(!files.isEmpty());
        for (const QString &name : files) {
            QFile f(seeds.filePath(name));
            QVERIFY(f.open(QIODevice::ReadOnly));
            RawConnection c(m_port, 2000);
            c.send(f.readAll());
            while (c.readResponse().status != 0) {
            }
            QCOMPARE(post(m_port, "/echo", "alive").body, QByteArray("POST /echo alive"));
        }
    }

    void signalsDoNotCutTheClientShort()
    {
        // SIGALRM every 2 ms, installed without SA_RESTART as libFuzzer's timer is (a terminal's
        // SIGWINCH during `idemdesk storm` is the same): connect, poll and recv come back with
        // EINTR, which is neither a timeout nor a closed peer.
        struct sigaction action
        {
        };
        action.sa_handler = [](int) {};
        struct sigaction previous
        {
        };
        QCOMPARE(::sigaction(SIGALRM, &action, &previous), 0);
        const itimerval every2ms{{0, 2000}, {0, 2000}};
        QCOMPARE(::setitimer(ITIMER_REAL, &every2ms, nullptr), 0);
        int answered = 0;
        for (int i = 0; i < 5; ++i) {
            RawConnection c(m_port, 3000);
            c.send(buildPost("/echo", "late", {{"X-Delay", "150"}}, false));
            answered += c.readResponse().status == 200 ? 1 : 0;
        }
        const itimerval off{};
        ::setitimer(ITIMER_REAL, &off, nullptr);
        ::sigaction(SIGALRM, &previous, nullptr);
        QCOMPARE(answered, 5);
    }

    void anAnswerIsOneAnswerWhateverItsHeadersHold_data()
    {
        QTest::addColumn<QByteArray>("status");
        QTest::addColumn<int>("expected");
        QTest::newRow("200") << QByteArray("200") << 200;
        QTest::newRow("404") << QByteArray("404") << 404;
        // Not a final status: a 101 would tell the client the protocol changed.
        QTest::newRow("101") << QByteArray("101") << 502;
        QTest::newRow("0") << QByteArray("0") << 502;
        QTest::newRow("1000") << QByteArray("1000") << 502;
    }
    void anAnswerIsOneAnswerWhateverItsHeadersHold()
    {
        QFETCH(QByteArray, status);
        QFETCH(int, expected);
        // Two requests on one connection: the first answer's fields must not end it early (a
        // second status line, an injected Set-Cookie), so the second answer is the second.
        RawConnection c(m_port, 3000);
        QVERIFY(c.send("GET /split HTTP/1.1\r\nHost: x\r\nX-Status: " + status +
                       "\r\n\r\nGET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
        const QByteArray wire = c.readBytes(1 << 20); // up to the close
        const qsizetype end = wire.indexOf("\r\n\r\n");
        QVERIFY2(end > 0, wire.constData());
        QList<QByteArray> lines = wire.left(end + 2).split('\n');
        lines.removeLast(); // after the last line's \n
        QCOMPARE(lines.first(), "HTTP/1.1 " + QByteArray::number(expected) + ' ' +
                                    reasonPhrase(expected) + '\r');
        QByteArrayList names;
        for (const QByteArray &line : lines.mid(1)) {
            QVERIFY2(line.endsWith('\r') && line.count('\r') == 1, line.constData());
            const qsizetype colon = line.indexOf(':');
            QVERIFY2(colon > 0 && isFieldName(line.left(colon)), line.constData());
            names << line.left(colon);
        }
        QVERIFY2(!wire.contains("Set-Cookie") && !wire.contains("nameless"), wire.constData());
        if (expected != 502) { // the valid fields are kept, obs-text and tab included
            QVERIFY2(names.contains("X-Fine") && wire.contains("X-Obs: caf\xe9\tok\r\n"),
                     wire.constData());
            const auto ours = std::count_if(names.begin(), names.end(),
                                            [](const QByteArray &n) { return n.startsWith("X-"); });
            QCOMPARE(ours, 2); // X-Fine, X-Obs
        }
        QCOMPARE(wire.count("HTTP/1.1 "), 2);
        QVERIFY2(wire.contains("\r\n\r\nGET /echo "), wire.constData()); // the second, whole
    }

    void aClientTakingItsAnswersTooSlowlyIsClosed()
    {
        // A client that takes its answers, but slower than the minimum rate: closed once an idle
        // time has passed at that pace. Each write used to count as activity, so a client taking
        // a little now and then kept the connection and the answers it had not taken.
        HttpLimits limits;
        limits.idleTimeoutMs = 2000;
        limits.minDrainBytesPerSecond = 4 * 1024 * 1024; // it takes ~1 MB/s
        QThread thread;
        auto *server = new HttpServer(limits, [](HttpRequest, Responder responder) {
            HttpResponse r;
            r.status = 200;
            r.body = QByteArray(8 * 1024 * 1024, 'x'); // more than the kernel's buffers take
            responder.send(r);
        });
        server->moveToThread(&thread);
        thread.start();
        quint16 port = 0;
        QMetaObject::invokeMethod(
            server,
            [&] {
                if (server->listen(QHostAddress::LocalHost, 0))
                    port = server->port();
            },
            Qt::BlockingQueuedConnection);
        auto stop = qScopeGuard([&] {
            QMetaObject::invokeMethod(
                server, [server] { delete server; }, Qt::BlockingQueuedConnection);
            thread.quit();
            thread.wait();
        });
        QVERIFY(port);
        RawConnection c(port, 2000);
        QVERIFY(c.send(QByteArray("GET /big HTTP/1.1\r\nHost: x\r\n\r\n").repeated(8)));
        qint64 taken = 0;
        bool closed = false;
        QElapsedTimer elapsed;
        elapsed.start();
        // The server's close reaches the client after what the kernels' buffers hold (~4 MB here).
        while (!closed && elapsed.elapsed() < 30'000) {
            const QByteArray got = c.readBytes(64 * 1024); // fewer: closed, or nothing for 2 s
            taken += got.size();
            closed = got.size() < 64 * 1024 && c.waitClosed(100);
            QThread::msleep(64); // the client's pace
        }
        qInfo("a client taking its answers at %lld KB/s: %s after %lld ms, %lld of %d KB taken",
              taken / std::max<qint64>(1, elapsed.elapsed()), closed ? "closed" : "still open",
              elapsed.elapsed(), taken >> 10, 64 * 1024);
        QVERIFY2(closed, "a client taking its answers below the minimum rate kept its connection");
        QVERIFY(taken > 0);
        QVERIFY(taken < 64 * 1024 * 1024);
    }

    void http10ClosesAfterTheAnswer()
    {
        RawConnection c(m_port);
        QVERIFY(c.send("POST /echo HTTP/1.0\r\nContent-Length: 2\r\n\r\nhi"));
        const ClientResponse r = c.readResponse();
        QCOMPARE(r.status, 200);
        QVERIFY(c.waitClosed(2000));
    }
};

QTEST_GUILESS_MAIN(TestHttp)
#include "tst_http.moc"
