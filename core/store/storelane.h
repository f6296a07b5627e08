#pragma once

#include "store/idempotencystore.h"

#include <functional>

namespace idem {

// The two store calls on every delivery's path — claim and finish — made from the receiver
// thread without blocking it; `done` runs later on that same thread. The StorePool's lane hands
// them to its worker threads; Redis has its own lane (RedisLane) that talks to Redis from the
// receiver thread's event loop, with no thread in between.
class StoreLane
{
public:
    virtual ~StoreLane() = default;
    virtual void claim(const ClaimRequest &request, std::function<void(Result<ClaimResult>)> done) = 0;
    virtual void finish(const FinishRequest &request, std::function<void(Result<FinishVerdict>)> done) = 0;
};

} // namespace idem
