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
    limits.maxBodyFor = [](const QByteArray &path) -> qint64 {
        return path == "/small" ? 64 : 65536;
    };
    limits.requestTimeoutMs = 200;
    limits.idleTimeoutMs = 200;
    auto *server =
        new idem::HttpServer(limits, [](idem::HttpRequest request, idem::Responder responder) {
            idem::HttpResponse r;
            r.body =
                request.method + ' ' + request.path + ' ' + QByteArray::number(request.body.size());
            responder.send(r);
        });
    g_server = server;
    server->moveToThread(thread);
    thread->start();
    QMetaObject::invokeMethod(
        server,
        [server] {
            server->listen(QHostAddress::LocalHost, 0);
            g_port = server->port();
        },
        Qt::BlockingQueuedConnection);
}
} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_port)
        startServer();
    {
        idem::RawConnection c(g_port, 300);
        c.send(QByteArrayView(reinterpret_cast<const char *>(data), qsizetype(size)));
        while (c.readResponse().status != 0) {
        }
        c.abort(); // tens of thousands of connections: leave no TIME_WAIT to exhaust the ports
    }
    // Still serving.
    idem::RawConnection alive(g_port, 5000);
    const quint16 alivePort = alive.localPort();
    alive.send(idem::buildPost("/alive", "x", {}, false));
    const idem::ClientResponse answer = alive.readResponse();
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
        std::fprintf(stderr, "alive from port %u:%s\n", unsigned(alivePort), qPrintable(sockets));
        std::fprintf(stderr, "not serving: status %d (%s), %d connections open\n", answer.status,
                     qPrintable(answer.error), connections);
        // Which side is stuck: the sockets the kernel holds, and whether it serves a moment later.
        if (FILE *f = std::fopen("/proc/net/sockstat", "r")) {
            char line[256];
            while (std::fgets(line, sizeof line, f))
                std::fputs(line, stderr);
            std::fclose(f);
        }
        const QByteArray ss = "ss -tani '( sport = :" + QByteArray::number(alivePort) +
                              " or dport = :" + QByteArray::number(alivePort) + " )' >&2";
        std::fflush(stderr);
        if (std::system(ss.constData()) != 0)
            std::fprintf(stderr, "(ss failed)\n");
        QThread::msleep(1000);
        idem::RawConnection again(g_port, 5000);
        again.send(idem::buildPost("/alive", "x", {}, false));
        const idem::ClientResponse second = again.readResponse();
        std::fprintf(stderr, "a second later: status %d (%s)\n", second.status,
                     qPrintable(second.error));
        __builtin_trap();
    }
    alive.abort();
    return 0;
}
