// idemdesk migrate: converts a store's records from an earlier version's layout (Redis layouts v1,
// v2) to the current one. Every command does it at start too; this one says so when there was none.
#include "cli/common.h"

#include "store/storefactory.h"

namespace idem::cli {

int migrate(const QStringList &arguments)
{
    QCommandLineParser parser;
    parser.setApplicationDescription(
        u"Converts the store's records from an earlier layout (Redis layouts v1 and v2) to the "
        u"current "
        u"one; every record, "
        "its state, TTL, result and history are kept. Every command does it at start too."_qs);
    addCommonOptions(parser, false);
    if (const int rc = parseOrExit(parser, arguments, 0); rc >= 0)
        return rc;
    auto options = loadCommon(parser);
    if (!options) {
        printError(options.error().message);
        return ExitUsage;
    }
    auto pool = openStorePool(options->storeUrl, 1);
    if (!pool) {
        printError(pool.error().message);
        return ExitRuntime;
    }
    auto migrated =
        (*pool)->run<qint64>([](IdempotencyStore &store) { return store.migrateLayout(true); });
    if (!migrated) {
        printError(migrated.error().message);
        return ExitRuntime;
    }
    printOut(u"%1 records migrated to the current layout (store %2)\n"_qs.arg(*migrated).arg(
        storeDisplay(options->storeUrl)));
    return ExitOk;
}

} // namespace idem::cli
