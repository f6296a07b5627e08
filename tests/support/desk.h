#pragma once

#include "receiver/receiver.h"
#include "store/storepool.h"

#include <memory>

namespace idem::test {

// A receiver in this process on a free loopback port, on the store at `storeUrl`.
struct Desk
{
    std::shared_ptr<StorePool> pool;
    std::unique_ptr<Receiver> receiver;
    quint16 port = 0;
};

// `configJson` is a whole config file's text; a bad config or an unreachable store ends the test
// process with the reason (qFatal). On `port` when given (0: any free one).
Desk startDesk(const QByteArray &configJson, const QString &storeUrl, quint16 port = 0);

} // namespace idem::test
