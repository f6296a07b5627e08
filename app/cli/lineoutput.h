#pragma once

#include <QByteArray>
#include <QString>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace idem::cli {

// Lines to a file descriptor (serve's stdout and stderr), written by a thread of its own so that
// a descriptor nobody reads (`serve | less` paused, a stuck log shipper, journald pushing back,
// `2>&1` into any of them) never stalls a delivery, a store worker or the main thread (signals,
// shutdown). A thread rather than non-blocking writes: O_NONBLOCK belongs to the open file,
// which stdout shares with the shell or the terminal (they would get EAGAIN), and a socket's
// MSG_DONTWAIT has no counterpart for pipes and terminals.
//
// Lines wait in a buffer of at most kBufferBytes, and as much again is being written. Past that,
// or when the descriptor refuses them (a full disk, /dev/full), lines are dropped and counted:
// one line says how many, and why, at the place of the gap once lines are taken again, and
// `onFirstDrop` is called once with the reason, on the thread that appended or the writer's (it
// must not block). A descriptor that is closed (EPIPE: `serve | head`) loses its lines without a
// word, as before.
//
// Thread safety: append() from any thread; finish() from one thread, once. Writes are slices of at
// most PIPE_BUF bytes, all-or-nothing on a pipe, so what finish() says lost is exact there — but
// for the slice the writer is blocked on when finish() gives up: should the reader take it before
// the process ends, the count was over by that slice's lines (4096 bytes at most).
class LineOutput final
{
public:
    // Some 5,000 lines: a second of the bench's top rate, minutes of a webhook's usual one; and
    // memory that stays small however long the stall.
    static constexpr qsizetype kBufferBytes = 1 << 20;

    // `json`: the dropped-lines notice is a JSON object, as the delivery lines are.
    LineOutput(int fd, bool json, std::function<void(const QString &why)> onFirstDrop = {});
    ~LineOutput(); // finish(0) if not finished

    // One line, with its '\n'. Never blocks on the file descriptor. Ignored once finishing.
    void append(const QByteArray &line);
    // The same, without waking the writer for it: wake() does, once the caller's burst of lines is
    // over (serve: once a turn of the receiver thread's loop, where a wake per line cost more
    // than the line itself: a futex wake, a switch to the writer and a write per delivery, when
    // the reader keeps up). Past kWakeBytes waiting, the writer is woken all the same.
    void appendQuietly(const QByteArray &line);
    // Wakes the writer for the lines appendQuietly() left waiting; nothing when none wait.
    void wake();
    static constexpr qsizetype kWakeBytes = 64 * 1024;

    // Writes what waits for at most `ms` in all, then stops the thread (left to block in write()
    // when the descriptor takes nothing: it dies with the process). Returns the number of lines
    // not written: those left then and those dropped and not yet told (0: all written, or the
    // descriptor closed). `why`, when lines are lost: the reason they were dropped (the
    // descriptor refused them, its buffer was full), or empty when the time ran out.
    qint64 finish(int ms, QString *why = nullptr);

private:
    struct Shared;
    void add(const QByteArray &line, bool wakeNow);

    std::shared_ptr<Shared> m_shared;
    std::thread m_thread;
    bool m_finished = false;
};

} // namespace idem::cli
