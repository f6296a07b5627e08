// idemdesk storm: identical, properly signed deliveries at a running receiver.
#include "cli/common.h"

#include "engine/storm.h"
#include "util/format.h"

namespace idem::cli {

int storm(const QStringList &arguments)
{
    QCommandLineParser parser;
    parser.setApplicationDescription(u"Fire N identical, properly signed deliveries per key at a "
                                     u"running receiver and report the outcomes, "
                                     "the latency, and whether every key was processed exactly "
                                     "once (exit 1 if not). The config tells "
                                     "the endpoint's provider and secret."_qs);
    addCommonOptions(parser, false);
    parser.addOption({u"endpoint"_qs, u"The endpoint to deliver to (required)."_qs, u"E"_qs});
    parser.addOption({u"copies"_qs, u"Identical deliveries per key (default 64)."_qs, u"N"_qs, u"64"_qs});
    parser.addOption({u"concurrency"_qs, u"Connections sending at once (default 64)."_qs, u"C"_qs, u"64"_qs});
    parser.addOption({u"keys"_qs, u"Number of distinct events (default 1)."_qs, u"K"_qs, u"1"_qs});
    parser.addOption({u"url"_qs, u"The receiver (default http://<config listen>)."_qs, u"URL"_qs});
    if (const int rc = parseOrExit(parser, arguments, 0); rc >= 0)
        return rc;
    auto number = [&](const QString &name, int max) -> int {
        bool ok = false;
        const int v = parser.value(name).toInt(&ok);
        return ok && v >= 1 && v <= max ? v : -1;
    };
    StormPlan plan;
    plan.copies = number(u"copies"_qs, 100000);
    plan.concurrency = number(u"concurrency"_qs, 1024);
    plan.keys = number(u"keys"_qs, 1000000);
    if (plan.copies < 0 || plan.concurrency < 0 || plan.keys < 0) {
        printError(u"--copies, --concurrency and --keys must be positive numbers (concurrency at most 1024)"_qs);
        return ExitUsage;
    }
    if (!parser.isSet(u"endpoint"_qs)) {
        printError(u"storm needs --endpoint"_qs);
        return ExitUsage;
    }
    auto options = loadCommon(parser);
    if (!options) {
        printError(options.error().message);
        return ExitUsage;
    }
    const EndpointConfig *endpoint = findEndpoint(options->config, parser.value(u"endpoint"_qs));
    if (!endpoint)
        return ExitUsage;
    const auto address = receiverAddress(parser, options->config);
    if (!address)
        return ExitUsage;
    plan.host = address->first;
    plan.port = address->second;

    printOut(u"storm: %1 copies × %2 at http://%3:%4/hooks/%5, concurrency %6\n"_qs.arg(plan.copies)
                 .arg(countOf(plan.keys, u"key", u"keys"), QString::fromLatin1(plan.host)).arg(plan.port).arg(endpoint->name).arg(plan.concurrency));
    const StormReport r = runStorm(plan, *endpoint);
    QStringList outcomes;
    for (size_t i = 0; i < r.outcomes.size(); ++i)
        if (r.outcomes[i])
            outcomes << u"%1 %2"_qs.arg(toString(Outcome(i))).arg(r.outcomes[i]);
    QStringList statuses;
    for (auto it = r.statuses.begin(); it != r.statuses.end(); ++it)
        statuses << StormReport::tally(it.key(), it.value());
    printOut(u"outcomes   %1\n"_qs.arg(outcomes.isEmpty() ? u"none"_qs : outcomes.join(u" · "_qs)));
    printOut(u"status     %1\n"_qs.arg(statuses.join(u" · "_qs)));
    printOut(u"latency    p50 %1 ms · p99 %2 ms · %3 in %4 ms\n"_qs.arg(r.p50Ms, 0, 'f', 2)
                 .arg(r.p99Ms, 0, 'f', 2)
                 .arg(countOf(r.sent, u"delivery", u"deliveries"))
                 .arg(r.elapsedMs));
    if (r.exactlyOnce()) {
        printOut(u"processor  every key processed exactly once (%1 of %2)\n"_qs.arg(r.keysProcessedOnce()).arg(r.keys));
        return ExitOk;
    }
    // A key the store refused (503) was not processed: the guarantee kept under a fault, said so,
    // not "NOT exactly once", which reads as a key processed twice.
    if (!r.keysProcessedTwice()) {
        printOut(u"processor  %1\n"_qs.arg(r.shortOfOnce()));
        return ExitRuntime;
    }
    printOut(u"processor  NOT exactly once: %1 of %2 processed once\n"_qs.arg(r.keysProcessedOnce()).arg(countOf(r.keys, u"key", u"keys")));
    for (auto it = r.processorRuns.begin(); it != r.processorRuns.end(); ++it)
        if (it.value() != 1)
            printOut(u"  %1 processed %2\n"_qs.arg(it.key(), countOf(it.value(), u"time", u"times")));
    return ExitRuntime;
}

} // namespace idem::cli
