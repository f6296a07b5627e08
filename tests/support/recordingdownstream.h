#pragma once

#include <QByteArray>
#include <QList>
#include <QThread>
#include <QUrl>

#include <functional>
#include <mutex>

namespace idem::test {

class RecordingServer;

// How the downstream answers one run: `status` after `delayMs` (a hang when that is past the
// desk's forward timeout), or, trickling, the status line at once and the body a few bytes every
// `delayMs`.
struct RunPlan
{
    enum class Kind { Answer, Trickle };
    Kind kind = Kind::Answer;
    int status = 200;
    int delayMs = 0;
};

// One run of the processor as the downstream app saw it. Times are monotonicUs() / 1000 of the
// test process, the clock the suite's driver and fault schedule use too.
struct DownstreamRun
{
    QByteArray key;      // Idempotency-Key
    qint64 token = 0;    // Idempotency-Fencing-Token; 0 when the desk sent none
    QByteArray instance; // the last path segment of the request: which desk forwarded it
    QByteArray delivery; // the Delivery-Attempt header the sender set and the desk forwarded
    RunPlan plan;
    qint64 startMs = 0; // the whole request had arrived
    qint64 endMs = -1;  // the whole answer left, or the desk closed the connection; -1: still open
    bool cut = false;   // the desk closed the connection before the whole answer left
    QByteArray body;    // the answer's body (sent whole, or the part that left before the cut)
};

// A downstream app on its own thread that records every run the desk forwards to it, answering
// each as a planner decides (from the key and how many runs of it came before). Speaks just
// enough HTTP/1.1 for the desk's forwarder: Content-Length bodies, keep-alive. Forward to
// url(instance), one path per desk instance, so a run names the instance that made it.
// Thread-safe.
class RecordingDownstream
{
public:
    using Planner = std::function<RunPlan(const QByteArray &key, int earlierRuns)>;

    explicit RecordingDownstream(Planner planner);
    ~RecordingDownstream();
    RecordingDownstream(const RecordingDownstream &) = delete;
    RecordingDownstream &operator=(const RecordingDownstream &) = delete;

    quint16 port() const { return m_port; }
    QUrl url(const QString &instance) const;
    QList<DownstreamRun> runs() const;
    // Runs of `instance` whose answer has not left yet.
    int openRuns(const QByteArray &instance) const;

private:
    friend class RecordingServer;
    QThread m_thread;
    RecordingServer *m_server = nullptr;
    quint16 m_port = 0;
    mutable std::mutex m_mutex;
    QList<DownstreamRun> m_runs;
};

} // namespace idem::test
