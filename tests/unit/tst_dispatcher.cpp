// The receiver thread's epoll event loop: posted events from many threads are never lost,
// timers fire in order and can be stopped from their own handler, sockets are served, and
// thousands of idle sockets do not stop it from serving the busy one; events the loop posts to
// itself run without a wake-up, and watch changes deferred to the next wait lose no socket.
#include "http/epolldispatcher.h"

#include <QElapsedTimer>
#include <QTcpServer>
#include <QTcpSocket>
#include <QTest>
#include <QThread>
#include <QTimer>

#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

using namespace idem;

namespace {
// A thread running an EpollDispatcher, and an object living on it.
struct LoopThread
{
    QThread thread;
    QObject *object = new QObject;
    LoopThread()
    {
        thread.setEventDispatcher(new EpollDispatcher);
        object->moveToThread(&thread);
        thread.start();
    }
    ~LoopThread()
    {
        QMetaObject::invokeMethod(object, [o = object] { delete o; }, Qt::BlockingQueuedConnection);
        thread.quit();
        thread.wait();
    }
    template<typename F>
    void run(F f)
    {
        QMetaObject::invokeMethod(object, f, Qt::BlockingQueuedConnection);
    }
};
} // namespace

class TestDispatcher : public QObject
{
    Q_OBJECT
private Q_SLOTS:
    void postedEventsFromManyThreadsAreNeverLost()
    {
        LoopThread loop;
        QVERIFY(dynamic_cast<EpollDispatcher *>(loop.thread.eventDispatcher()));
        std::atomic<int> received{0};
        constexpr int kThreads = 6, kEach = 20000;
        std::vector<std::thread> posters;
        for (int t = 0; t < kThreads; ++t)
            posters.emplace_back([&] {
                for (int i = 0; i < kEach; ++i) {
                    QMetaObject::invokeMethod(loop.object, [&] { ++received; }, Qt::QueuedConnection);
                    // Now and then a pause, so that the loop goes to sleep and is woken again
                    // many times while others post.
                    if (i % 16 == 0)
                        std::this_thread::sleep_for(std::chrono::microseconds(i % 7 * 10));
                }
            });
        for (auto &p : posters)
            p.join();
        // A lost wakeup leaves the loop asleep with events queued: nothing else would wake it.
        QTRY_COMPARE_WITH_TIMEOUT(received.load(), kThreads * kEach, 20'000);
        // And it still wakes for one more, alone.
        QMetaObject::invokeMethod(loop.object, [&] { ++received; }, Qt::QueuedConnection);
        QTRY_COMPARE_WITH_TIMEOUT(received.load(), kThreads * kEach + 1, 5'000);
    }

    void eventsPostedByTheLoopItselfNeverWait()
    {
        // Posted from the loop's own thread, an event wakes nothing: the loop must not go to
        // sleep with it queued (no timer and no socket would wake it here).
        LoopThread loop;
        std::atomic<int> ran{0};
        std::function<void()> next = [&] {
            if (++ran < 10000)
                QMetaObject::invokeMethod(loop.object, next, Qt::QueuedConnection);
        };
        QMetaObject::invokeMethod(loop.object, next, Qt::QueuedConnection);
        QTRY_COMPARE_WITH_TIMEOUT(ran.load(), 10000, 10'000);
    }

    void aSocketClosedAndItsNumberReusedInOneTurnIsWatched()
    {
        // The second connection usually gets the first one's descriptor number: its watch must
        // reach epoll although, for the loop, that number "was" watched already.
        LoopThread loop;
        QTcpServer listener;
        QVERIFY(listener.listen(QHostAddress::LocalHost));
        QTcpSocket *second = nullptr;
        std::atomic<int> echoed{0};
        loop.run([&] {
            auto *first = new QTcpSocket(loop.object);
            first->connectToHost(QHostAddress::LocalHost, listener.serverPort());
            QVERIFY(first->waitForConnected(5000));
            QObject::connect(first, &QTcpSocket::readyRead, first, [] {});
            const qintptr number = first->socketDescriptor();
            delete first;
            second = new QTcpSocket(loop.object);
            second->connectToHost(QHostAddress::LocalHost, listener.serverPort());
            QVERIFY(second->waitForConnected(5000));
            QObject::connect(second, &QTcpSocket::readyRead, second,
                             [&] { echoed += int(second->readAll().size()); });
            qInfo("descriptor %lld, then %lld", qlonglong(number),
                  qlonglong(second->socketDescriptor()));
        });
        QVERIFY(listener.waitForNewConnection(5000));
        QTcpSocket *firstPeer = listener.nextPendingConnection();
        QVERIFY(listener.waitForNewConnection(5000) || listener.hasPendingConnections());
        QTcpSocket *secondPeer = listener.nextPendingConnection();
        QVERIFY(firstPeer && secondPeer);
        secondPeer->write("hello");
        QVERIFY(secondPeer->waitForBytesWritten(5000));
        QTRY_COMPARE_WITH_TIMEOUT(echoed.load(), 5, 5'000);
        loop.run([&] { delete second; });
    }

    void timersFireInOrderAndStop()
    {
        LoopThread loop;
        std::atomic<int> order{0};
        std::atomic<int> first{0}, second{0}, repeats{0};
        std::atomic<bool> stoppedItself{false};
        QTimer *repeating = nullptr;
        loop.run([&] {
            QTimer::singleShot(120, loop.object, [&] { second = ++order; });
            QTimer::singleShot(30, loop.object, [&] { first = ++order; });
            repeating = new QTimer(loop.object);
            repeating->setInterval(10);
            QObject::connect(repeating, &QTimer::timeout, loop.object, [&] {
                if (++repeats == 5) {
                    repeating->stop(); // from its own handler
                    stoppedItself = true;
                }
            });
            repeating->start();
        });
        QTRY_VERIFY_WITH_TIMEOUT(second.load() != 0, 5'000);
        QCOMPARE(first.load(), 1);
        QCOMPARE(second.load(), 2);
        QTRY_VERIFY(stoppedItself.load());
        QTest::qWait(100);
        QCOMPARE(repeats.load(), 5);
        int remaining = -2;
        loop.run([&] {
            auto *t = new QTimer(loop.object);
            t->start(10'000);
            remaining = t->remainingTime();
            delete t;
        });
        QVERIFY2(remaining > 9'000 && remaining <= 10'000, qPrintable(QString::number(remaining)));
    }

    void socketsAreServedBesideThousandsOfIdleOnes()
    {
        LoopThread loop;
        QTcpServer *server = nullptr;
        quint16 port = 0;
        loop.run([&] {
            server = new QTcpServer(loop.object);
            server->setMaxPendingConnections(10000);
            QObject::connect(server, &QTcpServer::newConnection, loop.object, [&] {
                while (QTcpSocket *s = server->nextPendingConnection())
                    QObject::connect(s, &QTcpSocket::readyRead, s, [s] { s->write(s->readAll()); });
            });
            QVERIFY(server->listen(QHostAddress::LocalHost));
            port = server->serverPort();
        });
        std::vector<std::unique_ptr<QTcpSocket>> idle;
        for (int i = 0; i < 1500; ++i) {
            idle.push_back(std::make_unique<QTcpSocket>());
            idle.back()->connectToHost(QHostAddress::LocalHost, port);
            QVERIFY(idle.back()->waitForConnected(5000));
        }
        QTcpSocket busy;
        busy.connectToHost(QHostAddress::LocalHost, port);
        QVERIFY(busy.waitForConnected(5000));
        for (int i = 0; i < 500; ++i) {
            const QByteArray ping = "ping " + QByteArray::number(i);
            busy.write(ping);
            QByteArray echoed;
            while (echoed.size() < ping.size() && busy.waitForReadyRead(5000))
                echoed += busy.readAll();
            QCOMPARE(echoed, ping);
        }
        // An idle one still answers, and closing them all is seen by the server.
        idle.front()->write("late");
        QVERIFY(idle.front()->waitForReadyRead(5000));
        QCOMPARE(idle.front()->readAll(), QByteArray("late"));
        idle.clear();
        int open = -1;
        QTRY_VERIFY_WITH_TIMEOUT((loop.run([&] {
                                      open = 0;
                                      for (auto *s : server->findChildren<QTcpSocket *>())
                                          open += s->state() == QAbstractSocket::ConnectedState;
                                  }),
                                  open == 1),
                                 10'000);
    }
};

QTEST_GUILESS_MAIN(TestDispatcher)
#include "tst_dispatcher.moc"
