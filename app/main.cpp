#include "cli/common.h"
#include "util/version.h"

#include <QCoreApplication>

#include <cstdio>

#include <sys/resource.h>

namespace {

const char kUsage[] =
    "Usage: idemdesk [COMMAND] [OPTIONS]\n"
    "\n"
    "Receives webhooks, processes each event once however often it is delivered, and shows\n"
    "every idempotency key with its state, TTL and stored result.\n"
    "\n"
    "Commands:\n"
    "  gui     dashboard with the embedded receiver (the default)\n"
    "  serve   headless receiver, one log line per delivery\n"
    "  keys    list | show | reset | retry | delete | purge-expired | export | import\n"
    "  stats   counts by state and outcome, duplicate ratio, store health\n"
    "  storm   fire identical signed deliveries at a running receiver\n"
    "  send    one test event from a provider's template, signed as the provider signs\n"
    "  migrate convert a store's records from an earlier layout (also done at every start)\n"
    "\n"
    "Common options: --config FILE, --store URL, --listen HOST:PORT. `idemdesk COMMAND --help`\n"
    "describes a command. `idemdesk --version` prints the version and the libraries in use.\n"
    "\n"
    "Exit codes: 0 ok, 1 runtime failure (store unreachable, port taken), 2 usage or config "
    "error.\n";

} // namespace

int main(int argc, char **argv)
{
    QCoreApplication::setApplicationName(QStringLiteral("idemdesk"));
    idem::cli::escapeQtMessages();
    // The open-file limit's soft value up to its hard one, as systemd services and Go programs
    // do: a shell's 1024 would cap the receiver near 450 connections (receiver.h).
    if (rlimit files{}; getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
        files.rlim_cur = files.rlim_max;
        setrlimit(RLIMIT_NOFILE, &files);
    }
    QStringList arguments;
    for (int i = 0; i < argc; ++i)
        arguments << QString::fromLocal8Bit(argv[i]);
    const QString command = arguments.size() > 1 ? arguments.at(1) : QString();

    // `idemdesk serve --version` too: whatever the command, the same report.
    if (command == u"--version" || command == u"-V" || command == u"version" ||
        arguments.contains(QStringLiteral("--version"))) {
        std::fputs(idem::versionReport().toUtf8().constData(), stdout);
        return 0;
    }
    if (command == u"--help" || command == u"-h" || command == u"help") {
        std::fputs(kUsage, stdout);
        return 0;
    }
    if (command.isEmpty() || command.startsWith(u'-'))
        return idem::cli::gui(argc, argv);
    arguments.removeAt(1);
    if (command == u"gui")
        return idem::cli::gui(argc, argv);
    // Headless: Qt's own poll-based event loop rather than GLib's, which costs more per wakeup
    // and has nothing to integrate with here (about a tenth more deliveries per second).
    if (!qEnvironmentVariableIsSet("QT_NO_GLIB"))
        qputenv("QT_NO_GLIB", "1");
    QCoreApplication app(argc, argv);
    if (command == u"serve")
        return idem::cli::serve(arguments);
    if (command == u"keys")
        return idem::cli::keys(arguments);
    if (command == u"stats")
        return idem::cli::stats(arguments);
    if (command == u"storm")
        return idem::cli::storm(arguments);
    if (command == u"send")
        return idem::cli::send(arguments);
    if (command == u"migrate")
        return idem::cli::migrate(arguments);
    idem::cli::printError(QStringLiteral("unknown command '%1'").arg(command));
    std::fputs(kUsage, stderr);
    return 2;
}
