#include "support/downstream.h"

#include <QTimer>

#include <utility>

namespace idem::test {

CountingDownstream::CountingDownstream()
{
    m_server = new HttpServer({}, [this](HttpRequest request, Responder responder) {
        ++m_total;
        {
            std::lock_guard lock(m_mutex);
            m_requests.append(request);
        }
        HttpResponse r = HttpResponse::json(m_status.load(), {{QStringLiteral("downstream"), true},
                                                              {QStringLiteral("n"), m_total.load()}});
        r.setHeader("X-Downstream", "counting");
        {
            std::lock_guard lock(m_mutex);
            if (m_body) {
                r.body = *m_body;
                for (const auto &[name, value] : std::as_const(m_headers))
                    r.setHeader(name, value);
            }
        }
        if (m_gateClosed.load()) {
            m_waiting.append({responder, r});
            ++m_held;
            return;
        }
        const int delay = m_delayMs.load();
        if (delay <= 0)
            responder.send(r);
        else
            QTimer::singleShot(delay, m_server, [responder, r] { responder.send(r); });
    });
    m_server->moveToThread(&m_thread);
    m_thread.start();
    QMetaObject::invokeMethod(m_server, [this] {
        m_server->listen(QHostAddress::LocalHost, 0);
        m_port = m_server->port();
    }, Qt::BlockingQueuedConnection);
}

CountingDownstream::~CountingDownstream()
{
    QMetaObject::invokeMethod(m_server, [this] { delete m_server; }, Qt::BlockingQueuedConnection);
    m_thread.quit();
    m_thread.wait();
}

void CountingDownstream::setBody(QByteArray body, HeaderList headers)
{
    std::lock_guard lock(m_mutex);
    m_body = std::move(body);
    m_headers = std::move(headers);
}

void CountingDownstream::closeGate()
{
    m_gateClosed = true;
}

void CountingDownstream::openGate()
{
    m_gateClosed = false;
    // On the server's thread, after every request that saw the gate closed was queued there.
    QMetaObject::invokeMethod(m_server, [this] {
        for (const auto &[responder, response] : std::exchange(m_waiting, {}))
            responder.send(response);
        m_held = 0;
    }, Qt::BlockingQueuedConnection);
}

QUrl CountingDownstream::url() const
{
    return QUrl(QStringLiteral("http://127.0.0.1:%1/hook").arg(m_port));
}

int CountingDownstream::count(const QByteArray &idempotencyKey) const
{
    std::lock_guard lock(m_mutex);
    int n = 0;
    for (const auto &r : m_requests)
        n += r.header("Idempotency-Key") == idempotencyKey;
    return n;
}

QList<HttpRequest> CountingDownstream::requests() const
{
    std::lock_guard lock(m_mutex);
    return m_requests;
}

} // namespace idem::test
