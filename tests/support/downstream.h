#pragma once

#include "http/httpserver.h"

#include <QThread>
#include <QUrl>

#include <atomic>
#include <mutex>

namespace idem::test {

// A real HTTP downstream on its own thread that counts what reaches it, per Idempotency-Key.
// Answers `status` after `delayMs`; thread-safe.
class CountingDownstream
{
public:
    CountingDownstream();
    ~CountingDownstream();

    quint16 port() const { return m_port; }
    QUrl url() const;
    void setStatus(int status) { m_status = status; }
    void setDelayMs(int delayMs) { m_delayMs = delayMs; }
    int total() const { return m_total.load(); }
    int count(const QByteArray &idempotencyKey) const;
    QList<HttpRequest> requests() const;

private:
    QThread m_thread;
    HttpServer *m_server = nullptr;
    quint16 m_port = 0;
    std::atomic<int> m_status{200};
    std::atomic<int> m_delayMs{0};
    std::atomic<int> m_total{0};
    mutable std::mutex m_mutex;
    QList<HttpRequest> m_requests;
};

} // namespace idem::test
