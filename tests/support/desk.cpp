#include "support/desk.h"

#include "store/storefactory.h"

namespace idem::test {

Desk startDesk(const QByteArray &configJson, const QString &storeUrl, quint16 port)
{
    auto config = Config::parse(configJson, QStringLiteral("test"));
    if (!config)
        qFatal("config: %s", qPrintable(config.error().message));
    auto pool = openStorePool(storeUrl);
    if (!pool)
        qFatal("store %s: %s", qPrintable(storeUrl), qPrintable(pool.error().message));
    // As every command does at start: a store of an earlier layout migrated, a new one marked.
    if (auto migrated = (*pool)->run<qint64>([](IdempotencyStore &s) { return s.migrateLayout(); });
        !migrated)
        qFatal("store %s: %s", qPrintable(storeUrl), qPrintable(migrated.error().message));
    Desk desk;
    desk.pool = *pool;
    desk.receiver = std::make_unique<Receiver>(*config, desk.pool);
    ListenAddress any;
    any.port = port;
    auto bound = desk.receiver->start(any);
    if (!bound)
        qFatal("listen: %s", qPrintable(bound.error().message));
    desk.port = bound->port;
    return desk;
}

} // namespace idem::test
