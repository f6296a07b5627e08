#include "store/storefactory.h"

#include "store/postgresstore.h"
#include "store/redislane.h"
#include "store/redisstore.h"
#include "store/sqlitestore.h"

#include <cstdio>

namespace idem {

StoreFactory storeFactory(const StoreUrl &url)
{
    switch (url.kind) {
    case StoreUrl::Kind::Sqlite:
        return [path = url.path, full = url.synchronousFull]() -> Result<std::unique_ptr<IdempotencyStore>> {
            SqliteOptions options;
            options.synchronousFull = full;
            auto store = SqliteStore::open(path, options);
            if (!store)
                return store.error();
            return std::unique_ptr<IdempotencyStore>(std::move(store.value()));
        };
    case StoreUrl::Kind::Redis:
        return [url]() -> Result<std::unique_ptr<IdempotencyStore>> {
            auto store = RedisStore::connect(url);
            if (!store)
                return store.error();
            return std::unique_ptr<IdempotencyStore>(std::move(store.value()));
        };
    case StoreUrl::Kind::Postgres:
        break;
    }
    return [url]() -> Result<std::unique_ptr<IdempotencyStore>> {
        auto store = PostgresStore::connect(url);
        if (!store)
            return store.error();
        return std::unique_ptr<IdempotencyStore>(std::move(store.value()));
    };
}

int defaultWorkers(const StoreUrl &url, PoolUse use)
{
    // SQLite serialises writers: the receiver's one worker writes the deliveries in batches
    // (group commit) and never waits on a second writer of its own; the window's two read side
    // by side (WAL), a page while a count runs. Redis answers in microseconds: a few connections
    // keep it busy without the context switches of many. PostgreSQL gains from more
    // transactions in flight (its own group commit).
    switch (url.kind) {
    case StoreUrl::Kind::Sqlite: return use == PoolUse::Window ? 2 : 1;
    case StoreUrl::Kind::Redis: return 4;
    case StoreUrl::Kind::Postgres: return 8;
    }
    return 2;
}

Result<std::shared_ptr<StorePool>> openStorePool(const QString &text, int workers, PoolUse use)
{
    auto url = StoreUrl::parse(text);
    if (!url)
        return url.error();
    auto factory = storeFactory(*url);
    // Connect once up front so that a wrong URL fails at start with a clear message.
    auto probe = factory();
    if (!probe)
        return probe.error();
    if (auto ping = (*probe)->ping(); !ping)
        return ping.error();
    // A redis:// URL may point at a node of a Redis Cluster: it is then served as one.
    const auto *redis = dynamic_cast<const RedisStore *>(probe->get());
    const bool cluster = redis && redis->isCluster();
    if (cluster && !url->cluster)
        std::fprintf(
            stderr,
            "idemdesk: %s is a Redis Cluster node: serving the store as a cluster (slot routing)\n",
            qPrintable(url->display()));
    auto pool =
        std::make_shared<StorePool>(factory, workers > 0 ? workers : defaultWorkers(*url, use));
    // The Redis lane pipelines claims and finishes from the receiver thread; with wait_replicas
    // every write waits for its replicas (WAIT blocks the connection), so the pool's workers
    // make those calls instead, as they do on a cluster (the lane speaks to one node).
    if (url->kind == StoreUrl::Kind::Redis && url->waitReplicas == 0 && !cluster)
        pool->setLaneFactory([url = *url](StorePool &health) -> std::unique_ptr<StoreLane> {
            return std::make_unique<RedisLane>(url, RedisOptions{}, health);
        });
    return pool;
}

} // namespace idem
