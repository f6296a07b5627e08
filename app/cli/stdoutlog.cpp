#include "cli/stdoutlog.h"

#include "util/clock.h"
#include "util/format.h"

#include <QJsonDocument>
#include <QJsonObject>

#include <cerrno>
#include <chrono>
#include <climits>
#include <poll.h>
#include <unistd.h>

namespace idem::cli {

namespace {

// Past this much waiting, the writer is woken before its 100 ms are up.
constexpr qsizetype kWakeBytes = 64 * 1024;

QByteArray droppedNotice(qint64 dropped, bool json)
{
    const QString detail =
        u"%1 log lines dropped: stdout took none while %2 MiB of them waited"_qs.arg(dropped).arg(
            StdoutLog::kBufferBytes / (1 << 20));
    if (json)
        return QJsonDocument(QJsonObject{{u"at"_qs, wallMs()},
                                         {u"dropped_lines"_qs, dropped},
                                         {u"detail"_qs, detail}})
                   .toJson(QJsonDocument::Compact) +
               '\n';
    return (formatTime(wallMs()) + u" idemdesk: "_qs + detail).toUtf8() + '\n';
}

} // namespace

struct StdoutLog::Shared
{
    int fd;
    bool json;
    std::function<void()> onFirstDrop;

    std::mutex lock;
    std::condition_variable wake;     // the writer: lines wait, or finish()
    std::condition_variable progress; // finish(): a slice written, or the writer done
    QByteArray pending;
    bool dropping = false; // from the first drop until the writer takes `pending`: the gap's place
    qint64 dropped = 0;    // not yet told on stdout
    bool everDropped = false;
    qint64 inHandLines = 0; // of the batch being written, not yet written
    quint64 slicesWritten = 0;
    bool closed = false; // EPIPE: nobody will read again
    bool stopping = false;
    bool abandoned = false; // finish() gave up: what is left was said lost
    bool done = false;
};

StdoutLog::StdoutLog(int fd, bool json, std::function<void()> onFirstDrop)
    : m_shared(std::make_shared<Shared>())
{
    m_shared->fd = fd;
    m_shared->json = json;
    m_shared->onFirstDrop = std::move(onFirstDrop);
    m_thread = std::thread([shared = m_shared] {
        // The thread owns `shared` too: when finish() leaves it blocked in write(), nothing it
        // touches afterwards is freed under it.
        Shared &s = *shared;
        for (;;) {
            QByteArray batch;
            {
                std::unique_lock locked(s.lock);
                s.wake.wait_for(locked, std::chrono::milliseconds(100),
                                [&s] { return s.stopping || s.pending.size() >= kWakeBytes; });
                if (s.closed)
                    s.pending.clear();
                if ((s.pending.isEmpty() && s.dropped == 0) || s.closed || s.abandoned) {
                    if (s.stopping || s.abandoned) {
                        s.done = true;
                        s.progress.notify_all();
                        return;
                    }
                    continue;
                }
                batch.swap(s.pending);
                s.dropping = false;
                // Said where the gap is: after the lines that waited, before those that follow.
                if (s.dropped > 0)
                    batch += droppedNotice(std::exchange(s.dropped, 0), s.json);
                s.inHandLines = batch.count('\n');
            }
            // Slices of whole lines, at most PIPE_BUF bytes where lines allow: a pipe takes each
            // whole or not at all, so a reader never sees half a line and the lines left unwritten
            // are counted exactly.
            for (qsizetype at = 0; at < batch.size();) {
                qsizetype end = batch.lastIndexOf('\n', std::min(at + PIPE_BUF, batch.size()) - 1);
                if (end < at)
                    end = batch.indexOf('\n', at);
                end = end < 0 ? batch.size() : end + 1;
                const ssize_t n = ::write(s.fd, batch.constData() + at, size_t(end - at));
                const int error = n < 0 ? errno : 0;
                if (error == EINTR)
                    continue;
                if (error == EAGAIN) { // a descriptor someone else made non-blocking
                    pollfd out{s.fd, POLLOUT, 0};
                    ::poll(&out, 1, -1);
                    continue;
                }
                std::lock_guard locked(s.lock);
                if (n < 0) { // EPIPE (`serve | head`) or a failing file: the lines are gone
                    s.closed = s.closed || error == EPIPE;
                    s.inHandLines = 0;
                    break;
                }
                s.inHandLines -= batch.mid(at, n).count('\n');
                ++s.slicesWritten;
                s.progress.notify_all();
                if (s.abandoned)
                    break;
                at += n;
            }
        }
    });
}

StdoutLog::~StdoutLog()
{
    finish(0);
}

void StdoutLog::append(const QByteArray &line)
{
    Shared &s = *m_shared;
    bool first = false;
    {
        std::lock_guard locked(s.lock);
        if (s.closed || s.stopping)
            return;
        if (s.dropping || s.pending.size() + line.size() > kBufferBytes) {
            s.dropping = true;
            ++s.dropped;
            first = !std::exchange(s.everDropped, true);
        } else {
            const bool wake =
                s.pending.size() < kWakeBytes && s.pending.size() + line.size() >= kWakeBytes;
            s.pending += line;
            if (wake)
                s.wake.notify_one();
        }
    }
    if (first && s.onFirstDrop)
        s.onFirstDrop();
}

qint64 StdoutLog::finish(int idleMs)
{
    if (std::exchange(m_finished, true))
        return 0;
    Shared &s = *m_shared;
    std::unique_lock locked(s.lock);
    s.stopping = true;
    s.wake.notify_one();
    for (quint64 seen = s.slicesWritten; !s.done;) {
        s.progress.wait_for(locked, std::chrono::milliseconds(idleMs),
                            [&s, seen] { return s.done || s.slicesWritten != seen; });
        if (!s.done && s.slicesWritten == seen)
            break; // nothing taken for idleMs
        seen = s.slicesWritten;
    }
    if (s.done) {
        locked.unlock();
        m_thread.join();
        return s.closed ? 0 : s.dropped;
    }
    s.abandoned = true;
    const qint64 lost = s.closed ? 0 : s.inHandLines + s.pending.count('\n') + s.dropped;
    locked.unlock();
    m_thread.detach(); // blocked in write(): it ends with the process
    return lost;
}

} // namespace idem::cli
