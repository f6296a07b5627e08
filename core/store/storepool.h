#pragma once

#include "store/idempotencystore.h"
#include "store/storelane.h"

#include <QMetaObject>
#include <QObject>
#include <QPointer>

#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace idem {

using StoreFactory = std::function<Result<std::unique_ptr<IdempotencyStore>>()>;
class StorePool;
// Makes a store's own lane for a receiver thread (see StoreLane); `pool` takes its health reports.
using LaneFactory = std::function<std::unique_ptr<StoreLane>(StorePool &pool)>;

struct StoreHealth
{
    bool healthy = true; // the last call's outcome
    QString lastError;
    qint64 lastErrorAtMs = 0;
    qint64 queued = 0;
    // Writes (claims, finishes, operator actions, the delivery log) apart: a store that answers
    // reads but refuses writes (a full disk, Redis out of memory) refuses every new delivery,
    // while the last call — a read — looks healthy.
    QString lastWriteError;
    qint64 lastWriteFailedAtMs = 0;
    bool lastWriteFailed = false;
    // The last write failed, within `windowMs`: not ready (/readyz). Bounded, so a desk a load
    // balancer took out is asked again, and taken back once a write goes through.
    bool writesFailing(qint64 nowMs, qint64 windowMs = 10'000) const
    {
        return lastWriteFailed && nowMs - lastWriteFailedAtMs < windowMs;
    }
    // The calls of the last kRecentSeconds and how many failed: what the window's status bar
    // says. The last call alone flapped between healthy and unavailable on every refresh when a
    // part of the store failed (one Redis Cluster master of three, a lock held now and then).
    static constexpr int kRecentSeconds = 10;
    static constexpr int kLatestSeconds = 3; // of them, the latest
    qint64 recentCalls = 0;
    qint64 recentFailures = 0;
    qint64 latestCalls = 0;
    qint64 latestFailures = 0;
    enum class Verdict { Healthy, Degraded, RefusingWrites, Unavailable };
    // Unavailable: every call of the latest seconds failed (or, none, the last one did);
    // refusing writes: the last write failed, within 10 s (a full disk: every new delivery
    // refused while reads go through); degraded: some recent calls failed.
    Verdict verdict(qint64 nowMs) const
    {
        if (latestCalls > 0 ? latestFailures == latestCalls : !healthy)
            return Verdict::Unavailable;
        if (writesFailing(nowMs))
            return Verdict::RefusingWrites;
        return recentFailures > 0 ? Verdict::Degraded : Verdict::Healthy;
    }
};

// Two pools' health as one: the window's (its reads, the operator's actions) and the receiver's
// (every delivery's claim and finish), which the status bar tells together. Counts add up; the
// last error and the last refused write are the later of the two.
StoreHealth combinedHealth(const StoreHealth &a, const StoreHealth &b);

// A few worker threads, each owning one store connection (a hiredis context, a libpqxx
// connection, a SQLite handle are each used by one thread only). Jobs run in order of arrival
// on whichever worker is free; their results are delivered on the thread of the context object
// given to submit(), and dropped when that object is gone. A worker whose connection failed
// drops it and connects again for its next job, so the pool recovers on its own when the store
// comes back. Thread-safe.
class StorePool final
{
public:
    StorePool(StoreFactory factory, int workers, int maxQueued = 20000);
    ~StorePool(); // finishes queued jobs, then joins the workers

    StorePool(const StorePool &) = delete;
    StorePool &operator=(const StorePool &) = delete;

    // May the job share a transaction with others (group commit, see beginBatch())? Only the
    // short writes on every delivery's path do; reads and operator actions run alone, so that
    // they never hold SQLite's write lock for a batch.
    enum class Batch { Alone, Grouped };
    // Recording what already ran (a finish) comes before new work and is never refused for load:
    // refusing it would have the delivery processed again once its lease ends.
    enum class Priority { Normal, Finish };

    template<typename T>
    void submit(QObject *context, std::function<Result<T>(IdempotencyStore &)> job,
                std::function<void(Result<T>)> done, Batch batch = Batch::Alone,
                Priority priority = Priority::Normal)
    {
        QPointer<QObject> guard(context);
        enqueue([job = std::move(job), done = std::move(done), guard](IdempotencyStore *store,
                                                                       const Error *error) -> Publish {
            auto result = std::make_shared<Result<T>>(store ? job(*store) : Result<T>(*error));
            return [result, done, guard]() {
                if (!guard)
                    return;
                QMetaObject::invokeMethod(
                    guard.data(), [done, result]() { done(std::move(*result)); }, Qt::QueuedConnection);
            };
        }, batch, priority);
    }

    // Blocks the calling thread until the job ran (CLI and tests; never the GUI thread).
    template<typename T>
    Result<T> run(std::function<Result<T>(IdempotencyStore &)> job)
    {
        std::promise<Result<T>> promise;
        auto future = promise.get_future();
        enqueue([&](IdempotencyStore *store, const Error *error) -> Publish {
            auto result = std::make_shared<Result<T>>(store ? job(*store) : Result<T>(*error));
            return [&promise, result]() { promise.set_value(std::move(*result)); };
        });
        return future.get();
    }

    StoreHealth health() const;
    qint64 queued() const;
    // A lane for claim and finish, to be used on the calling thread only: the store's own when it
    // has one (setLaneFactory), else one that hands the calls to this pool with `context`.
    std::unique_ptr<StoreLane> lane(QObject *context);
    void setLaneFactory(LaneFactory factory) { m_laneFactory = std::move(factory); }
    // The outcome of a store call made outside the workers (by a lane).
    void reportHealth(bool healthy, const QString &error = {}, bool write = false);
    // A call that went through but whose write the store refused (a claim answered uncounted,
    // ClaimResult::uncounted), reported after the call's own outcome.
    void reportRefusedWrite(const QString &why);

private:
    // A job runs on a worker and returns how to publish its result: at once, or after its
    // batch committed. A job may run twice: again alone when its batch failed to commit.
    using Publish = std::function<void()>;
    using Job = std::function<Publish(IdempotencyStore *, const Error *)>;
    void enqueue(Job job, Batch batch = Batch::Alone, Priority priority = Priority::Normal);
    void refusedWrite(const QString &why, qint64 nowMs); // m_mutex held
    void workerLoop();

    StoreFactory m_factory;
    int m_maxQueued;
    mutable std::mutex m_mutex;
    std::condition_variable m_wake;
    std::deque<std::pair<Job, Batch>> m_finishes; // taken before m_jobs
    std::deque<std::pair<Job, Batch>> m_jobs;
    bool m_stopping = false;
    std::vector<std::thread> m_workers;
    StoreHealth m_health;
    struct Second
    {
        qint64 at = -1; // monotonic second
        qint64 calls = 0;
        qint64 failures = 0;
    };
    std::array<Second, StoreHealth::kRecentSeconds> m_recent; // by monotonic second, a ring
    LaneFactory m_laneFactory;
};

} // namespace idem
