#pragma once

#include "store/storepool.h"
#include "store/storeurl.h"

#include <memory>

namespace idem {

// Connections for a store URL; one per worker thread.
StoreFactory storeFactory(const StoreUrl &url);
// What a pool is for: the receiver's deliveries, or the window's reads and operator actions.
enum class PoolUse { Deliveries, Window };
int defaultWorkers(const StoreUrl &url, PoolUse use = PoolUse::Deliveries);
// Parses the URL and checks that the store answers (exit 1 on the command line if not).
Result<std::shared_ptr<StorePool>> openStorePool(const QString &url, int workers = 0,
                                                 PoolUse use = PoolUse::Deliveries);

} // namespace idem
