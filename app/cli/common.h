#pragma once

#include "config/config.h"
#include "metrics/metrics.h"
#include "store/storepool.h"
#include "util/result.h"

#include <QCommandLineParser>
#include <QStringList>

#include <memory>

namespace idem {
class Receiver;
}

namespace idem::cli {

// Exit codes (docs/cli.md#exit-codes).
enum ExitCode { ExitOk = 0, ExitRuntime = 1, ExitUsage = 2 };

// Options shared by every command (docs/cli.md#common-options).
struct CommonOptions
{
    Config config;
    QString storeUrl;
    bool allowRemote = false;
};

void printError(const QString &message);
void printOut(const QString &text);
// Qt's messages (qWarning, from any thread) go to Qt's own handler one line each, controls
// escaped (escapeControls): they quote store errors and what senders wrote, which must neither
// drive the terminal nor forge a log line. main() installs it before any command runs.
void escapeQtMessages();
void addCommonOptions(QCommandLineParser &parser, bool withListen = true);
// Parses `arguments`; on --help prints it and returns ExitOk, on errors ExitUsage; -1: go on.
int parseOrExit(QCommandLineParser &parser, const QStringList &arguments, int maxPositional = -1);
// Loads --config (or the built-in config) and applies --store / --listen; errors are usage
// errors (exit 2).
Result<CommonOptions> loadCommon(const QCommandLineParser &parser);
// Records kept in an earlier version's store layout are converted before anything reads them
// (never ignored), saying so on stderr. Every command that opens a store does it first.
Result<void> migrateLayout(StorePool &pool);
// Connects to the store of the options and migrates it (exit 1 when it cannot be reached).
Result<std::shared_ptr<StorePool>> openStore(const CommonOptions &options, int workers = 2);
QString storeDisplay(const QString &url);
// metrics_listen / --metrics-listen: /metrics on a listener of its own, started before
// `receiver` (its engine counts into the metrics from its first delivery); null when off. It
// reads the store through connections of its own, never the receiver's.
Result<std::unique_ptr<MetricsServer>> startMetrics(const CommonOptions &options,
                                                    const std::unique_ptr<Receiver> &receiver);

struct StoreSession
{
    CommonOptions options;
    std::shared_ptr<StorePool> pool;
};
// Loads the options and connects to their store, printing the one-line error. Returns -1 when
// ready, otherwise the exit code (2 for the options, 1 for the store).
int openSession(const QCommandLineParser &parser, StoreSession &session);

// The config's endpoint `name`, or null after printing which ones there are (storm, send).
const EndpointConfig *findEndpoint(const Config &config, const QString &name);
// --url (default http://<config listen>) as an IPv4 host and port, or nullopt after printing
// why not (storm, send).
std::optional<QPair<QByteArray, quint16>> receiverAddress(const QCommandLineParser &parser,
                                                          const Config &config);

int serve(const QStringList &arguments);
int gui(int argc, char **argv);
int keys(const QStringList &arguments);
int stats(const QStringList &arguments);
int storm(const QStringList &arguments);
int send(const QStringList &arguments);
int keysExport(const QStringList &arguments);
int keysImport(const QStringList &arguments);
int migrate(const QStringList &arguments);

} // namespace idem::cli
