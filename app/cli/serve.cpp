#include "cli/common.h"
#include "cli/lineoutput.h"

#include "engine/stats.h"
#include "mainwindow.h"
#include "receiver/receiver.h"
#include "settingsdialog.h"
#include "store/storefactory.h"
#include "store/storeurl.h"
#include "util/format.h"

#include "colours.h"

#include <QApplication>
#include <QCommandLineParser>
#include <QDateTime>
#include <QFile>
#include <QJsonDocument>
#include <QMessageBox>
#include <QScopeGuard>
#include <QSettings>
#include <QSocketNotifier>
#include <QTextStream>
#include <QTimer>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <malloc.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>
#include <utility>

namespace idem::cli {

namespace {

int g_signalPipe[2] = {-1, -1};

// serve's stderr while it serves: Qt's warnings, from any thread (the engine's "delivery log not
// written" on the receiver thread), go through it and never block on a stalled descriptor.
std::atomic<LineOutput *> g_errOutput = nullptr;

void toErrOutput(QtMsgType type, const QMessageLogContext &context, const QString &message)
{
    // One line, nothing a terminal acts on (escapeQtMessages).
    const QByteArray line =
        qFormatLogMessage(type, context, escapeControls(message)).toLocal8Bit() + '\n';
    LineOutput *err = g_errOutput.load();
    if (err && type != QtFatalMsg) // a fatal one is said now: the process aborts next
        err->append(line);
    else
        std::fputs(line.constData(), stderr);
}

// At a stop, how long stdout and stderr are given, each, to take what still waits.
constexpr int kStopOutputMs = 2000;

void onSignal(int)
{
    const char byte = 1;
    [[maybe_unused]] ssize_t n = ::write(g_signalPipe[1], &byte, 1);
}

QString logLine(const DeliveryEvent &e, bool json)
{
    // QJsonDocument escapes C0 controls only: the C1 ones (U+009B is a terminal's CSI), bidi
    // controls and U+2028/2029 (line breaks to a JavaScript reader) become \uXXXX as well.
    if (json)
        return escapeControls(
            QString::fromUtf8(QJsonDocument(deliveryToJson(e)).toJson(QJsonDocument::Compact)));
    QString line = u"%1 %2 %3 %4 %5 %6ms"_qs.arg(
        formatTime(e.atMs), e.endpoint.isEmpty() ? u"-"_qs : e.endpoint,
        e.key.isEmpty() ? u"-"_qs : e.key, toString(e.outcome), QString::number(e.status),
        QString::number(double(e.latencyUs) / 1000.0, 'f', 1));
    if (!e.type.isEmpty())
        line += u" type="_qs + e.type;
    if (!e.detail.isEmpty())
        line += u" ("_qs + e.detail + u")"_qs;
    // The detail quotes what the sender chose (an unknown endpoint's decoded path): one line,
    // nothing a terminal would act on.
    return escapeControls(line);
}

// Whether two descriptors are one file (stderr redirected into stdout's pipe: `2>&1 | less`).
bool sameFile(int a, int b)
{
    struct stat sa = {}, sb = {};
    return ::fstat(a, &sa) == 0 && ::fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

// What a burst of deliveries freed is kept by glibc in its arenas (one per thread that
// allocated: the receiver's, the store workers'), not given back: after 10 s of 256 concurrent
// 100 KB deliveries serve held 60-120 MB for as long as it stayed idle, 33-43 MB once trimmed.
// Given back when the receiver goes quiet after a burst (a tick of kTrimTickMs with fewer than
// kTrimQuietDeliveries, after one with more), once, and only when at least kTrimFreeBytes are
// free: never per delivery, and a steady flow, which reuses what it frees, is left alone.
constexpr int kTrimTickMs = 2000;
constexpr qint64 kTrimQuietDeliveries = 10;
constexpr size_t kTrimFreeBytes = 16 << 20;

void returnFreedMemory()
{
#ifdef __GLIBC__
    if (mallinfo2().fordblks >= kTrimFreeBytes)
        malloc_trim(0);
#endif
}

// A network store not reachable at start (Redis or PostgreSQL still starting at boot, or
// restarting) is waited for: exiting left it to a supervisor to start serve again, a container
// runtime after a growing back-off (minutes), long after the store was back. Not listening
// meanwhile: senders get no connection and retry, as they would a 503. Only what passes by
// itself is waited for (no connection, the server starting or loading its data), each try's
// error printed; what the server answers about the URL itself (no such database, a DB index out
// of range, a password refused, TLS not offered) ends serve at once, as any other error does:
// waited for, a mistyped deployment never failed. SIGTERM or Ctrl-C ends the wait.
bool passesByItself(const QString &error)
{
    static const QStringList transient{u"Connection refused"_qs,
                                       u"timed out"_qs,
                                       u"Timeout"_qs,
                                       u"No route to host"_qs,
                                       u"Network is unreachable"_qs,
                                       u"Temporary failure in name resolution"_qs,
                                       u"the database system is starting up"_qs,
                                       u"the database system is shutting down"_qs,
                                       u"the database system is in recovery mode"_qs,
                                       u"LOADING"_qs,
                                       u"Connection reset"_qs,
                                       u"Server closed the connection"_qs,
                                       u"server closed the connection"_qs};
    return std::any_of(transient.cbegin(), transient.cend(),
                       [&error](const QString &t) { return error.contains(t); });
}

Result<std::shared_ptr<StorePool>> openStorePoolWhenReachable(const QString &url)
{
    for (int waitSeconds = 1;; waitSeconds = std::min(waitSeconds * 2, 10)) {
        auto pool = openStorePool(url);
        if (pool || pool.error().code != ErrorCode::Unavailable ||
            StoreUrl::parse(url)->kind == StoreUrl::Kind::Sqlite ||
            !passesByItself(pool.error().message))
            return pool;
        printError(u"%1; waiting for the store: next try in %2 s"_qs.arg(pool.error().message)
                       .arg(waitSeconds));
        std::fflush(stderr);
        std::this_thread::sleep_for(std::chrono::seconds(waitSeconds));
    }
}

} // namespace

int serve(const QStringList &arguments)
{
    QCommandLineParser parser;
    parser.setApplicationDescription(u"Headless webhook receiver: one log line per delivery on stdout."_qs);
    addCommonOptions(parser);
    parser.addOption({u"log-format"_qs, u"text or json."_qs, u"FORMAT"_qs, u"text"_qs});
    if (const int rc = parseOrExit(parser, arguments, 0); rc >= 0)
        return rc;
    const QString format = parser.value(u"log-format"_qs);
    if (format != u"text"_qs && format != u"json"_qs) {
        printError(u"--log-format must be text or json"_qs);
        return 2;
    }
    auto options = loadCommon(parser);
    if (!options) {
        printError(options.error().message);
        return 2;
    }
    // A closed stdout or stderr (`serve | head`, `2>&1 | head`): its writes fail with EPIPE, serve
    // goes on. Ignored before anything is written (the store's wait below writes to stderr).
    std::signal(SIGPIPE, SIG_IGN);
    auto pool = openStorePoolWhenReachable(options->storeUrl);
    if (!pool) {
        printError(pool.error().message);
        return 1;
    }
    if (auto migrated = migrateLayout(**pool); !migrated) {
        printError(migrated.error().message);
        return 1;
    }
    const QString storeDisplay = StoreUrl::parse(options->storeUrl)->display();

    std::unique_ptr<Receiver> receiver;
    auto metrics = startMetrics(*options, receiver);
    if (!metrics) {
        printError(metrics.error().message);
        return 1;
    }
    receiver = std::make_unique<Receiver>(options->config, *pool);

    // From here on serve writes to stdout and stderr only through LineOutput's threads: a
    // descriptor nobody reads (`serve | less` paused, a stuck log shipper, journald pushing back,
    // and `2>&1` into any of them) stalls neither the receiver nor a store worker nor this thread,
    // which handles SIGTERM. Before, the stop's own "stopping" line blocked in a stalled `2>&1`
    // pipe and SIGTERM was never acted on, and a warning of the engine blocked the receiver.
    // One line per delivery, made on the receiver thread as the delivery ends (a direct
    // connection: a queued signal per delivery woke this thread for each one, which cost more
    // than the line itself), its writer woken once a turn of the receiver's loop (below), writing
    // in slices what waits as it comes back for more (no timer): under load the log must not cost
    // more than the delivery. stderr into the same file keeps one writer, and its lines their order
    // among the log's.
    const bool json = format == u"json"_qs;
    const bool stderrIsStdout = sameFile(STDOUT_FILENO, STDERR_FILENO);
    std::shared_ptr<LineOutput> err =
        stderrIsStdout ? nullptr : std::make_shared<LineOutput>(STDERR_FILENO, false);
    auto out = std::make_shared<LineOutput>(STDOUT_FILENO, json, [err](const QString &why) {
        // The first drop is said on stderr, unless stderr is the same stalled file.
        if (err)
            err->append(
                "idemdesk: stdout takes no more log lines (" + why.toUtf8() +
                "): lines are dropped, how many is said on stdout once it takes lines again\n");
    });
    if (!err)
        err = out;
    const auto say = [err](const QString &message) {
        err->append("idemdesk: " + escapeControls(message, true).toUtf8() + '\n');
    };
    g_errOutput = err.get();
    const QtMessageHandler qtMessages = qInstallMessageHandler(toErrOutput);
    // Qt's messages back to Qt's own handler: before `err` finishes (nothing is appended to it
    // then) and, whatever the way out, before it goes.
    const auto restoreQtMessages = [qtMessages] {
        qInstallMessageHandler(qtMessages);
        g_errOutput = nullptr;
    };
    auto restoredAtExit = qScopeGuard(restoreQtMessages);
    // What waits on stderr, written for at most `ms`.
    const auto finishErr = [&err, &restoreQtMessages](int ms) {
        restoreQtMessages();
        return err->finish(ms);
    };
    QObject logContext;
    // The writer woken once a turn of the receiver's loop, for the lines of that turn's
    // deliveries: a wake per line cost a futex wake, a switch to the writer and a write per
    // delivery whenever the reader keeps up (a file, /dev/null, journald), some 10 µs of the
    // desk's CPU per delivery. awake() comes at the start of every turn and after its wait,
    // aboutToBlock() before every wait that may block, all on the receiver thread, where the
    // engine emits delivered(): a delivery that ends in the turn's posted events (a store's answer
    // with nothing to write back: its sender gone) is written before the loop sleeps, not when
    // something next wakes it (never, with no timer due: a clock held by libfaketime).
    QObject::connect(
        receiver->engine(), &IdempotencyEngine::delivered, &logContext,
        [json, out](const DeliveryEvent &e) {
            out->appendQuietly(logLine(e, json).toUtf8() + '\n');
        },
        Qt::DirectConnection);
    for (auto turn : {&QAbstractEventDispatcher::awake, &QAbstractEventDispatcher::aboutToBlock})
        QObject::connect(
            receiver->loop(), turn, &logContext, [out] { out->wake(); }, Qt::DirectConnection);

    auto bound = receiver->start(options->config.listen);
    if (!bound) {
        say(bound.error().message);
        finishErr(kStopOutputMs);
        return 1;
    }
    if (!bound->host.isLoopback())
        say(u"warning: listening on %1, reachable from other machines"_qs.arg(bound->toString()));
    QStringList endpoints;
    for (const auto &e : options->config.endpoints)
        endpoints << e.name;
    say(u"receiving webhooks at http://%1/hooks/{%2} (store %3)"_qs.arg(
        bound->toString(), endpoints.join(u","_qs), storeDisplay));
    for (const QString &warning : configWarnings(options->config))
        say(u"warning: "_qs + warning);
    // What may lose acknowledged records on this store (Redis eviction, no persistence).
    if (auto durability = (*pool)->run<QStringList>([](IdempotencyStore &s) { return s.durabilityWarnings(); }))
        for (const QString &warning : *durability)
            say(u"warning: "_qs + warning);

    QTimer trimTimer;
    trimTimer.setInterval(kTrimTickMs);
    QObject::connect(&trimTimer, &QTimer::timeout, &logContext,
                     [engine = receiver->engine(), seen = qint64(0), busy = false]() mutable {
                         const EngineCounters counters = engine->counters();
                         qint64 total = 0;
                         for (const qint64 n : counters.byOutcome)
                             total += n;
                         const bool quiet =
                             total - std::exchange(seen, total) < kTrimQuietDeliveries;
                         if (quiet && std::exchange(busy, false))
                             returnFreedMemory();
                         busy = busy || !quiet;
                     });
    trimTimer.start();

    // SIGINT / SIGTERM / SIGHUP: stop accepting, let in-flight deliveries finish, exit 0. A hangup
    // (the terminal closed, a session ended) killed serve at once: in-flight keys were left
    // leased to be run again, and the delivery log's last lines were lost.
    if (::socketpair(AF_UNIX, SOCK_STREAM, 0, g_signalPipe) != 0) {
        say(u"cannot set up signal handling"_qs);
        finishErr(kStopOutputMs);
        return 1;
    }
    struct sigaction action = {};
    action.sa_handler = onSignal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGINT, &action, nullptr);
    sigaction(SIGTERM, &action, nullptr);
    // Under nohup a hangup stays ignored, as asked.
    struct sigaction hangup = {};
    if (sigaction(SIGHUP, nullptr, &hangup) == 0 && hangup.sa_handler != SIG_IGN)
        sigaction(SIGHUP, &action, nullptr);
    QSocketNotifier notifier(g_signalPipe[0], QSocketNotifier::Read);
    bool stopping = false;
    QObject::connect(&notifier, &QSocketNotifier::activated, &notifier, [&] {
        char byte;
        [[maybe_unused]] ssize_t n = ::read(g_signalPipe[0], &byte, 1);
        if (std::exchange(stopping, true))
            return;
        QCoreApplication::quit();
        say(u"stopping: no new deliveries, finishing %1 in flight"_qs.arg(
            receiver->engine()->inFlight()));
    });
    const int rc = QCoreApplication::exec();
    if (const qint64 left = receiver->drain(Receiver::drainGraceMs(options->config)))
        say(u"%1 deliveries still in flight after the grace: their keys stay leased until their "
            u"leases end"_qs.arg(left));
    receiver.reset(); // joins the receiver thread and flushes the delivery log to the store
    metrics->reset(); // waits for its count, if one runs
    pool->reset();    // waits for queued store work
    // What still waits, if the descriptors take it within 2 s (in all: a reader taking a line a
    // second does not hold the stop for minutes); what they do not take is said lost, and why.
    if (err != out) {
        QString why;
        if (const qint64 lost = out->finish(kStopOutputMs, &why))
            say(u"%1 log lines lost: stdout %2"_qs.arg(lost).arg(
                why.isEmpty() ? u"did not take them within %1 s"_qs.arg(kStopOutputMs / 1000)
                              : u"dropped them, "_qs + why));
    }
    say(u"stopped"_qs);
    finishErr(kStopOutputMs); // `2>&1`: stdout's lines with stderr's; a count could not be said
    return rc;
}

int gui(int argc, char **argv)
{
    QApplication app(argc, argv);
    // What is left once Qt has taken its own options (-platform, -style, ...) out of argv.
    QStringList arguments = QCoreApplication::arguments();
    if (arguments.size() > 1 && arguments.at(1) == u"gui"_qs)
        arguments.removeAt(1);
    QApplication::setWindowIcon(applicationIcon());
    // The taskbar finds idemdesk.desktop, and its icon, by this name.
    QGuiApplication::setDesktopFileName(u"idemdesk"_qs);
    followDesktopColourScheme(app);
    QCommandLineParser parser;
    parser.setApplicationDescription(u"The dashboard, with the embedded receiver (or attached to a shared store with --no-receiver)."_qs);
    addCommonOptions(parser);
    parser.addOption({u"no-receiver"_qs, u"Attach mode: watch the store (every instance writing to it) without receiving here."_qs});
    if (const int rc = parseOrExit(parser, arguments, 0); rc >= 0)
        return rc;
    // Without --config, the file the settings dialog saved last, if any.
    QStringList effective = arguments;
    QString configPath = parser.value(u"config"_qs);
    if (configPath.isEmpty()) {
        const QString saved = QSettings().value(u"configPath"_qs).toString();
        if (!saved.isEmpty() && QFile::exists(saved)) {
            configPath = saved;
            effective << u"--config"_qs << saved;
            parser.parse(effective);
        }
    }
    auto options = loadCommon(parser);
    if (!options) {
        printError(options.error().message);
        QMessageBox::critical(nullptr, u"Idempotency Desk"_qs, options.error().message);
        return ExitUsage;
    }
    const bool attach = parser.isSet(u"no-receiver"_qs);
    if (attach && parser.isSet(u"metrics-listen"_qs)) {
        printError(
            u"--metrics-listen is for the receiver: it serves no metrics with --no-receiver"_qs);
        return ExitUsage;
    }
    if (attach && options->storeUrl.isEmpty()) {
        printError(u"--no-receiver needs --store URL (the shared store to watch)"_qs);
        return ExitUsage;
    }
    const std::shared_ptr<StorePool> pool =
        openStoreOrAsk(options->config, options->storeUrl, configPath);
    if (!pool)
        return ExitRuntime;
    if (auto migrated = migrateLayout(*pool); !migrated) {
        printError(migrated.error().message);
        QMessageBox::critical(nullptr, u"Idempotency Desk"_qs, migrated.error().message);
        return ExitRuntime;
    }
    std::unique_ptr<Receiver> receiver;
    auto metrics =
        attach ? Result<std::unique_ptr<MetricsServer>>(nullptr) : startMetrics(*options, receiver);
    if (!metrics) {
        printError(metrics.error().message);
        QMessageBox::critical(nullptr, u"Idempotency Desk"_qs, metrics.error().message);
        return ExitRuntime;
    }
    if (!attach) {
        receiver = std::make_unique<Receiver>(options->config, pool);
        auto bound = receiver->start(options->config.listen);
        if (!bound) {
            printError(bound.error().message);
            QMessageBox::critical(nullptr, u"Idempotency Desk"_qs, bound.error().message);
            return ExitRuntime;
        }
    }
    // The window reads through connections of its own: its queries over many keys never
    // queue in front of the receiver's claims.
    auto ownPool = attach ? Result<std::shared_ptr<StorePool>>(pool)
                          : openStorePool(options->storeUrl, 0, PoolUse::Window);
    auto windowPool = ownPool ? *ownPool : pool;
    DeskSession session{options->config, options->storeUrl, configPath, windowPool, receiver.get()};
    MainWindow window(session);
    window.show();
    const int rc = app.exec();
    // No delivery is taken from now on, and those in flight finish before the receiver goes (a
    // processed event left unrecorded would be processed again once its lease ends).
    if (receiver) {
        if (const qint64 inFlight = receiver->engine()->inFlight())
            std::fprintf(stderr, "idemdesk: finishing %lld deliveries in flight\n",
                         static_cast<long long>(inFlight));
        receiver->drain(Receiver::drainGraceMs(options->config));
    }
    return rc;
}

} // namespace idem::cli
