// The HTTP layer (llhttp and the connection glue around it) fed arbitrary bytes over a real
// loopback socket; the server must answer or close, and keep serving.
#include "http/blockingclient.h"
#include "http/epolldispatcher.h"
#include "http/httpserver.h"

#include <QCoreApplication>
#include <QTcpSocket>
#include <QThread>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sys/socket.h>

namespace {
quint16 g_port = 0;
idem::HttpServer *g_server = nullptr;

void startServer()
{
    static int argc = 1;
    static char name[] = "fuzz_http";
    static char *argv[] = {name, nullptr};
    static QCoreApplication *app = new QCoreApplication(argc, argv);
    Q_UNUSED(app);
    auto *thread = new QThread;
    thread->setEventDispatcher(new idem::EpollDispatcher); // as the receiver runs it
    idem::HttpLimits limits;
    limits.maxBodyFor = [](const QByteArray &path) -> qint64 { return path == "/small" ? 64 : 65536; };
    limits.requestTimeoutMs = 200;
    limits.idleTimeoutMs = 200;
    auto *server = new idem::HttpServer(limits, [](idem::HttpRequest request, idem::Responder responder) {
        idem::HttpResponse r;
        r.body = request.method + ' ' + request.path + ' ' + QByteArray::number(request.body.size());
        if (request.path == "/reflect") {
            // A field of any bytes (the query, percent-decoded: CR, LF, NUL…), as a store may
            // hold one; the body says which, for checkAnswer().
            const QByteArray field = QByteArray::fromPercentEncoding(request.query);
            const qsizetype eq = field.indexOf('=');
            const QByteArray name = field.left(eq), value = eq < 0 ? QByteArray() : field.mid(eq + 1);
            r.headers = {{name, value}};
            r.body = "reflect:" + name.toHex() + ':' + value.toHex();
        }
        responder.send(r);
    });
    g_server = server;
    server->moveToThread(thread);
    thread->start();
    QMetaObject::invokeMethod(server, [server] {
        server->listen(QHostAddress::LocalHost, 0);
        g_port = server->port();
    }, Qt::BlockingQueuedConnection);
}

// An answer to /reflect carries the field it was given if that is a valid one, and no other
// than the server's own: a field's bytes never end the field or the answer (response splitting).
void checkAnswer(const idem::ClientResponse &answer)
{
    if (!answer.body.startsWith("reflect:"))
        return;
    const QList<QByteArray> parts = answer.body.split(':');
    const QByteArray name = QByteArray::fromHex(parts.value(1));
    const QByteArray value = QByteArray::fromHex(parts.value(2));
    const bool valid = idem::isFieldName(name) && idem::isFieldValue(value);
    for (const auto &[n, v] : answer.headers) {
        const bool ours = n == "Date" || n == "Content-Length" || n == "Connection";
        if (!ours && !(valid && n == name && v == value.trimmed())) {
            std::fprintf(stderr, "an answer carries a field it was not given: %s: %s\n",
                         n.constData(), v.constData());
            __builtin_trap();
        }
    }
}

// The request that shows the server still serves.
idem::ClientResponse askAlive(idem::RawConnection &c)
{
    c.send(idem::buildPost("/alive", "x", {}, false));
    return c.readResponse();
}
} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_port)
        startServer();
    {
        idem::RawConnection c(g_port, 300);
        c.send(QByteArrayView(reinterpret_cast<const char *>(data), qsizetype(size)));
        for (idem::ClientResponse r; (r = c.readResponse()).status != 0;)
            checkAnswer(r);
        c.abort(); // tens of thousands of connections: leave no TIME_WAIT to exhaust the ports
    }
    // Still serving. The probe stays open while a failure is described, so the server's side of
    // it is still there to be seen.
    idem::RawConnection probe(g_port, 5000);
    const quint16 probePort = probe.localPort();
    const idem::ClientResponse answer = askAlive(probe);
    if (answer.status != 200) {
        int connections = -1;
        QString sockets;
        QMetaObject::invokeMethod(
            g_server,
            [&] {
                connections = g_server->connectionCount();
                for (const QTcpSocket *s : g_server->findChildren<QTcpSocket *>())
                    sockets += u" [peer %1 state %2 available %3 unsent %4]"_qs.arg(s->peerPort())
                                   .arg(int(s->state()))
                                   .arg(s->bytesAvailable())
                                   .arg(s->bytesToWrite());
            },
            Qt::BlockingQueuedConnection);
        std::fprintf(stderr,
                     "not serving: status %d (%s), %d connections open; probe from port %u:%s\n",
                     answer.status, qPrintable(answer.error), connections, unsigned(probePort),
                     qPrintable(sockets));
        // Which side is stuck: the sockets the kernel holds, and whether it serves a moment later.
        if (FILE *f = std::fopen("/proc/net/sockstat", "r")) {
            char line[256];
            while (std::fgets(line, sizeof line, f))
                std::fputs(line, stderr);
            std::fclose(f);
        }
        const QByteArray ss = "ss -tani '( sport = :" + QByteArray::number(probePort) +
                              " or dport = :" + QByteArray::number(probePort) + " )' >&2";
        std::fflush(stderr);
        if (std::system(ss.constData()) != 0)
            std::fprintf(stderr, "(ss failed)\n");
        QThread::msleep(1000);
        idem::RawConnection again(g_port, 5000);
        const idem::ClientResponse later = askAlive(again);
        std::fprintf(stderr, "a second later: status %d (%s)\n", later.status,
                     qPrintable(later.error));
        __builtin_trap();
    }
    probe.abort(); // no TIME_WAIT either
    return 0;
}
