// serve's stdout and stderr writer (LineOutput): every line is written, dropped and told, or said
// lost at the stop, whatever the descriptor does — stalls, takes a little and stalls again, takes
// slowly, or refuses (a full disk) — and a stop waits for it a bounded time in all.
#include "cli/lineoutput.h"

#include <QElapsedTimer>
#include <QRegularExpression>
#include <QScopeGuard>
#include <QTest>
#include <QThread>

#include <atomic>
#include <csignal>
#include <fcntl.h>
#include <poll.h>
#include <thread>
#include <unistd.h>

using namespace idem;
using namespace idem::cli;

namespace {

// A line of about 1000 bytes, numbered.
QByteArray line(int i)
{
    return "line " + QByteArray::number(i) + ' ' + QByteArray(990, 'x') + '\n';
}

// What a reader got: delivery lines, and the dropped lines the notices tell of.
struct Read
{
    QByteArray bytes;
    qint64 lines = 0;
    qint64 told = 0;
    void take(int fd, int quietMs, qint64 atMost = -1)
    {
        pollfd in{fd, POLLIN, 0};
        char chunk[4096];
        while ((atMost < 0 || bytes.size() < atMost) && ::poll(&in, 1, quietMs) == 1) {
            const ssize_t n = ::read(fd, chunk, sizeof chunk);
            if (n <= 0)
                break;
            bytes.append(chunk, n);
        }
        static const QRegularExpression notice(u"(\\d+) log lines dropped"_qs);
        lines = told = 0;
        for (const QByteArray &l : bytes.split('\n'))
            if (const auto m = notice.match(QString::fromUtf8(l)); m.hasMatch())
                told += m.captured(1).toLongLong();
            else if (l.startsWith("line "))
                ++lines;
    }
};

} // namespace

class LineOutputTest : public QObject
{
    Q_OBJECT
private Q_SLOTS:
    void initTestCase()
    {
        std::signal(SIGPIPE, SIG_IGN); // as serve: a reader gone is EPIPE, not the end
    }

    // The reader stalls, takes a little (the writer takes the next batch, whose last line tells of
    // the lines dropped meanwhile) and stalls again; then the stop. The lines that notice told of
    // are said lost with it: read + told + lost adds up to what was sent. (They were counted as
    // one line, the notice's: some 1800 lines unaccounted for.)
    void aNoticeNotWrittenAtTheStopCountsItsLines()
    {
        int pipe[2];
        QVERIFY(::pipe2(pipe, O_CLOEXEC) == 0);
        // The write end stays open: the writer, left blocked by the stop, may still use it.
        auto closePipe = qScopeGuard([&pipe] { ::close(pipe[0]); });
        std::atomic<int> drops = 0;
        LineOutput out(pipe[1], false, [&drops](const QString &) { ++drops; });
        int sent = 0;
        for (; sent < 3000; ++sent) // 3 MB: the pipe (64 KB) and the buffer (1 MiB) full
            out.append(line(sent));
        QCOMPARE(drops.load(), 1);
        Read read;
        // Until the lines of the second batch come: the writer took the buffer and the notice.
        // (The first batch is some 65 lines, the second the ~1000 that waited: stopped early in
        // it.)
        QTRY_VERIFY_WITH_TIMEOUT((read.take(pipe[0], 50, read.bytes.size() + 16 * 1024),
                                  read.bytes.contains("line 200 ")),
                                 20000);
        for (; sent < 3100; ++sent)
            out.append(line(sent));
        const qint64 lost = out.finish(300);
        read.take(pipe[0], 200);
        qInfo("%d sent: %lld read, %lld told dropped, %lld lost", sent, read.lines, read.told,
              lost);
        QVERIFY2(read.told == 0, "the notice was written: the case is not made");
        // The writer, blocked in write() when the stop gave up on it, may yet write that slice
        // (at most PIPE_BUF bytes: up to 4 lines) once read: said lost, read all the same.
        QVERIFY(read.lines + lost >= sent);
        QVERIFY(read.lines + lost <= sent + 4);
    }

