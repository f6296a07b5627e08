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

// serve's log on stdout, written by a thread of its own so that a stdout nobody reads (`serve |
// less` paused, a stuck log shipper, journald pushing back) never stalls a delivery or the main
// thread (signals, shutdown). A thread rather than non-blocking writes: O_NONBLOCK belongs to the
// open file, which stdout shares with the shell or the terminal (they would get EAGAIN), and a
// socket's MSG_DONTWAIT has no counterpart for pipes and terminals.
//
// Lines wait in a buffer of at most kBufferBytes, and as much again is being written. Past that,
// lines are dropped and counted: one line on stdout says how many once it takes lines again (at
// the place of the gap), and `onFirstDrop` is called once, on the thread that appended (it must not
// block: post to another thread). A stdout that is closed (EPIPE: `serve | head`) loses its lines
// without a word, as before.
//
// Thread safety: append() from any thread; finish() from one thread, once. Writes are slices of at
// most PIPE_BUF bytes, all-or-nothing on a pipe, so what finish() says lost is exact there.
class StdoutLog final
{
public:
    // Some 5,000 lines: a second of the bench's top rate, minutes of a webhook's usual one; and
    // memory that stays small however long the stall.
    static constexpr qsizetype kBufferBytes = 1 << 20;

    // `json`: the dropped-lines notice is a JSON object, as the delivery lines are.
    StdoutLog(int fd, bool json, std::function<void()> onFirstDrop);
    ~StdoutLog(); // finish(0) if not finished

    // One line, with its '\n'. Never blocks on the file descriptor.
    void append(const QByteArray &line);

    // Writes what waits while the descriptor takes some of it at least every `idleMs`; then stops
    // the thread (left to block in write() when the descriptor takes nothing: it dies with the
    // process). Returns the number of lines left unwritten (0: all written, or stdout closed).
    qint64 finish(int idleMs);

private:
    struct Shared;
    void run();

    std::shared_ptr<Shared> m_shared;
    std::thread m_thread;
    bool m_finished = false;
};

} // namespace idem::cli
