#include "store/storepool.h"

#include "metrics/metrics.h"
#include "util/clock.h"

#include <QDateTime>

#include <future>

namespace idem {

namespace {
// Why the store refused to count a claim answered all the same (ClaimResult::uncounted).
QString uncounted(const Result<ClaimResult> &r)
{
    return r ? r->uncounted : QString();
}
QString uncounted(const Result<QList<ClaimResult>> &results)
{
    if (results)
        for (const ClaimResult &r : *results)
            if (!r.uncounted.isEmpty())
                return r.uncounted;
    return {};
}
template<typename R>
QString uncounted(const R &)
{
    return {};
}

// Sees every failed call of a worker's connection, so the worker can drop it and reconnect.
struct StoreWatch final : IdempotencyStore
{
    IdempotencyStore &inner;
    bool &failed;
    QString &failure;
    StorePool &pool; // told each call's outcome
    StoreWatch(IdempotencyStore &s, bool &f, QString &m, StorePool &p)
        : inner(s), failed(f), failure(m), pool(p)
    {}
    template<typename R>
    R seen(R r, bool write = false)
    {
        const bool storeFailed = !r && (r.error().code == ErrorCode::Unavailable || r.error().code == ErrorCode::InDoubt);
        if (storeFailed) {
            failed = true;
            failure = r.error().message;
        }
        // Health is known before the caller sees the result. An internal error (a SQLite file no
        // longer at its path) is unhealthy too, but connecting again would not mend it.
        const bool unhealthy = storeFailed || (!r && r.error().code == ErrorCode::Internal);
        pool.reportHealth(!unhealthy, unhealthy ? r.error().message : QString(), write);
        if (const QString refused = uncounted(r); !refused.isEmpty())
            pool.reportRefusedWrite(refused);
        return r;
    }
    Result<ClaimResult> claim(const ClaimRequest &q) override { return seen(inner.claim(q), true); }
    Result<FinishVerdict> finish(const FinishRequest &q) override { return seen(inner.finish(q), true); }
    Result<QList<ClaimResult>> claimBatch(const QList<ClaimRequest> &q) override { return seen(inner.claimBatch(q), true); }
    Result<QList<FinishVerdict>> finishBatch(const QList<FinishRequest> &q) override { return seen(inner.finishBatch(q), true); }
    Result<std::optional<KeyRecord>> key(const QString &k) override { return seen(inner.key(k)); }
    Result<QList<KeyRecord>> listKeys(const KeyQuery &q) override { return seen(inner.listKeys(q)); }
    Result<KeyPage> findKeys(const KeyQuery &q) override { return seen(inner.findKeys(q)); }
    Result<QStringList> keyNames(const KeyQuery &q) override { return seen(inner.keyNames(q)); }
    Result<StateCounts> countKeys(const QString &e) override { return seen(inner.countKeys(e)); }
    Result<OperatorVerdict> applyOperator(const QString &k, OperatorAction a, bool f, const QString &d) override
    {
        return seen(inner.applyOperator(k, a, f, d), true);
    }
    Result<qint64> purgeExpired() override { return seen(inner.purgeExpired()); }
    Result<ImportVerdict> importRecord(const KeyRecord &r, qint64 ttl, qint64 lease) override
    {
        return seen(inner.importRecord(r, ttl, lease), true);
    }
    Result<QString> serverVersion() override { return seen(inner.serverVersion()); }
    Result<qint64> migrateLayout(bool confirmed) override
    {
        return seen(inner.migrateLayout(confirmed));
    }
    Result<qint64> clockMs() override { return seen(inner.clockMs()); }
    Result<QStringList> durabilityWarnings() override { return seen(inner.durabilityWarnings()); }
    Result<void> appendDeliveries(const QList<DeliveryEvent> &e) override { return seen(inner.appendDeliveries(e), true); }
    Result<QList<DeliveryEvent>> deliveries(const DeliveryQuery &q) override { return seen(inner.deliveries(q)); }
    Result<void> ping() override { return seen(inner.ping()); }
    Result<void> ready() override { return seen(inner.ready()); }
    bool deliveriesIndexedByKey() const override { return inner.deliveriesIndexedByKey(); }
    bool batches() const override { return inner.batches(); }
    bool beginBatch() override { return inner.beginBatch(); }
    Result<void> endBatch() override { return seen(inner.endBatch(), true); }
};

constexpr size_t kMaxBatch = 64;
} // namespace

StorePool::StorePool(StoreFactory factory, int workers, int maxQueued)
    : m_factory(std::move(factory)), m_maxQueued(maxQueued)
{
    for (int i = 0; i < std::max(1, workers); ++i)
        m_workers.emplace_back([this] { workerLoop(); });
}

StorePool::~StorePool()
{
    {
        std::lock_guard lock(m_mutex);
        m_stopping = true;
    }
    m_wake.notify_all();
    for (auto &worker : m_workers)
        worker.join();
}

void StorePool::enqueue(Job job, Batch batch, Priority priority)
{
    {
        std::unique_lock lock(m_mutex);
        // Back-pressure: a store that cannot keep up refuses new work at once (503) instead of
        // queueing deliveries until the senders time out. Finishes are never refused for load.
        if (!m_stopping && priority == Priority::Finish) {
            m_finishes.emplace_back(std::move(job), batch);
            lock.unlock();
            m_wake.notify_one();
            return;
        }
        if (!m_stopping && qint64(m_jobs.size()) < m_maxQueued) {
            m_jobs.emplace_back(std::move(job), batch);
            lock.unlock();
            m_wake.notify_one();
            return;
        }
    }
    const Error busy = makeError(ErrorCode::Unavailable,
                                 m_stopping ? u"the store is shutting down"_qs
                                            : u"the store is overloaded (%1 operations queued)"_qs.arg(m_maxQueued));
    job(nullptr, &busy)();
}

void StorePool::workerLoop()
{
    std::unique_ptr<IdempotencyStore> store;
    for (;;) {
        std::vector<Job> jobs;
        {
            std::unique_lock lock(m_mutex);
            m_wake.wait(lock, [this] { return m_stopping || !m_jobs.empty() || !m_finishes.empty(); });
            if (m_jobs.empty() && m_finishes.empty())
                return; // stopping and drained
            // Finishes first. A store with group commit takes the groupable jobs waiting in a row,
            // up to a batch; otherwise one job, leaving the rest to the other workers.
            auto next = [this]() -> std::deque<std::pair<Job, Batch>> * {
                return !m_finishes.empty() ? &m_finishes : !m_jobs.empty() ? &m_jobs : nullptr;
            };
            const bool grouping = store && store->batches() && next()->front().second == Batch::Grouped;
            do {
                auto *queue = next();
                jobs.push_back(std::move(queue->front().first));
                queue->pop_front();
            } while (grouping && next() && next()->front().second == Batch::Grouped && jobs.size() < kMaxBatch);
        }
        std::optional<Error> connectError;
        if (store && store->connectionDropped())
            store.reset();
        if (!store) {
            auto created = m_factory();
            if (created)
                store = std::move(created.value());
            else
                connectError = created.error();
        }
        if (!store) {
            reportHealth(false, connectError->message);
            for (Job &job : jobs)
                job(nullptr, &*connectError)();
            continue;
        }
        // Wrap the store so that a failed call is seen: the connection is then dropped and made
        // again for the next job.
        bool failed = false;
        QString failure;
        StoreWatch watch(*store, failed, failure, *this);
        const bool batch = jobs.size() > 1 && watch.beginBatch();
        std::vector<Publish> held;
        for (Job &job : jobs) {
            Publish publish = job(&watch, nullptr);
            if (batch)
                held.push_back(std::move(publish));
            else
                publish();
        }
        // A batch whose commit failed did not happen (SQLite rolls a failed COMMIT back): each
        // of its jobs runs again alone, and gets its own answer — one write the store refuses (a
        // new key on a full disk) then fails its own delivery only, and a duplicate is still
        // answered (IdempotencyStore::answerUnwritten). Had the commit gone through after all,
        // running again is still safe: a claim finds its key taken (in progress), a finish its
        // result stored (Repeated).
        if (batch && !watch.endBatch()) {
            held.clear();
            for (Job &job : jobs)
                job(&watch, nullptr)();
        }
        for (Publish &publish : held)
            publish();
        if (failed)
            store.reset(); // connect again for the next job
    }
}

void StorePool::reportHealth(bool healthy, const QString &error, bool write)
{
    if (Metrics *metrics =
            Metrics::instance()) // every call to the store, the lanes' too, reports here
        metrics->storeCall(healthy);
    const qint64 second =
        monotonicUs() / 1'000'000; // a clock that steps (NTP, faketime) moves no call
    std::lock_guard lock(m_mutex);
    Second &recent = m_recent[size_t(second % StoreHealth::kRecentSeconds)];
    if (recent.at != second)
        recent = {second, 0, 0};
    ++recent.calls;
    recent.failures += healthy ? 0 : 1;
    const qint64 now = QDateTime::currentMSecsSinceEpoch();
    m_health.healthy = healthy;
    if (!healthy) {
        m_health.lastError = error;
        m_health.lastErrorAtMs = now;
    }
    if (write && healthy)
        m_health.lastWriteFailed = false;
    else if (write)
        refusedWrite(error, now);
}

StoreHealth combinedHealth(const StoreHealth &a, const StoreHealth &b)
{
    StoreHealth h = a;
    h.healthy = a.healthy && b.healthy;
    if (b.lastErrorAtMs > a.lastErrorAtMs) {
        h.lastError = b.lastError;
        h.lastErrorAtMs = b.lastErrorAtMs;
    }
    if (b.lastWriteFailed &&
        (!a.lastWriteFailed || b.lastWriteFailedAtMs > a.lastWriteFailedAtMs)) {
        h.lastWriteFailed = true;
        h.lastWriteError = b.lastWriteError;
        h.lastWriteFailedAtMs = b.lastWriteFailedAtMs;
    }
    h.queued += b.queued;
    h.recentCalls += b.recentCalls;
    h.recentFailures += b.recentFailures;
    h.latestCalls += b.latestCalls;
    h.latestFailures += b.latestFailures;
    return h;
}

void StorePool::reportRefusedWrite(const QString &why)
{
    std::lock_guard lock(m_mutex);
    refusedWrite(why, QDateTime::currentMSecsSinceEpoch());
}

void StorePool::refusedWrite(const QString &why, qint64 nowMs)
{
    m_health.lastWriteFailed = true;
    m_health.lastWriteError = why;
    m_health.lastWriteFailedAtMs = nowMs;
}

namespace {
class PoolLane final : public StoreLane
{
public:
    PoolLane(StorePool &pool, QObject *context) : m_pool(pool), m_context(context) {}
    void claim(const ClaimRequest &request, std::function<void(Result<ClaimResult>)> done) override
    {
        m_pool.submit<ClaimResult>(
            m_context, [request](IdempotencyStore &store) { return store.claim(request); }, std::move(done),
            StorePool::Batch::Grouped);
    }
    void finish(const FinishRequest &request, std::function<void(Result<FinishVerdict>)> done) override
    {
        m_pool.submit<FinishVerdict>(
            m_context, [request](IdempotencyStore &store) { return store.finish(request); }, std::move(done),
            StorePool::Batch::Grouped, StorePool::Priority::Finish);
    }

private:
    StorePool &m_pool;
    QObject *m_context;
};
} // namespace

std::unique_ptr<StoreLane> StorePool::lane(QObject *context)
{
    if (m_laneFactory)
        return m_laneFactory(*this);
    return std::make_unique<PoolLane>(*this, context);
}

StoreHealth StorePool::health() const
{
    const qint64 second = monotonicUs() / 1'000'000;
    std::lock_guard lock(m_mutex);
    StoreHealth h = m_health;
    h.queued = qint64(m_jobs.size() + m_finishes.size());
    for (const Second &recent : m_recent) {
        if (recent.at > second - StoreHealth::kRecentSeconds) {
            h.recentCalls += recent.calls;
            h.recentFailures += recent.failures;
        }
        if (recent.at > second - StoreHealth::kLatestSeconds) {
            h.latestCalls += recent.calls;
            h.latestFailures += recent.failures;
        }
    }
    return h;
}

qint64 StorePool::queued() const
{
    std::lock_guard lock(m_mutex);
    return qint64(m_jobs.size() + m_finishes.size());
}

} // namespace idem
