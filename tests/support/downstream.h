#pragma once

#include "http/httpserver.h"

#include <QThread>
#include <QUrl>

#include <atomic>
#include <mutex>
#include <optional>

namespace idem::test {

// A real HTTP downstream on its own thread that counts what reaches it, per Idempotency-Key.
// Answers `status` after `delayMs`; thread-safe. While the gate is closed, requests are counted
// on arrival and held unanswered until the test opens it: a delivery is "in flight" for exactly
// as long as the test wants, with no time window to guess.
class CountingDownstream
{
public:
    CountingDownstream();
    ~CountingDownstream();

    quint16 port() const { return m_port; }
    QUrl url() const;
    void setStatus(int status) { m_status = status; }
    void setDelayMs(int delayMs) { m_delayMs = delayMs; }
    // Answers with this body and these headers (each replacing its JSON answer's) instead of its counting JSON.
    void setBody(QByteArray body, HeaderList headers = {});
    int total() const { return m_total.load(); }
    int count(const QByteArray &idempotencyKey) const;
    QList<HttpRequest> requests() const;
    void closeGate();
    void openGate(); // answers every held request now (each with the status set at its arrival)
    int held() const { return m_held.load(); }

private:
    QThread m_thread;
    HttpServer *m_server = nullptr;
    quint16 m_port = 0;
    std::atomic<int> m_status{200};
    std::atomic<int> m_delayMs{0};
    std::atomic<int> m_total{0};
    std::atomic<bool> m_gateClosed{false};
    std::atomic<int> m_held{0};
    QList<std::pair<Responder, HttpResponse>> m_waiting; // on the server's thread only
    mutable std::mutex m_mutex;
    QList<HttpRequest> m_requests;
    std::optional<QByteArray> m_body; // guarded by m_mutex
    HeaderList m_headers;
};

} // namespace idem::test
