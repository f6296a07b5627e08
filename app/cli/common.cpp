#include "cli/common.h"

#include <QHostAddress>
#include <QUrl>

#include "engine/stats.h"
#include "receiver/receiver.h"
#include "store/storefactory.h"
#include "store/storeurl.h"
#include "util/format.h"

#include <cstdio>

namespace idem::cli {

// Both carry what senders and stores wrote (paths, bodies, error texts): escaped for the
// terminal, line breaks kept (JSON output is unchanged by it: it has no raw control characters).
void printError(const QString &message)
{
    std::fprintf(stderr, "idemdesk: %s\n", escapeControls(message, true).toUtf8().constData());
}

void printOut(const QString &text)
{
    std::fputs(escapeControls(text, true).toUtf8().constData(), stdout);
}

namespace {
QtMessageHandler g_qtMessages = nullptr;

void escapedQtMessage(QtMsgType type, const QMessageLogContext &context, const QString &message)
{
    g_qtMessages(type, context, escapeControls(message));
}
} // namespace

void escapeQtMessages()
{
    g_qtMessages = qInstallMessageHandler(escapedQtMessage);
}

void addCommonOptions(QCommandLineParser &parser, bool withListen)
{
    parser.addHelpOption();
    parser.addOption(
        {u"config"_qs, u"JSON config file (endpoints, store, listen)."_qs, u"FILE"_qs});
    parser.addOption(
        {u"store"_qs,
         u"Store URL: sqlite:PATH, redis://host:port[/db], redis-cluster://host:port[,host:port...], postgresql://user@host:port/db."_qs,
         u"URL"_qs});
    if (withListen) {
        parser.addOption({u"listen"_qs, u"Address to receive webhooks on (default 127.0.0.1:8787)."_qs, u"HOST:PORT"_qs});
        parser.addOption(
            {u"metrics-listen"_qs,
             u"Serve Prometheus metrics at http://HOST:PORT/metrics (default: off, or metrics_listen)."_qs,
             u"HOST:PORT"_qs});
        parser.addOption({u"allow-remote"_qs,
                          u"Allow --listen and --metrics-listen on a non-loopback address."_qs});
        parser.addOption({u"allow-unsigned"_qs,
                          u"With --allow-remote: allow endpoints that verify no signature."_qs});
    }
}

int parseOrExit(QCommandLineParser &parser, const QStringList &arguments, int maxPositional)
{
    if (!parser.parse(arguments)) {
        printError(parser.errorText());
        return ExitUsage;
    }
    if (parser.isSet(u"help"_qs)) {
        printOut(parser.helpText());
        return ExitOk;
    }
    if (maxPositional >= 0 && parser.positionalArguments().size() > maxPositional) {
        printError(u"unexpected argument '%1' (see --help)"_qs.arg(
            parser.positionalArguments().at(maxPositional)));
        return ExitUsage;
    }
    return -1;
}

Result<CommonOptions> loadCommon(const QCommandLineParser &parser)
{
    CommonOptions options;
    const QString configPath = parser.value(u"config"_qs);
    if (!configPath.isEmpty()) {
        auto config = Config::load(configPath);
        if (!config)
            return config.error();
        options.config = *config;
    } else {
        options.config = Config::builtin();
    }
    const QString store = parser.value(u"store"_qs);
    options.storeUrl = !store.isEmpty() ? store : options.config.store;
    if (auto url = StoreUrl::parse(options.storeUrl); !url)
        return url.error();
    // Only serve and gui know --listen; for them a non-loopback address needs --allow-remote,
    // whether it comes from the command line or the config.
    const bool listens = parser.helpText().contains(u"--listen"_qs);
    const QString listen = listens ? parser.value(u"listen"_qs) : QString();
    options.allowRemote = listens && parser.isSet(u"allow-remote"_qs);
    if (!listen.isEmpty()) {
        auto address = ListenAddress::parse(listen);
        if (!address)
            return makeError(ErrorCode::Invalid, u"--listen %1"_qs.arg(address.error().message));
        options.config.listen = *address;
    }
    for (const QString &option : {u"listen"_qs, u"metrics-listen"_qs})
        if (listens && parser.isSet(option) && parser.value(option).isEmpty())
            return makeError(
                ErrorCode::Invalid,
                u"--%1 needs HOST:PORT (leave the option out for the default)"_qs.arg(option));
    const QString metricsListen = listens ? parser.value(u"metrics-listen"_qs) : QString();
    if (!metricsListen.isEmpty()) {
        auto address = ListenAddress::parse(metricsListen);
        if (!address)
            return makeError(ErrorCode::Invalid,
                             u"--metrics-listen %1"_qs.arg(address.error().message));
        options.config.metricsListen = *address;
    }
    if (listens && options.config.metricsListen) {
        const ListenAddress &metrics = *options.config.metricsListen;
        const ListenAddress &webhooks = options.config.listen;
        if (metrics.port != 0 && metrics.port == webhooks.port) // whatever the hosts
            return makeError(
                ErrorCode::Invalid,
                u"metrics are never served on the webhook listener's port (%1): give them another port"_qs
                    .arg(webhooks.port));
        if (!metrics.host.isLoopback() && !options.allowRemote)
            return makeError(
                ErrorCode::Invalid,
                u"refusing to serve metrics on %1, which is not a loopback address: add --allow-remote if you mean it"_qs
                    .arg(metrics.toString()));
    }
    if (listens && !options.config.listen.host.isLoopback()) {
        if (!options.allowRemote)
            return makeError(
                ErrorCode::Invalid,
                u"refusing to listen on %1, which is not a loopback address: add --allow-remote if you mean it"_qs
                    .arg(options.config.listen.toString()));
        // Reachable from the network, an endpoint without a secret lets anyone make the
        // downstream act: only when the operator says so.
        QStringList unsigned_;
        for (const EndpointConfig &e : options.config.endpoints)
            if (!verifiesSignatures(e))
                unsigned_ << e.name;
        if (!unsigned_.isEmpty() && !parser.isSet(u"allow-unsigned"_qs))
            return makeError(
                ErrorCode::Invalid,
                u"refusing to listen on %1 with endpoints that verify no signature (%2): give them a secret, or add --allow-unsigned if you mean it"_qs
                    .arg(options.config.listen.toString(), unsigned_.join(u", "_qs)));
    }
    return options;
}

Result<void> migrateLayout(StorePool &pool)
{
    auto migrated = pool.run<qint64>([](IdempotencyStore &store) { return store.migrateLayout(); });
    if (!migrated) {
        // A layout the desk cannot take now (records of layout v1 on a cluster, layout v2 still
        // written by a desk of the previous version, another desk migrating) is a Conflict, and the
        // store's message says which. Anything else is the store failing to answer (a master down:
        // CLUSTERDOWN), not a statement about its records.
        if (migrated.error().code == ErrorCode::Conflict)
            return migrated.error();
        return makeError(
            migrated.error().code,
            u"cannot check or convert the store's layout: %1"_qs.arg(migrated.error().message));
    }
    if (*migrated > 0)
        printError(
            u"the store held %1 records in an earlier layout (Redis layout v1 or v2): migrated to the current one (v3)"_qs
                .arg(*migrated));
    return {};
}

Result<std::shared_ptr<StorePool>> openStore(const CommonOptions &options, int workers)
{
    auto pool = openStorePool(options.storeUrl, workers);
    if (!pool)
        return pool;
    if (auto migrated = migrateLayout(**pool); !migrated)
        return migrated.error();
    return pool;
}

int openSession(const QCommandLineParser &parser, StoreSession &session)
{
    auto options = loadCommon(parser);
    if (!options) {
        printError(options.error().message);
        return ExitUsage;
    }
    auto pool = openStore(*options);
    if (!pool) {
        printError(pool.error().message);
        return ExitRuntime;
    }
    session = {*options, *pool};
    return -1;
}

Result<std::unique_ptr<MetricsServer>> startMetrics(const CommonOptions &options,
                                                    const std::unique_ptr<Receiver> &receiver)
{
    if (!options.config.metricsListen)
        return std::unique_ptr<MetricsServer>();
    auto url = StoreUrl::parse(options.storeUrl);
    if (!url)
        return url.error();
    auto server = std::make_unique<MetricsServer>(options.config, storeFactory(*url), [&receiver] {
        return receiver ? receiver->engine()->inFlight() : 0;
    });
    auto bound = server->start(*options.config.metricsListen);
    if (!bound)
        return bound.error();
    std::fprintf(stderr, "idemdesk: metrics at http://%s/metrics\n", qPrintable(bound->toString()));
    return server;
}

const EndpointConfig *findEndpoint(const Config &config, const QString &name)
{
    if (const EndpointConfig *endpoint = config.endpoint(name))
        return endpoint;
    QStringList names;
    for (const auto &e : config.endpoints)
        names << e.name;
    printError(u"no endpoint '%1' in the config (it has: %2)"_qs.arg(name, names.join(u", "_qs)));
    return nullptr;
}

std::optional<QPair<QByteArray, quint16>> receiverAddress(const QCommandLineParser &parser,
                                                          const Config &config)
{
    const QUrl url(parser.isSet(u"url"_qs) ? parser.value(u"url"_qs)
                                           : u"http://"_qs + config.listen.toString());
    QHostAddress host(url.host() == u"localhost"_qs ? u"127.0.0.1"_qs : url.host());
    if (url.scheme() != u"http"_qs || host.protocol() != QAbstractSocket::IPv4Protocol ||
        url.port() <= 0) {
        printError(u"--url must be http://IPv4:PORT (got '%1')"_qs.arg(url.toString()));
        return std::nullopt;
    }
    return QPair<QByteArray, quint16>(host.toString().toLatin1(), quint16(url.port()));
}

QString storeDisplay(const QString &url)
{
    auto parsed = StoreUrl::parse(url);
    return parsed ? parsed->display() : url;
}

} // namespace idem::cli
