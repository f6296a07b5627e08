#pragma once

#include <QThread>

#include <atomic>

namespace idem::test {

class ProxyRelay;

// A TCP proxy on a loopback port in front of a store server (Redis, PostgreSQL) that a test
// switches between faults while traffic flows through it. Clients connect to port(); each
// connection gets its own connection to 127.0.0.1:upstreamPort.
//
//   Pass       bytes go through as they come.
//   Delay      every chunk leaves delayMs after it arrived, in order, in both directions.
//   Blackhole  connections are accepted and kept, nothing goes through: bytes and closes are
//              held, as a network partition holds them (TCP retransmits), and go through, late,
//              when the mode ends. A command sent in a blackhole may so run after its client
//              gave up on it: the in-doubt case.
//   Reset      every connection is closed with a reset (RST), and so is every new one.
//
// The proxy runs on its own thread; every member is thread-safe. setMode() returns once the
// mode is in effect (for Reset: once every connection is closed).
class FaultProxy
{
public:
    enum class Mode { Pass, Delay, Blackhole, Reset };

    explicit FaultProxy(quint16 upstreamPort);
    ~FaultProxy();
    FaultProxy(const FaultProxy &) = delete;
    FaultProxy &operator=(const FaultProxy &) = delete;

    quint16 port() const { return m_port; }
    void setMode(Mode mode, int delayMs = 0);
    int connectionsAccepted() const { return m_accepted.load(); }
    int connectionsReset() const { return m_reset.load(); }

private:
    QThread m_thread;
    ProxyRelay *m_relay = nullptr;
    quint16 m_port = 0;
    std::atomic<int> m_accepted{0};
    std::atomic<int> m_reset{0};
};

const char *toString(FaultProxy::Mode mode);

} // namespace idem::test
