// The HTTP layer (llhttp and the connection glue around it) fed arbitrary bytes over a real
// loopback socket; the server must answer or close, and keep serving.
#include "http/blockingclient.h"
#include "http/httpserver.h"

#include <QCoreApplication>
#include <QThread>

#include <cstddef>
#include <cstdio>
#include <cstdint>
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
    idem::HttpLimits limits;
    limits.maxBodyFor = [](const QByteArray &path) -> qint64 { return path == "/small" ? 64 : 65536; };
    limits.requestTimeoutMs = 200;
    limits.idleTimeoutMs = 200;
    auto *server = new idem::HttpServer(limits, [](idem::HttpRequest request, idem::Responder responder) {
        idem::HttpResponse r;
        r.body = request.method + ' ' + request.path + ' ' + QByteArray::number(request.body.size());
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
    alive.send(idem::buildPost("/alive", "x", {}, false));
    const idem::ClientResponse answer = alive.readResponse();
    alive.abort();
    if (answer.status != 200) {
        int connections = -1;
        QMetaObject::invokeMethod(g_server, [&] { connections = g_server->connectionCount(); }, Qt::BlockingQueuedConnection);
        std::fprintf(stderr, "not serving: status %d (%s), %d connections open\n", answer.status,
                     qPrintable(answer.error), connections);
        __builtin_trap();
    }
    return 0;
}
