// idemdesk keys list | show | reset | retry | delete | purge-expired
#include "cli/common.h"

#include "engine/engine.h"
#include "util/clock.h"
#include "util/format.h"

#include <QCoreApplication>
#include <QEventLoop>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>

namespace idem::cli {

namespace {

const char kKeysUsage[] =
    "Usage: idemdesk keys COMMAND [OPTIONS]\n"
    "\n"
    "  list [--state S] [--endpoint E] [--match GLOB] [--type T] [--search TEXT]\n"
    "       [--limit N] [--after POSITION] [--json]\n"
    "  show KEY [--json]\n"
    "  reset KEY... [--force] | reset --all-failed [--endpoint E]\n"
    "  retry KEY... [--force]\n"
    "  delete KEY...\n"
    "  purge-expired\n"
    "  export [--state S] [--endpoint E] [--match GLOB] [--output FILE] [KEY...]\n"
    "  import [FILE]\n"
    "\n"
    "KEY is the stored key, <endpoint>:<idempotency key> (e.g. orders:evt_123).\n"
    "Every command takes --store URL and --config FILE; `idemdesk keys COMMAND --help` has more.\n";

template<typename T>
Result<T> run(StorePool &pool, std::function<Result<T>(IdempotencyStore &)> job)
{
    return pool.run<T>(std::move(job));
}

QJsonValue bodyJson(const QByteArray &body)
{
    const QString text = QString::fromUtf8(body);
    if (text.toUtf8() == body)
        return text;
    return QJsonObject{{u"base64"_qs, QString::fromLatin1(body.toBase64())}};
}

QJsonObject summaryJson(const KeyRecord &r, qint64 now)
{
    QJsonObject o{{u"key"_qs, r.key},
                  {u"endpoint"_qs, r.endpoint},
                  {u"provider"_qs, r.provider},
                  {u"type"_qs, r.type.isEmpty() ? QJsonValue() : QJsonValue(r.type)},
                  {u"state"_qs, toString(r.state)},
                  {u"deliveries"_qs, r.attempts},
                  {u"ttl_seconds"_qs, std::max<qint64>(0, (r.expiresAtMs - now) / 1000)},
                  {u"expires_at"_qs, formatTime(r.expiresAtMs)},
                  {u"created_at"_qs, formatTime(r.createdMs)},
                  {u"updated_at"_qs, formatTime(r.updatedMs)},
                  {u"token"_qs, r.token},
                  {u"fingerprint"_qs, QString::fromLatin1(r.fingerprint)}};
    if (r.state == KeyState::Processing)
        o.insert(u"lease_until"_qs, formatTime(r.leaseUntilMs));
    if (r.result.status)
        o.insert(u"result_status"_qs, r.result.status);
    if (!r.error.isEmpty())
        o.insert(u"error"_qs, r.error);
    return o;
}

QString table(const QList<QStringList> &rows)
{
    QList<qsizetype> widths;
    for (const auto &row : rows)
        for (qsizetype c = 0; c < row.size(); ++c) {
            if (widths.size() <= c)
                widths.append(0);
            widths[c] = std::max(widths[c], row[c].size());
        }
    QString out;
    for (const auto &row : rows) {
        QString line;
        for (qsizetype c = 0; c < row.size(); ++c)
            line += c + 1 < row.size() ? row[c].leftJustified(widths[c] + 2) : row[c];
        out += line.trimmed() + u'\n';
    }
    return out;
}

void printKeys(const QList<KeyRecord> &keys, qint64 now, bool json)
{
    if (json) {
        for (const KeyRecord &r : keys)
            printOut(QString::fromUtf8(
                         QJsonDocument(summaryJson(r, now)).toJson(QJsonDocument::Compact)) +
                     u'\n');
        return;
    }
    QList<QStringList> rows{{u"KEY"_qs, u"ENDPOINT"_qs, u"TYPE"_qs, u"STATE"_qs, u"DELIVERIES"_qs,
                             u"TTL"_qs, u"UPDATED"_qs}};
    for (const KeyRecord &r : keys)
        rows.append({r.key, r.endpoint, r.type.isEmpty() ? u"-"_qs : r.type, toString(r.state),
                     QString::number(r.attempts), formatDuration(r.expiresAtMs - now),
                     formatTime(r.updatedMs)});
    printOut(table(rows));
}

// `keys list --type/--search`: findKeys() pages until this page is full or nothing older
// matches (no budget: the command waits for its page), then says where the next one starts.
int listFound(const QCommandLineParser &parser, StoreSession &session, KeyQuery query)
{
    qint64 now = 0;
    QList<KeyRecord> found;
    QString next;
    auto done = run<Ok>(*session.pool, [&](IdempotencyStore &s) -> Result<Ok> {
        auto clock = s.clockMs();
        if (!clock)
            return clock.error();
        now = *clock;
        auto page = s.findKeys(query);
        if (!page)
            return page.error();
        found = std::move(page->records);
        next = page->next;
        return Ok{};
    });
    if (!done) {
        printError(done.error().message);
        return done.error().code == ErrorCode::Invalid ? ExitUsage : ExitRuntime;
    }
    const bool json = parser.isSet(u"json"_qs);
    printKeys(found, now, json);
    if (json)
        return ExitOk;
    QStringList what;
    if (!query.type.isEmpty())
        what << u"of type '%1'"_qs.arg(escapeControls(query.type));
    if (!query.search.isEmpty())
        what << u"whose body contains '%1'"_qs.arg(escapeControls(query.search));
    if (!next.isEmpty())
        printOut(u"(more keys: --after '%1')\n"_qs.arg(escapeControls(next)));
    else if (found.isEmpty())
        printOut(u"(no keys %1%2)\n"_qs.arg(what.join(u" and "_qs),
                                            query.after.isEmpty() ? QString()
                                                                  : u" after that position"_qs));
    return ExitOk;
}

int list(const QStringList &arguments)
{
    QCommandLineParser parser;
    parser.setApplicationDescription(u"List idempotency keys, most recently updated first."_qs);
    addCommonOptions(parser, false);
    parser.addOption({u"state"_qs, u"processing, completed, failed or reset."_qs, u"S"_qs});
    parser.addOption({u"endpoint"_qs, u"Only this endpoint's keys."_qs, u"E"_qs});
    parser.addOption({u"match"_qs, u"Shell glob on the stored key (* ? [...])."_qs, u"GLOB"_qs});
    parser.addOption(
        {u"type"_qs, u"Only keys of this event type (payment_intent.succeeded)."_qs, u"T"_qs});
    parser.addOption({u"search"_qs,
                      u"Only keys whose stored request body contains TEXT (ASCII letters in "
                      u"either case)."_qs,
                      u"TEXT"_qs});
    parser.addOption({u"limit"_qs, u"At most N keys (default 100)."_qs, u"N"_qs, u"100"_qs});
    parser.addOption({u"after"_qs,
                      u"With --type or --search: go on from where the last page stopped (the "
                      u"position it printed)."_qs,
                      u"POSITION"_qs});
    parser.addOption({u"json"_qs, u"One JSON object per line."_qs});
    if (const int rc = parseOrExit(parser, arguments, 0); rc >= 0)
        return rc;
    KeyQuery query;
    if (parser.isSet(u"state"_qs)) {
        query.state = keyStateFromString(parser.value(u"state"_qs));
        if (!query.state) {
            printError(u"--state must be processing, completed, failed or reset (got '%1')"_qs.arg(parser.value(u"state"_qs)));
            return ExitUsage;
        }
    }
    bool ok = false;
    query.limit = parser.value(u"limit"_qs).toInt(&ok);
    if (!ok || query.limit < 1) {
        printError(u"--limit must be a positive number"_qs);
        return ExitUsage;
    }
    query.endpoint = parser.value(u"endpoint"_qs);
    query.glob = parser.value(u"match"_qs);
    query.type = parser.value(u"type"_qs);
    query.search = parser.value(u"search"_qs);
    query.after = parser.value(u"after"_qs);
    if ((parser.isSet(u"type"_qs) && query.type.isEmpty()) ||
        (parser.isSet(u"search"_qs) && query.search.isEmpty())) {
        printError(u"--type and --search need a value"_qs);
        return ExitUsage;
    }
    if (query.search.toUtf8().size() > kMaxSearchBytes) {
        printError(u"--search takes at most %1 bytes"_qs.arg(kMaxSearchBytes));
        return ExitUsage;
    }
    if (parser.isSet(u"after"_qs) && query.type.isEmpty() && query.search.isEmpty()) {
        printError(u"--after goes on with a --type or --search listing"_qs);
        return ExitUsage;
    }
    StoreSession session;
    if (const int rc = openSession(parser, session); rc >= 0)
        return rc;
    if (!query.type.isEmpty() || !query.search.isEmpty())
        return listFound(parser, session, query);
    query.limit += 1; // one more tells whether there are more
    qint64 now = 0; // the store's clock: TTLs count down on it
    auto keys = run<QList<KeyRecord>>(*session.pool, [&](IdempotencyStore &s) -> Result<QList<KeyRecord>> {
        auto clock = s.clockMs();
        if (!clock)
            return clock.error();
        now = *clock;
        return s.listKeys(query);
    });
    if (!keys) {
        printError(keys.error().message);
        return ExitRuntime;
    }
    const bool more = keys->size() == query.limit;
    if (more)
        keys->removeLast();
    printKeys(*keys, now, parser.isSet(u"json"_qs));
    if (parser.isSet(u"json"_qs))
        return ExitOk;
    if (more)
        printOut(u"(more keys: raise --limit or narrow with --state, --endpoint, --match)\n"_qs);
    else if (keys->isEmpty())
        printOut(u"(no keys)\n"_qs);
    return ExitOk;
}

int show(const QStringList &arguments)
{
    QCommandLineParser parser;
    parser.setApplicationDescription(u"One key: state, TTL, fingerprint, stored request and result, history and delivery timeline."_qs);
    addCommonOptions(parser, false);
    parser.addOption({u"json"_qs, u"As one JSON object."_qs});
    parser.addPositionalArgument(u"KEY"_qs, u"The stored key, <endpoint>:<key>."_qs);
    if (const int rc = parseOrExit(parser, arguments, 1); rc >= 0)
        return rc;
    if (parser.positionalArguments().size() != 1) {
        printError(u"keys show needs one KEY"_qs);
        return ExitUsage;
    }
    const QString key = parser.positionalArguments().first();
    StoreSession session;
    if (const int rc = openSession(parser, session); rc >= 0)
        return rc;
    qint64 now = 0; // the store's clock: TTL and lease count down on it
    auto record = run<std::optional<KeyRecord>>(*session.pool, [&](IdempotencyStore &s) -> Result<std::optional<KeyRecord>> {
        auto clock = s.clockMs();
        if (!clock)
            return clock.error();
        now = *clock;
        return s.key(key);
    });
    if (!record) {
        printError(record.error().message);
        return ExitRuntime;
    }
    if (!record->has_value()) {
        printError(key.contains(u':') ? u"no key %1 (or it expired)"_qs.arg(key)
                                      : u"no key %1: stored keys are <endpoint>:<key>, e.g. generic:%1"_qs.arg(key));
        return ExitRuntime;
    }
    const KeyRecord &r = **record;
    DeliveryQuery dq;
    dq.key = key;
    dq.limit = 500;
    auto timeline = run<QList<DeliveryEvent>>(*session.pool, [&](IdempotencyStore &s) { return s.deliveries(dq); });
    // The key is shown all the same; the timeline's absence is said, not hidden.
    if (!timeline)
        printError(u"the key's deliveries could not be read: "_qs + timeline.error().message);
    QList<DeliveryEvent> events = timeline ? *timeline : QList<DeliveryEvent>();
    std::reverse(events.begin(), events.end()); // oldest first
    const HeaderList requestHeaders = maskSecrets(r.request.headers);
    // Shown all the same, with what is missing said (and the exit status saying it too).
    const QString lost = lostSharedContent(r);
    auto done = [&] {
        if (lost.isEmpty())
            return ExitOk;
        printError(u"%1: %2 named shared content the store no longer has, so it is not shown"_qs
                       .arg(escapeControls(key), lost));
        return ExitRuntime;
    };

    if (parser.isSet(u"json"_qs)) {
        QJsonObject o = summaryJson(r, now);
        if (!lost.isEmpty())
            o.insert(u"lost"_qs, lost);
        o.insert(u"request"_qs, QJsonObject{{u"method"_qs, QString::fromLatin1(r.request.method)},
                                            {u"path"_qs, QString::fromUtf8(r.request.path)},
                                            {u"headers"_qs, headersToJson(requestHeaders)},
                                            {u"body"_qs, bodyJson(r.request.body)}});
        if (r.state != KeyState::Processing && r.result.status)
            o.insert(u"result"_qs, QJsonObject{{u"status"_qs, r.result.status},
                                               {u"headers"_qs, headersToJson(r.result.headers)},
                                               {u"body"_qs, bodyJson(r.result.body)}});
        o.insert(u"history"_qs, historyToJson(r.history));
        QJsonArray deliveries;
        for (const DeliveryEvent &e : events) {
            QJsonObject d = deliveryToJson(e);
            d.insert(u"offset_ms"_qs, e.atMs - (events.isEmpty() ? e.atMs : events.first().atMs));
            deliveries.append(d);
        }
        o.insert(u"deliveries"_qs, deliveries);
        printOut(QString::fromUtf8(QJsonDocument(o).toJson(QJsonDocument::Indented)));
        return done();
    }

    QString out;
    // One line per field: what a store or a file wrote is escaped, line breaks too.
    auto line = [&](const QString &label, const QString &value) {
        out += label.leftJustified(13) + escapeControls(value) + u'\n';
    };
    line(u"key"_qs, r.key);
    line(u"endpoint"_qs, u"%1 (%2)"_qs.arg(r.endpoint, r.provider));
    line(u"state"_qs, toString(r.state));
    if (r.state == KeyState::Processing)
        line(u"lease"_qs, r.leaseUntilMs > now ? u"%1 left"_qs.arg(formatDuration(r.leaseUntilMs - now))
                                               : u"expired %1 ago (the next delivery recovers it)"_qs.arg(formatDuration(now - r.leaseUntilMs)));
    line(u"deliveries"_qs, QString::number(r.attempts));
    line(u"TTL"_qs, u"%1 (expires %2)"_qs.arg(formatDuration(r.expiresAtMs - now), formatTime(r.expiresAtMs)));
    line(u"fingerprint"_qs, u"sha256:"_qs + QString::fromLatin1(r.fingerprint));
    line(u"token"_qs, QString::number(r.token));
    line(u"created"_qs, formatTime(r.createdMs));
    line(u"updated"_qs, formatTime(r.updatedMs));
    if (!r.error.isEmpty())
        line(u"error"_qs, r.error);
    if (!lost.isEmpty())
        line(u"lost"_qs, lost + u" (the shared content it names is no longer in the store)"_qs);
    out += u"\nrequest      %1 %2\n"_qs.arg(QString::fromLatin1(r.request.method), QString::fromUtf8(r.request.path));
    for (const auto &[n, v] : requestHeaders)
        out += u"  %1: %2\n"_qs.arg(QString::fromLatin1(n), QString::fromUtf8(v));
    out += u"\n"_qs + prettyBody(r.request.body).replace(u"\n"_qs, u"\n  "_qs).prepend(u"  "_qs) + u'\n';
    if (r.state != KeyState::Processing && r.result.status) {
        out += u"\nresult       %1\n"_qs.arg(r.result.status);
        for (const auto &[n, v] : r.result.headers)
            out += u"  %1: %2\n"_qs.arg(QString::fromLatin1(n), QString::fromUtf8(v));
        out += u"\n"_qs + prettyBody(r.result.body).replace(u"\n"_qs, u"\n  "_qs).prepend(u"  "_qs) + u'\n';
    }
    out += u"\nhistory\n"_qs;
    for (const HistoryEntry &h : r.history)
        out += u"  %1  %2 (token %3)%4\n"_qs
                   .arg(formatTime(h.atMs), escapeControls(h.event).leftJustified(12))
                   .arg(h.token)
                   .arg(h.detail.isEmpty() ? QString() : u" "_qs + escapeControls(h.detail));
    out += u"\ndeliveries\n"_qs;
    for (const DeliveryEvent &e : events)
        out += u"  +%1s  %2 %3  %4%5\n"_qs
                   .arg(double(e.atMs - events.first().atMs) / 1000.0, 8, 'f', 3)
                   .arg(toString(e.outcome).leftJustified(12))
                   .arg(e.status)
                   .arg(escapeControls(e.instance))
                   .arg(e.detail.isEmpty() ? QString()
                                           : u" ("_qs + escapeControls(e.detail) + u")"_qs);
    if (events.isEmpty())
        out += u"  (none logged)\n"_qs;
    printOut(out);
    return done();
}

// reset / delete: one operator transition per key.
int transition(const QStringList &arguments, OperatorAction action)
{
    const bool reset = action == OperatorAction::Reset;
    QCommandLineParser parser;
    parser.setApplicationDescription(reset ? u"Make failed keys processable again (history kept): the next delivery processes them."_qs
                                           : u"Remove keys from the store."_qs);
    addCommonOptions(parser, false);
    if (reset) {
        parser.addOption({u"force"_qs, u"Also reset completed keys and keys being processed."_qs});
        parser.addOption({u"all-failed"_qs, u"Every failed key (of --endpoint, when given)."_qs});
        parser.addOption({u"endpoint"_qs, u"With --all-failed: only this endpoint."_qs, u"E"_qs});
    }
    parser.addPositionalArgument(u"KEY..."_qs, u"Stored keys, <endpoint>:<key>."_qs);
    if (const int rc = parseOrExit(parser, arguments); rc >= 0)
        return rc;
    const bool allFailed = reset && parser.isSet(u"all-failed"_qs);
    QStringList keys = parser.positionalArguments();
    if (keys.isEmpty() == !allFailed) {
        printError(allFailed ? u"give keys or --all-failed, not both"_qs : u"no KEY given"_qs);
        return ExitUsage;
    }
    StoreSession session;
    if (const int rc = openSession(parser, session); rc >= 0)
        return rc;
    const bool force = reset && parser.isSet(u"force"_qs);
    int failures = 0;
    int changed = 0;
    auto apply = [&](const QString &key) {
        auto before = run<std::optional<KeyRecord>>(*session.pool, [&](IdempotencyStore &s) { return s.key(key); });
        auto verdict = run<OperatorVerdict>(*session.pool, [&](IdempotencyStore &s) {
            return s.applyOperator(key, action, force, u"operator (cli)"_qs);
        });
        if (!verdict) {
            printError(verdict.error().message);
            ++failures;
            return false;
        }
        const QString was = before && before->has_value() ? toString((*before)->state) : QString();
        switch (*verdict) {
        case OperatorVerdict::Accept:
            printOut(u"%1 %2 (was %3)\n"_qs.arg(reset ? u"reset"_qs : u"deleted"_qs, key, was));
            ++changed;
            return true;
        case OperatorVerdict::WrongState:
            printError(was == u"reset"_qs ? u"%1 is already reset"_qs.arg(key)
                                          : u"%1 is %2: not reset (--force resets it anyway)"_qs.arg(key, was));
            break;
        case OperatorVerdict::Missing:
            printError(u"no key %1 (or it expired)"_qs.arg(key));
            break;
        case OperatorVerdict::Leased:
            printError(leasedMessage(key, reset ? u"reset"_qs : u"deleted"_qs));
            break;
        }
        ++failures;
        return false;
    };
    if (allFailed) {
        const QString endpoint = parser.value(u"endpoint"_qs);
        auto reset = session.pool->run<qint64>([&](IdempotencyStore &store) {
            return resetFailedKeys(store, endpoint, u"operator (cli)"_qs,
                                   [](const QString &key) { printOut(u"reset %1 (was failed)\n"_qs.arg(key)); });
        });
        if (!reset) {
            printError(reset.error().message);
            return ExitRuntime;
        }
        printOut(u"reset %1%2\n"_qs.arg(countOf(*reset, u"failed key", u"failed keys"))
                     .arg(endpoint.isEmpty() ? QString() : u" of "_qs + endpoint));
    } else {
        for (const QString &key : keys)
            apply(key);
    }
    return failures ? ExitRuntime : ExitOk;
}

int retry(const QStringList &arguments)
{
    QCommandLineParser parser;
    parser.setApplicationDescription(u"Run the stored request of each key through its endpoint's processor again, now, and print the outcome."_qs);
    addCommonOptions(parser, false);
    parser.addOption({u"force"_qs, u"Also retry completed keys and keys being processed."_qs});
    parser.addOption(
        {u"simulate"_qs,
         u"Without --config: retry through the built-in endpoints' simulated processor, knowingly (the demo's store)."_qs});
    parser.addPositionalArgument(u"KEY..."_qs, u"Stored keys, <endpoint>:<key>."_qs);
    if (const int rc = parseOrExit(parser, arguments); rc >= 0)
        return rc;
    if (parser.positionalArguments().isEmpty()) {
        printError(u"no KEY given"_qs);
        return ExitUsage;
    }
    // The processor comes from the config: without the desk's, the built-in one's endpoints
    // (named after the providers: docs/configuration.md#no-configuration-file) simulate, and a
    // retry would mark the event completed without the app ever seeing it.
    if (parser.value(u"config"_qs).isEmpty() && !parser.isSet(u"simulate"_qs)) {
        printError(
            u"keys retry needs the desk's config (--config FILE, as given to serve) to know where each endpoint forwards; without it the built-in simulator would mark the event completed without your app seeing it (--simulate does that on purpose)"_qs);
        return ExitUsage;
    }
    StoreSession session;
    if (const int rc = openSession(parser, session); rc >= 0)
        return rc;
    IdempotencyEngine engine(session.options.config, session.pool, u"cli"_qs);
    int failures = 0;
    for (const QString &key : parser.positionalArguments()) {
        QEventLoop loop;
        engine.retryKey(key, parser.isSet(u"force"_qs), [&](Result<RetryOutcome> outcome) {
            if (!outcome) {
                printError(outcome.error().message);
                ++failures;
            } else if (outcome->completed) {
                printOut(u"%1: reprocessed, %2, completed\n"_qs.arg(key).arg(outcome->response.status));
            } else {
                printOut(u"%1: reprocessed, %2, failed: %3\n"_qs.arg(key).arg(outcome->response.status).arg(outcome->error));
                ++failures;
            }
            loop.quit();
        });
        loop.exec();
    }
    engine.drainLog();
    return failures ? ExitRuntime : ExitOk;
}

int purge(const QStringList &arguments)
{
    QCommandLineParser parser;
    parser.setApplicationDescription(u"Remove expired keys (and delivery log entries past retention) now."_qs);
    addCommonOptions(parser, false);
    if (const int rc = parseOrExit(parser, arguments, 0); rc >= 0)
        return rc;
    StoreSession session;
    if (const int rc = openSession(parser, session); rc >= 0)
        return rc;
    auto removed = run<qint64>(*session.pool, [](IdempotencyStore &s) { return s.purgeExpired(); });
    if (!removed) {
        printError(removed.error().message);
        return ExitRuntime;
    }
    printOut(u"removed %1\n"_qs.arg(countOf(*removed, u"expired key", u"expired keys")));
    return ExitOk;
}

} // namespace

int keys(const QStringList &arguments)
{
    const QString sub = arguments.size() > 1 ? arguments.at(1) : QString();
    QStringList rest = arguments;
    if (rest.size() > 1)
        rest.removeAt(1);
    rest[0] = u"idemdesk keys "_qs + sub;
    if (sub == u"list"_qs)
        return list(rest);
    if (sub == u"show"_qs)
        return show(rest);
    if (sub == u"reset"_qs)
        return transition(rest, OperatorAction::Reset);
    if (sub == u"delete"_qs)
        return transition(rest, OperatorAction::Delete);
    if (sub == u"retry"_qs)
        return retry(rest);
    if (sub == u"purge-expired"_qs)
        return purge(rest);
    if (sub == u"export"_qs)
        return keysExport(rest);
    if (sub == u"import"_qs)
        return keysImport(rest);
    if (sub.isEmpty() || sub == u"--help"_qs || sub == u"-h"_qs || sub == u"help"_qs) {
        printOut(QString::fromLatin1(kKeysUsage));
        return sub.isEmpty() ? ExitUsage : ExitOk;
    }
    printError(u"keys: unknown command '%1'"_qs.arg(sub));
    printOut(QString::fromLatin1(kKeysUsage));
    return ExitUsage;
}

} // namespace idem::cli
