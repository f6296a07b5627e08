// idemdesk stats: counts by state and outcome, duplicate ratio per endpoint, store health, warnings.
#include "cli/common.h"

#include "engine/stats.h"
#include "util/clock.h"
#include "util/format.h"

#include <QElapsedTimer>
#include <QJsonArray>
#include <QJsonDocument>

namespace idem::cli {

int stats(const QStringList &arguments)
{
    QCommandLineParser parser;
    parser.setApplicationDescription(u"Counts by state and by outcome, the duplicate ratio per endpoint, store health and warnings."_qs);
    addCommonOptions(parser, false);
    parser.addOption({u"json"_qs, u"As one JSON object."_qs});
    parser.addOption({u"since"_qs, u"Deliveries of the last SECONDS (default 86400)."_qs, u"SECONDS"_qs, u"86400"_qs});
    if (const int rc = parseOrExit(parser, arguments, 0); rc >= 0)
        return rc;
    bool ok = false;
    const qint64 since = parser.value(u"since"_qs).toLongLong(&ok);
    // Ten years at most: beyond, the milliseconds overflowed ("in the last 89887495734d").
    if (!ok || since <= 0 || since > 10LL * 366 * 86400) {
        printError(
            u"--since must be a positive number of seconds, ten years (316224000) at most"_qs);
        return ExitUsage;
    }
    StoreSession session;
    if (const int rc = openSession(parser, session); rc >= 0)
        return rc;
    auto report = session.pool->run<StatsReport>([&](IdempotencyStore &store) {
        return collectStats(store, session.options.config, wallMs() - since * 1000);
    });
    if (!report) {
        printError(report.error().message);
        return ExitRuntime;
    }
    report->store = storeDisplay(session.options.storeUrl);
    if (parser.isSet(u"json"_qs)) {
        printOut(QString::fromUtf8(QJsonDocument(statsToJson(*report)).toJson(QJsonDocument::Indented)));
        return ExitOk;
    }
    printOut(formatStats(*report, since));
    return ExitOk;
}

} // namespace idem::cli
