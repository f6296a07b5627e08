#pragma once

#include <QAbstractEventDispatcher>

#include <atomic>
#include <map>
#include <unordered_map>
#include <vector>

namespace idem {

// The receiver thread's event loop on Linux epoll. Qt 6.4's own dispatchers (GLib's and the
// poll-based one) walk every socket on every wakeup, so a few thousand idle keep-alive
// connections made each delivery several times slower; here a wakeup costs what is ready, and
// restarting a connection's timer costs a log of the timers. Level-triggered, like poll: the
// sockets, timers and posted events of the thread behave as with Qt's dispatchers.
// Per delivery it makes as few system calls as it can (each costs several µs on a virtual
// machine): a change of what a socket is watched for reaches epoll only when the loop is about to
// wait, so a write notifier enabled and disabled again within one turn (a response written at
// once) costs nothing; an event posted by the thread itself needs no wake-up through the eventfd.
class EpollDispatcher final : public QAbstractEventDispatcher
{
    Q_OBJECT
public:
    explicit EpollDispatcher(QObject *parent = nullptr);
    ~EpollDispatcher() override;

    bool processEvents(QEventLoop::ProcessEventsFlags flags) override;
    void registerSocketNotifier(QSocketNotifier *notifier) override;
    void unregisterSocketNotifier(QSocketNotifier *notifier) override;
    void registerTimer(int timerId, qint64 interval, Qt::TimerType timerType, QObject *object) override;
    bool unregisterTimer(int timerId) override;
    bool unregisterTimers(QObject *object) override;
    QList<TimerInfo> registeredTimers(QObject *object) const override;
    int remainingTime(int timerId) override;
    void wakeUp() override;
    void interrupt() override;

private:
    struct Watch
    {
        QSocketNotifier *read = nullptr;
        QSocketNotifier *write = nullptr;
        QSocketNotifier *exception = nullptr;
        quint32 events = 0; // what epoll watches now
    };
    struct Timer
    {
        qint64 intervalMs = 0;
        Qt::TimerType type = Qt::CoarseTimer;
        QObject *object = nullptr;
        std::multimap<qint64, int>::iterator due;
        bool firing = false;
    };
    void update(int fd);
    void applyUpdates(); // the watch changes since the last wait, to epoll
    void schedule(int timerId, Timer &timer, qint64 fromUs);
    bool fireTimers();
    int waitMs() const;

    int m_epoll = -1;
    int m_wakeFd = -1;
    std::atomic<int> m_wakePending{0};
    std::atomic<bool> m_interrupted{false};
    std::atomic<Qt::HANDLE> m_owner{nullptr}; // the thread that runs processEvents()
    bool m_postedByOwner = false;             // an event posted by that thread since its last wait
    std::vector<int> m_dirty;                 // descriptors whose watch changed since the last wait
    std::unordered_map<int, Watch> m_watches;
    std::unordered_map<int, Timer> m_timers;
    std::multimap<qint64, int> m_due; // deadline (monotonic µs) → timer id
};

} // namespace idem
