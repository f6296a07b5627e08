// idemdesk keys export | import: whole records as JSON Lines, out of one store and into another.
#include "cli/common.h"

#include "store/transfer.h"
#include "util/format.h"
#include "util/privatefile.h"

#include <QFile>

#include <cstdio>

namespace idem::cli {

int keysExport(const QStringList &arguments)
{
    QCommandLineParser parser;
    parser.setApplicationDescription(
        u"Write keys as JSON Lines, one whole record per line: the record (state, TTL, "
        u"fingerprint), the stored "
        "request and result, the history and the delivery timeline. `idemdesk keys import` reads them into any store."_qs);
    addCommonOptions(parser, false);
    parser.addOption({u"state"_qs, u"processing, completed, failed or reset."_qs, u"S"_qs});
    parser.addOption({u"endpoint"_qs, u"Only this endpoint's keys."_qs, u"E"_qs});
    parser.addOption({u"match"_qs, u"Shell glob on the stored key (* ? [...])."_qs, u"GLOB"_qs});
    parser.addOption({u"output"_qs, u"Write to FILE instead of standard output."_qs, u"FILE"_qs});
    parser.addPositionalArgument(u"KEY"_qs, u"Only these keys (then the filters do not apply)."_qs,
                                 u"[KEY...]"_qs);
    if (const int rc = parseOrExit(parser, arguments); rc >= 0)
        return rc;
    KeyQuery filter;
    if (parser.isSet(u"state"_qs)) {
        filter.state = keyStateFromString(parser.value(u"state"_qs));
        if (!filter.state) {
            printError(u"--state must be processing, completed, failed or reset (got '%1')"_qs.arg(
                parser.value(u"state"_qs)));
            return ExitUsage;
        }
    }
    filter.endpoint = parser.value(u"endpoint"_qs);
    filter.glob = parser.value(u"match"_qs);
    // --output: all or nothing, 0600 (PrivateFile).
    PrivateFile file;
    QFile stdOut;
    QIODevice *out = &stdOut;
    if (parser.isSet(u"output"_qs)) {
        if (auto opened = file.open(parser.value(u"output"_qs)); !opened) {
            printError(u"--output "_qs + opened.error().message);
            return ExitUsage;
        }
        out = file.device();
    } else if (!stdOut.open(stdout, QIODevice::WriteOnly)) {
        printError(u"standard output: %1"_qs.arg(stdOut.errorString()));
        return ExitUsage;
    }
    StoreSession session;
    if (const int rc = openSession(parser, session); rc >= 0)
        return rc;
    const QStringList keys = parser.positionalArguments();
    bool writeFailed = false;
    auto report = session.pool->run<ExportReport>([&](IdempotencyStore &store) {
        return exportKeys(store, filter, keys, [&](const QByteArray &line) {
            if (out->write(line + '\n') < 0)
                writeFailed = true;
        });
    });
    if (!report) {
        printError(report.error().message);
        return ExitRuntime; // an --output file is not written
    }
    if (writeFailed) {
        printError(u"writing %1: %2"_qs.arg(
            out == &stdOut ? u"the output"_qs : parser.value(u"output"_qs), out->errorString()));
        return ExitRuntime; // an --output file is not replaced
    }
    if (out != &stdOut) {
        if (auto committed = file.commit(); !committed) {
            printError(u"--output "_qs + committed.error().message);
            return ExitRuntime;
        }
    } else if (!stdOut.flush()) {
        printError(u"writing the output: %1"_qs.arg(stdOut.errorString()));
        return ExitRuntime;
    }
    for (const QString &key : std::as_const(report->missing))
        printError(u"no key %1 in the store"_qs.arg(escapeControls(key)));
    for (const QString &lost : std::as_const(report->incomplete))
        printError(u"not exported: %1 (shared content the store no longer has)"_qs.arg(
            escapeControls(lost)));
    std::fprintf(stderr, "idemdesk: exported %s\n",
                 qPrintable(countOf(report->written, u"key", u"keys")));
    return report->missing.isEmpty() && report->incomplete.isEmpty() ? ExitOk : ExitRuntime;
}

int keysImport(const QStringList &arguments)
{
    QCommandLineParser parser;
    parser.setApplicationDescription(u"Read keys written by `idemdesk keys export` into this "
                                     u"store: state, TTL (what was left of it), history and "
                                     "timeline kept, a new fencing token of this store above the "
                                     "one it had there. A key that "
                                     "exists here is left alone and reported. "
                                     "Exit 1 when a line was refused."_qs);
    addCommonOptions(parser, false);
    parser.addPositionalArgument(u"FILE"_qs, u"JSON Lines to read (default: standard input)."_qs,
                                 u"[FILE]"_qs);
    if (const int rc = parseOrExit(parser, arguments, 1); rc >= 0)
        return rc;
    QFile in;
    const QString path = parser.positionalArguments().value(0);
    const bool opened = !path.isEmpty() && path != u"-"_qs
                            ? (in.setFileName(path), in.open(QIODevice::ReadOnly))
                            : in.open(stdin, QIODevice::ReadOnly);
    if (!opened) {
        printError(u"%1: %2"_qs.arg(path, in.errorString()));
        return ExitUsage;
    }
    StoreSession session;
    if (const int rc = openSession(parser, session); rc >= 0)
        return rc;
    const Config &config = session.options.config;
    auto report =
        session.pool->run<ImportReport>([&](IdempotencyStore &store) -> Result<ImportReport> {
            return importLines(
                store, in, config, [](qint64 number, const Result<ImportedLine> &done) {
                    if (!done)
                        printError(u"line %1 refused: %2"_qs.arg(number).arg(done.error().message));
                    else if (done->verdict == ImportVerdict::Exists)
                        printOut(u"exists   %1 (left alone)\n"_qs.arg(escapeControls(done->key)));
                    else
                        printOut(u"imported %1\n"_qs.arg(escapeControls(done->key)));
                });
        });
    if (!report) { // the pool itself could not run it
        printError(report.error().message);
        return ExitRuntime;
    }
    if (!report->stopped.isEmpty()) {
        printError(report->stopped);
        return ExitRuntime;
    }
    printOut(u"%1 imported, %2 already here, %3 refused\n"_qs
                 .arg(countOf(report->imported, u"key", u"keys"))
                 .arg(report->existing)
                 .arg(report->refused));
    return report->refused ? ExitRuntime : ExitOk;
}

} // namespace idem::cli
