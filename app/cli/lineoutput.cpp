#include "cli/lineoutput.h"

#include "util/clock.h"
#include "util/format.h"

#include <QJsonDocument>
#include <QJsonObject>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <poll.h>
#include <unistd.h>

namespace idem::cli {

namespace {

QByteArray droppedNotice(qint64 dropped, const QString &why, bool json)
{
    const QString detail = u"%1 log lines dropped: %2"_qs.arg(dropped).arg(why);
    if (json)
        return QJsonDocument(QJsonObject{{u"at"_qs, wallMs()},
                                         {u"dropped_lines"_qs, dropped},
                                         {u"detail"_qs, detail}})
                   .toJson(QJsonDocument::Compact) +
               '\n';
    return (formatTime(wallMs()) + u" idemdesk: "_qs + detail).toUtf8() + '\n';
}

// Why lines were dropped when the buffer was full.
QString notTaken()
{
    return u"none taken while %1 MiB of them waited"_qs.arg(LineOutput::kBufferBytes / (1 << 20));
}

} // namespace

struct LineOutput::Shared
{
    int fd;
    bool json;
    std::function<void(const QString &)> onFirstDrop;

    std::mutex lock;
    std::condition_variable wake; // the writer: lines wait, or finish()
    std::condition_variable over; // finish(): the writer is done
    QByteArray pending;
    bool owed = false;     // the lines waiting are appendQuietly()'s: not taken until a wake
    bool dropping = false; // from the first drop until the writer takes `pending`: the gap's place
    qint64 dropped = 0;    // not yet told
    QString dropReason;    // why the last of them were dropped
    bool everDropped = false;
    qint64 inHandLines = 0; // of the batch being written, not yet written
    qint64 noticeCounts =
        0;                // dropped lines the batch's last line (a notice) tells of, until written
    bool refused = false; // the last write failed (not EPIPE): a stop does not try again
    bool closed = false;  // EPIPE: nobody will read again
    bool stopping = false;
    bool abandoned = false; // finish() gave up: what is left was said lost
    bool done = false;

    // The lines of the batch in hand not written, counting a notice not written as the lines it
    // tells of.
    qint64 unwrittenInHand() const
    {
        return inHandLines + (inHandLines > 0 && noticeCounts > 0 ? noticeCounts - 1 : 0);
    }
    // Under the lock. Whether this was the first drop (onFirstDrop is then due, outside it).
    bool drop(qint64 lines, const QString &why)
    {
        dropped += lines;
        dropReason = why;
        return !std::exchange(everDropped, true);
    }
};

LineOutput::LineOutput(int fd, bool json, std::function<void(const QString &)> onFirstDrop)
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
                // No timed wait: the lines batch themselves while a write is under way, and a
                // clock moved by libfaketime (the skew tests) would hold a timed one for as long.
                s.wake.wait(locked, [&s] {
                    return s.stopping || s.abandoned || s.closed ||
                           (!s.pending.isEmpty() && !s.owed) || (s.dropped > 0 && !s.refused);
                });
                const bool idle = s.pending.isEmpty() && (s.dropped == 0 || s.refused);
                if (s.closed || s.abandoned || (s.stopping && (idle || s.refused))) {
                    if (!s.closed && s.refused) // a stop does not try a refusing descriptor again
                        s.dropped += s.pending.count('\n');
                    s.pending.clear();
                    s.done = true;
                    s.over.notify_all();
                    return;
                }
                if (idle)
                    continue;
                batch.swap(s.pending);
                s.owed = false; // taken: nothing waits
                s.dropping = false;
                // Said where the gap is: after the lines that waited, before those that follow.
                s.noticeCounts = std::exchange(s.dropped, 0);
                if (s.noticeCounts > 0)
                    batch += droppedNotice(s.noticeCounts, s.dropReason, s.json);
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
                std::unique_lock locked(s.lock);
                if (n < 0 && error == EPIPE) { // `serve | head`: the lines are gone, unsaid
                    s.closed = true;
                    s.inHandLines = s.noticeCounts = 0;
                    break;
                }
                if (n < 0) { // refused (a full disk, /dev/full): dropped, told once it takes some
                    const bool first =
                        s.drop(s.unwrittenInHand(),
                               u"refused: %1"_qs.arg(QString::fromLocal8Bit(std::strerror(error))));
                    s.inHandLines = s.noticeCounts = 0;
                    s.refused = true;
                    const QString why = s.dropReason;
                    locked.unlock();
                    if (first && s.onFirstDrop)
                        s.onFirstDrop(why);
                    break;
                }
                s.refused = false;
                s.inHandLines -= batch.mid(at, n).count('\n');
                if (s.inHandLines == 0)
                    s.noticeCounts = 0;
                if (s.abandoned)
                    break;
                at += n; // short of the slice only on a file filling up: the rest goes next
            }
        }
    });
}

LineOutput::~LineOutput()
{
    finish(0);
}

void LineOutput::append(const QByteArray &line)
{
    add(line, true);
}

void LineOutput::appendQuietly(const QByteArray &line)
{
    add(line, false);
}

void LineOutput::add(const QByteArray &line, bool wakeNow)
{
    Shared &s = *m_shared;
    bool first = false;
    {
        std::lock_guard locked(s.lock);
        if (s.closed || s.stopping)
            return;
        if (s.dropping || s.pending.size() + line.size() > kBufferBytes) {
            s.dropping = true;
            first = s.drop(1, notTaken());
        } else {
            if (s.pending.isEmpty()) // else they go with those that wait (woken for, or owed)
                s.owed = true;
            s.pending += line;
            if (s.owed && (wakeNow || s.pending.size() >= kWakeBytes)) {
                s.owed = false;
                s.wake.notify_one();
            }
        }
    }
    if (first && s.onFirstDrop)
        s.onFirstDrop(notTaken());
}

void LineOutput::wake()
{
    Shared &s = *m_shared;
    std::lock_guard locked(s.lock);
    if (std::exchange(s.owed, false))
        s.wake.notify_one();
}

qint64 LineOutput::finish(int ms, QString *why)
{
    if (std::exchange(m_finished, true))
        return 0;
    Shared &s = *m_shared;
    std::unique_lock locked(s.lock);
    s.stopping = true;
    s.wake.notify_one();
    s.over.wait_for(locked, std::chrono::milliseconds(ms), [&s] { return s.done; });
    if (s.done) {
        locked.unlock();
        m_thread.join();
        if (why)
            *why = s.dropReason;
        return s.closed ? 0 : s.dropped;
    }
    if (why)
        why->clear();
    s.abandoned = true;
    const qint64 lost = s.closed ? 0 : s.unwrittenInHand() + s.pending.count('\n') + s.dropped;
    locked.unlock();
    m_thread.detach(); // blocked in write(): it ends with the process
    return lost;
}

} // namespace idem::cli
