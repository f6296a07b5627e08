#include "http/epolldispatcher.h"

#include "util/clock.h"

#include <QCoreApplication>
#include <QSocketNotifier>
#include <QThread>

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

namespace idem {

EpollDispatcher::EpollDispatcher(QObject *parent) : QAbstractEventDispatcher(parent)
{
    m_epoll = epoll_create1(EPOLL_CLOEXEC);
    m_wakeFd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (m_epoll < 0 || m_wakeFd < 0)
        qFatal("idemdesk: cannot create the receiver's event loop: %s", strerror(errno));
    epoll_event wake{};
    wake.events = EPOLLIN;
    wake.data.fd = m_wakeFd;
    epoll_ctl(m_epoll, EPOLL_CTL_ADD, m_wakeFd, &wake);
}

EpollDispatcher::~EpollDispatcher()
{
    ::close(m_wakeFd);
    ::close(m_epoll);
}

void EpollDispatcher::registerSocketNotifier(QSocketNotifier *notifier)
{
    const int fd = int(notifier->socket());
    Watch &w = m_watches[fd];
    switch (notifier->type()) {
    case QSocketNotifier::Read: w.read = notifier; break;
    case QSocketNotifier::Write: w.write = notifier; break;
    case QSocketNotifier::Exception: w.exception = notifier; break;
    }
    update(fd);
}

void EpollDispatcher::unregisterSocketNotifier(QSocketNotifier *notifier)
{
    const int fd = int(notifier->socket());
    auto it = m_watches.find(fd);
    if (it == m_watches.end())
        return;
    Watch &w = it->second;
    if (w.read == notifier) w.read = nullptr;
    if (w.write == notifier) w.write = nullptr;
    if (w.exception == notifier) w.exception = nullptr;
    update(fd);
}

void EpollDispatcher::update(int fd)
{
    auto it = m_watches.find(fd);
    const Watch &w = it->second;
    if (w.read || w.write || w.exception) {
        // Applied before the next wait; by then it may be undone (see applyUpdates()).
        m_dirty.push_back(fd);
        return;
    }
    // Nothing watches it any more: it leaves the set now, since it may be closed and its number
    // reused before the next wait. A closed descriptor has left the set by itself (ENOENT/EBADF
    // are expected).
    if (w.events) {
        epoll_event e{};
        epoll_ctl(m_epoll, EPOLL_CTL_DEL, fd, &e);
    }
    m_watches.erase(it);
}

void EpollDispatcher::applyUpdates()
{
    for (const int fd : m_dirty) {
        auto it = m_watches.find(fd);
        if (it == m_watches.end())
            continue; // left the set since
        Watch &w = it->second;
        const quint32 events = (w.read ? quint32(EPOLLIN) : 0u) |
                               (w.write ? quint32(EPOLLOUT) : 0u) |
                               (w.exception ? quint32(EPOLLPRI) : 0u);
        if (events == w.events)
            continue; // changed and changed back, or a repeat
        epoll_event e{};
        e.events = events;
        e.data.fd = fd;
        int rc = epoll_ctl(m_epoll, w.events ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &e);
        if (rc < 0 && errno == ENOENT) // closed and reused while we thought it watched
            rc = epoll_ctl(m_epoll, EPOLL_CTL_ADD, fd, &e);
        else if (rc < 0 && errno == EEXIST)
            rc = epoll_ctl(m_epoll, EPOLL_CTL_MOD, fd, &e);
        if (rc < 0)
            qWarning("idemdesk: cannot watch socket %d: %s", fd, strerror(errno));
        w.events = rc < 0 ? 0 : events;
    }
    m_dirty.clear();
}

void EpollDispatcher::schedule(int timerId, Timer &timer, qint64 fromUs)
{
    timer.due = m_due.emplace(fromUs + timer.intervalMs * 1000, timerId);
}

void EpollDispatcher::registerTimer(int timerId, qint64 interval, Qt::TimerType timerType, QObject *object)
{
    Timer &timer = m_timers[timerId];
    timer.intervalMs = interval;
    timer.type = timerType;
    timer.object = object;
    schedule(timerId, timer, monotonicUs());
}

bool EpollDispatcher::unregisterTimer(int timerId)
{
    auto it = m_timers.find(timerId);
    if (it == m_timers.end())
        return false;
    m_due.erase(it->second.due);
    m_timers.erase(it);
    return true;
}

bool EpollDispatcher::unregisterTimers(QObject *object)
{
    bool any = false;
    for (auto it = m_timers.begin(); it != m_timers.end();) {
        if (it->second.object == object) {
            m_due.erase(it->second.due);
            it = m_timers.erase(it);
            any = true;
        } else {
            ++it;
        }
    }
    return any;
}

QList<QAbstractEventDispatcher::TimerInfo> EpollDispatcher::registeredTimers(QObject *object) const
{
    QList<TimerInfo> list;
    for (const auto &[id, timer] : m_timers)
        if (timer.object == object)
            list.append(TimerInfo(id, int(timer.intervalMs), timer.type));
    return list;
}

int EpollDispatcher::remainingTime(int timerId)
{
    auto it = m_timers.find(timerId);
    if (it == m_timers.end())
        return -1;
    return int(std::max<qint64>(0, (it->second.due->first - monotonicUs() + 999) / 1000));
}

void EpollDispatcher::wakeUp()
{
    if (QThread::currentThreadId() == m_owner.load(std::memory_order_relaxed)) {
        // Posted by the loop's own thread, which is not waiting: it does not wait next either.
        m_postedByOwner = true;
        return;
    }
    if (m_wakePending.exchange(1))
        return; // already on its way
    const quint64 one = 1;
    (void)!::write(m_wakeFd, &one, sizeof one);
}

void EpollDispatcher::interrupt()
{
    m_interrupted = true;
    wakeUp();
}

int EpollDispatcher::waitMs() const
{
    if (m_due.empty())
        return -1;
    const qint64 left = m_due.begin()->first - monotonicUs();
    return left <= 0 ? 0 : int(std::min<qint64>((left + 999) / 1000, 60'000));
}

bool EpollDispatcher::fireTimers()
{
    const qint64 now = monotonicUs();
    std::vector<int> due;
    for (auto it = m_due.begin(); it != m_due.end() && it->first <= now; ++it)
        due.push_back(it->second);
    bool fired = false;
    for (int id : due) {
        auto it = m_timers.find(id);
        if (it == m_timers.end() || it->second.firing)
            continue; // gone, or firing further up the stack (a nested event loop)
        Timer &timer = it->second;
        m_due.erase(timer.due);
        schedule(id, timer, now);
        timer.firing = true;
        QObject *object = timer.object;
        QTimerEvent event(id);
        QCoreApplication::sendEvent(object, &event);
        fired = true;
        if (auto again = m_timers.find(id); again != m_timers.end())
            again->second.firing = false;
    }
    return fired;
}

bool EpollDispatcher::processEvents(QEventLoop::ProcessEventsFlags flags)
{
    m_interrupted = false;
    m_owner.store(QThread::currentThreadId(), std::memory_order_relaxed);
    m_postedByOwner = false;
    Q_EMIT awake();
    QCoreApplication::sendPostedEvents();
    if (m_interrupted)
        return true;

    const bool wait = flags.testFlag(QEventLoop::WaitForMoreEvents) && !m_postedByOwner;
    int timeout = wait ? waitMs() : 0;
    if (flags.testFlag(QEventLoop::X11ExcludeTimers) && wait)
        timeout = -1;
    epoll_event ready[256];
    if (timeout != 0)
        Q_EMIT aboutToBlock();
    if (m_postedByOwner)
        timeout = 0;
    applyUpdates();
    int n = epoll_wait(m_epoll, ready, 256, timeout);
    if (n < 0 && errno != EINTR)
        qWarning("idemdesk: epoll_wait: %s", strerror(errno));
    Q_EMIT awake();
    bool handled = false;
    for (int i = 0; i < n; ++i) {
        const int fd = ready[i].data.fd;
        if (fd == m_wakeFd) {
            // Drain, then allow the next wakeUp() to write: the other order could leave the
            // flag set over an empty eventfd, and every later wakeUp() would be lost. A wakeUp()
            // between the two is not lost: its event was posted before it, and the next call
            // sends posted events before it waits.
            quint64 count;
            (void)!::read(m_wakeFd, &count, sizeof count);
            m_wakePending = 0;
            continue;
        }
        if (flags.testFlag(QEventLoop::ExcludeSocketNotifiers))
            continue;
        const quint32 events = ready[i].events;
        // Each activation may close or re-register sockets: look the notifier up every time.
        auto activate = [&](QSocketNotifier *Watch::*slot) {
            auto it = m_watches.find(fd);
            if (it == m_watches.end())
                return;
            if (QSocketNotifier *notifier = it->second.*slot) {
                QEvent event(QEvent::SockAct);
                QCoreApplication::sendEvent(notifier, &event);
                handled = true;
            }
        };
        if (events & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP))
            activate(&Watch::read);
        if (events & (EPOLLOUT | EPOLLHUP | EPOLLERR))
            activate(&Watch::write);
        if (events & EPOLLPRI)
            activate(&Watch::exception);
    }
    if (!flags.testFlag(QEventLoop::X11ExcludeTimers))
        handled = fireTimers() || handled;
    return handled || n > 0;
}

} // namespace idem
