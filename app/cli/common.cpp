#include "cli/common.h"

#include "store/storefactory.h"
#include "store/storeurl.h"

#include <cstdio>

namespace idem::cli {

void printError(const QString &message)
{
    std::fprintf(stderr, "idemdesk: %s\n", qPrintable(message));
}

void printOut(const QString &text)
{
    std::fputs(text.toUtf8().constData(), stdout);
}

void addCommonOptions(QCommandLineParser &parser, bool withListen)
{
    parser.addHelpOption();
    parser.addOption({u"config"_qs, u"JSON config file (endpoints, store, listen)."_qs, u"FILE"_qs});
    parser.addOption({u"store"_qs, u"Store URL: sqlite:PATH, redis://host:port[/db], postgresql://user@host:port/db."_qs, u"URL"_qs});
    if (withListen) {
        parser.addOption({u"listen"_qs, u"Address to receive webhooks on (default 127.0.0.1:8787)."_qs, u"HOST:PORT"_qs});
        parser.addOption({u"allow-remote"_qs, u"Allow --listen on a non-loopback address."_qs});
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
        printError(u"unexpected argument '%1' (see --help)"_qs.arg(parser.positionalArguments().at(maxPositional)));
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
    if (listens && !options.config.listen.host.isLoopback() && !options.allowRemote)
        return makeError(ErrorCode::Invalid,
                         u"refusing to listen on %1, which is not a loopback address: add --allow-remote if you mean it"_qs
                             .arg(options.config.listen.toString()));
    return options;
}

Result<std::shared_ptr<StorePool>> openStore(const CommonOptions &options, int workers)
{
    return openStorePool(options.storeUrl, workers);
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

QString storeDisplay(const QString &url)
{
    auto parsed = StoreUrl::parse(url);
    return parsed ? parsed->display() : url;
}

} // namespace idem::cli