    // appendQuietly() leaves the writer asleep until wake() (serve: once a turn of the receiver's
    // loop, not once a delivery), or a plain append(), which takes the quiet lines with it.
    void quietLinesWaitForAWake()
    {
        int pipe[2];
        QVERIFY(::pipe2(pipe, O_CLOEXEC) == 0);
        auto closePipe = qScopeGuard([&pipe] { ::close(pipe[0]); });
        LineOutput out(pipe[1], false);
        for (int i = 0; i < 5; ++i)
            out.appendQuietly(line(i));
        Read read;
        read.take(pipe[0], 300);
        QCOMPARE(read.lines, 0); // woken per line: all 5 here
        out.wake();
        QTRY_VERIFY_WITH_TIMEOUT((read.take(pipe[0], 50), read.lines == 5), 10000);
        out.wake(); // none owed: nothing
        for (int i = 5; i < 8; ++i)
            out.appendQuietly(line(i));
        out.append(line(8));
        QTRY_VERIFY_WITH_TIMEOUT((read.take(pipe[0], 50), read.lines == 9), 10000);
        QCOMPARE(out.finish(2000), 0);
        QVERIFY(read.bytes.contains("line 8 "));
    }

    // Quiet lines past kWakeBytes wake the writer without wake(): a caller that never wakes it
    // (a loop that never turns) loses nothing to the buffer's bound. And a stop writes what
    // waits, woken or not.
    void quietLinesWakeTheWriterPastABound()
    {
        int pipe[2];
        QVERIFY(::pipe2(pipe, O_CLOEXEC) == 0);
        auto closePipe = qScopeGuard([&pipe] { ::close(pipe[0]); });
        LineOutput out(pipe[1], false);
        const int many = int(LineOutput::kWakeBytes / line(0).size()) + 1;
        for (int i = 0; i < many; ++i)
            out.appendQuietly(line(i));
        Read read;
        QTRY_VERIFY_WITH_TIMEOUT((read.take(pipe[0], 50), read.lines == many), 10000);
        for (int i = many; i < many + 3; ++i)
            out.appendQuietly(line(i));
        QCOMPARE(out.finish(2000), 0);
        read.take(pipe[0], 200);
        QCOMPARE(read.lines, many + 3);
    }

    // A reader taking a little now and then: a stop waits 300 ms for it in all, not 300 ms for
    // each slice it takes (it held a stop for minutes: 2 MiB at a few KB a second).
    void aSlowReaderHoldsAStopABoundedTime()
    {
        int pipe[2];
        QVERIFY(::pipe2(pipe, O_CLOEXEC) == 0);
        auto closePipe = qScopeGuard([&pipe] { ::close(pipe[0]); }); // as above
        LineOutput out(pipe[1], false);
        for (int i = 0; i < 1000; ++i)
            out.append(line(i));
        std::atomic<bool> reading = true;
        std::jthread reader([&] {
            char chunk[4096];
            while (reading) {
                if (::read(pipe[0], chunk, sizeof chunk) <= 0)
                    break;
                QThread::msleep(50); // 80 KB a second: the 1 MB takes 12 s
            }
        });
        QThread::msleep(500); // the writer is under way
        QElapsedTimer t;
        t.start();
        const qint64 lost = out.finish(300);
        const qint64 took = t.elapsed();
        reading = false;
        qInfo("stop took %lld ms, %lld lines lost", took, lost);
        QVERIFY(lost > 0);
        QVERIFY2(took < 5000, qPrintable(QString::number(took))); // 12 s before
    }

    // A descriptor that refuses what it is given (a full disk; /dev/full here): the lines are
    // dropped and counted, the first drop is said with the reason, and what was never written is
    // said lost at the stop. (They went without a word, counted nowhere.)
    void refusedLinesAreCountedNotLostInSilence()
    {
        const int full = ::open("/dev/full", O_WRONLY | O_CLOEXEC);
        if (full < 0)
            QSKIP("no /dev/full");
        auto closeFull = qScopeGuard([full] { ::close(full); });
        QString why;
        std::atomic<int> drops = 0;
        LineOutput out(full, false, [&](const QString &reason) {
            if (drops++ == 0)
                why = reason;
        });
        for (int i = 0; i < 100; ++i)
            out.append(line(i));
        QTRY_COMPARE_WITH_TIMEOUT(drops.load(), 1, 5000);
        QVERIFY2(why.contains(u"No space left"_qs), qPrintable(why));
        // More just before the stop: not tried again, counted all the same.
        for (int i = 100; i < 150; ++i)
            out.append(line(i));
        QString lostWhy;
        QCOMPARE(out.finish(2000, &lostWhy), 150);
        QVERIFY2(lostWhy.startsWith(u"refused: "_qs), qPrintable(lostWhy));
    }
};

QTEST_GUILESS_MAIN(LineOutputTest)
#include "tst_lineoutput.moc"
