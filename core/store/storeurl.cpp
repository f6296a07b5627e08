#include "store/storeurl.h"

#include "util/format.h"

#include <QDir>
#include <QStandardPaths>
#include <QUrl>
#include <QUrlQuery>

namespace idem {

namespace {

// The URL as an error may quote it: never its user information, nor its query's values (a
// password given as a parameter, a secret path): the message names the offending parameter
// itself (docs/configuration.md#secrets: passwords are never shown).
QString shownUrl(const QString &text)
{
    QString shown = text;
    if (shown.startsWith(u"sqlite:"_qs)) {
        // a path: an @ in it is no user information
    } else if (!shown.contains(u"://"_qs)) {
        // scheme:user:pass@host without the slashes: nothing after the scheme can be trusted.
        if (const qsizetype at = shown.lastIndexOf(u'@'); at >= 0)
            shown = shown.left(shown.indexOf(u':') + 1) + u"…@"_qs + shown.mid(at + 1);
    } else {
        shown = displayUrl(shown);
    }
    if (const qsizetype q = shown.indexOf(u'?'); q >= 0)
        shown = shown.left(q) + u"?…"_qs;
    return shown;
}

// The options redis:// and redis-cluster:// share.
Result<void> redisOptions(StoreUrl &url, const QUrlQuery &query, const QString &text)
{
    for (const auto &[name, value] : query.queryItems(QUrl::FullyDecoded)) {
        bool number = true;
        if (name == u"prefix"_qs)
            url.prefix = value;
        else if (name == u"wait_replicas"_qs)
            url.waitReplicas = value.toInt(&number);
        else if (name == u"wait_timeout_ms"_qs)
            url.waitTimeoutMs = value.toInt(&number);
        else
            return makeError(
                ErrorCode::Invalid,
                u"store URL %1: unknown option %2 (redis takes prefix, wait_replicas, wait_timeout_ms)"_qs
                    .arg(shownUrl(text), name));
        if (!number || url.waitReplicas < 0 || url.waitTimeoutMs < 1)
            return makeError(
                ErrorCode::Invalid,
                u"store URL %1: %2 must be a positive number"_qs.arg(shownUrl(text), name));
        if (url.waitTimeoutMs >=
            2000) // under the 3 s command timeout, or every slow WAIT drops the connection
            return makeError(
                ErrorCode::Invalid,
                u"store URL %1: wait_timeout_ms must be under 2000"_qs.arg(shownUrl(text)));
    }
    if (url.prefix.isEmpty())
        url.prefix = u"idem:"_qs;
    // Redis Cluster hashes a key on its first {…}: every key name is the prefix, then its
    // bucket's tag, so a brace in the prefix would move the tag (one slot for every bucket, or
    // keys of one record in several slots). Refused on a single Redis too, whose keys a cluster
    // may receive.
    if (url.prefix.contains(u'{') || url.prefix.contains(u'}'))
        return makeError(ErrorCode::Invalid,
                         u"store URL %1: prefix must not contain { or } (Redis Cluster hashes a "
                         u"key on the part between braces)"_qs.arg(shownUrl(text)));
    return {};
}

// redis-cluster://[user[:pass]@]host:port[,host:port…][/0][?options]: QUrl takes one host only.
Result<StoreUrl> parseCluster(const QString &text)
{
    StoreUrl url;
    url.original = text;
    url.kind = StoreUrl::Kind::Redis;
    url.cluster = true;
    url.database = u"0"_qs;
    QString rest = text.mid(int(std::char_traits<char16_t>::length(u"redis-cluster://")));
    QString query;
    if (const qsizetype q = rest.indexOf(u'?'); q >= 0) {
        query = rest.mid(q + 1);
        rest.truncate(q);
    }
    if (const qsizetype at = rest.lastIndexOf(u'@'); at >= 0) {
        const QString userInfo = rest.left(at);
        rest = rest.mid(at + 1);
        const qsizetype colon = userInfo.indexOf(u':');
        url.user = QUrl::fromPercentEncoding(userInfo.left(colon).toUtf8());
        if (colon >= 0)
            url.password = QUrl::fromPercentEncoding(userInfo.mid(colon + 1).toUtf8());
    }
    if (const qsizetype slash = rest.indexOf(u'/'); slash >= 0) {
        const QString db = rest.mid(slash + 1);
        rest.truncate(slash);
        if (!db.isEmpty() && db != u"0"_qs)
            return makeError(
                ErrorCode::Invalid,
                u"store URL %1: a Redis Cluster has database 0 only"_qs.arg(shownUrl(text)));
    }
    for (const QString &node : rest.split(u',')) {
        const qsizetype colon = node.lastIndexOf(u':');
        bool numeric = false;
        const int port = colon > 0 ? node.mid(colon + 1).toInt(&numeric) : 0;
        const QString host = colon > 0 ? node.left(colon) : node;
        if (host.isEmpty() || !numeric || port <= 0 || port > 65535 || host.contains(u' '))
            return makeError(
                ErrorCode::Invalid,
                u"store URL %1: '%2' is not host:port (redis-cluster://host:port[,host:port…])"_qs
                    .arg(shownUrl(text), node));
        url.clusterSeeds.append({host, port});
    }
    url.host = url.clusterSeeds.first().first;
    url.port = url.clusterSeeds.first().second;
    if (auto options = redisOptions(url, QUrlQuery(query), text); !options)
        return options.error();
    return url;
}

} // namespace

QString StoreUrl::defaultSqlitePath()
{
    QString dir = QStandardPaths::writableLocation(QStandardPaths::AppDataLocation);
    if (dir.isEmpty())
        dir = QDir::homePath() + u"/.local/share/idemdesk"_qs;
    return dir + u"/idemdesk.db"_qs;
}

Result<StoreUrl> StoreUrl::parse(const QString &text)
{
    StoreUrl url;
    url.original = text;
    if (text.isEmpty()) {
        url.path = defaultSqlitePath();
        return url;
    }
    // User information that holds '?', '/' or '#' unencoded would be cut by the parsers (and
    // quoted by their messages as a host, an option or a path): refused here, without quoting it.
    if (const qsizetype scheme = text.indexOf(u"://"_qs);
        scheme > 0 && !text.startsWith(u"sqlite:"_qs)) {
        const qsizetype at = text.lastIndexOf(u'@');
        const QStringView userInfo =
            QStringView(text).mid(scheme + 3, std::max<qsizetype>(0, at - scheme - 3));
        if (at > scheme &&
            (userInfo.contains(u'?') || userInfo.contains(u'/') || userInfo.contains(u'#')))
            return makeError(
                ErrorCode::Invalid,
                u"store URL "_qs + text.left(scheme) + u"://…@"_qs + shownUrl(text.mid(at + 1)) +
                    u": percent-encode the user name and password ('?' is %3F, '/' %2F, "
                    u"'#' %23, '@' %40)"_qs);
    }
    if (text.startsWith(u"sqlite:"_qs)) {
        url.path = text.mid(7);
        if (url.path.startsWith(u"//"_qs)) // sqlite:///abs/path
            url.path = url.path.mid(2);
        if (const qsizetype q = url.path.indexOf(u'?'); q >= 0) {
            const QUrlQuery query(url.path.mid(q + 1));
            url.path.truncate(q);
            for (const auto &[name, value] : query.queryItems(QUrl::FullyDecoded)) {
                if (name != u"synchronous"_qs || (value != u"full"_qs && value != u"normal"_qs))
                    return makeError(
                        ErrorCode::Invalid,
                        u"store URL %1: unknown option %2 (sqlite takes synchronous=full or normal)"_qs
                            .arg(shownUrl(text), name));
                url.synchronousFull = value == u"full"_qs;
            }
        }
        // No file named: a templated "sqlite:${DB}" with DB unset ran on the default store (whose
        // keys are not this desk's: every event it had not seen was processed again).
        if (url.path.isEmpty())
            return makeError(
                ErrorCode::Invalid,
                u"store URL %1 names no file: give sqlite:PATH, or leave the store out "
                u"for the default (%2)"_qs.arg(shownUrl(text), defaultSqlitePath()));
        return url;
    }
    if (text.startsWith(u"redis-cluster://"_qs))
        return parseCluster(text);
    const QUrl parsed(text, QUrl::StrictMode);
    const QString scheme = parsed.scheme();
    if (scheme == u"redis"_qs) {
        url.kind = Kind::Redis;
        url.port = parsed.port(6379);
        url.database = parsed.path().mid(1);
        if (url.database.isEmpty())
            url.database = u"0"_qs;
        bool numeric = false;
        url.database.toInt(&numeric);
        if (!numeric)
            return makeError(
                ErrorCode::Invalid,
                u"store URL %1: the Redis database must be a number"_qs.arg(shownUrl(text)));
        if (auto options = redisOptions(url, QUrlQuery(parsed), text); !options)
            return options.error();
    } else if (scheme == u"postgresql"_qs || scheme == u"postgres"_qs) {
        url.kind = Kind::Postgres;
        url.port = parsed.port(5432);
        url.database = parsed.path().mid(1);
        if (url.database.isEmpty())
            return makeError(
                ErrorCode::Invalid,
                u"store URL %1: missing the database name (postgresql://user@host:port/dbname)"_qs
                    .arg(shownUrl(text)));
        static const QStringList tls{u"sslmode"_qs, u"sslrootcert"_qs, u"sslcert"_qs, u"sslkey"_qs};
        static const QStringList modes{u"disable"_qs, u"allow"_qs,     u"prefer"_qs,
                                       u"require"_qs, u"verify-ca"_qs, u"verify-full"_qs};
        for (const auto &[name, value] : QUrlQuery(parsed).queryItems(QUrl::FullyDecoded)) {
            if (!tls.contains(name))
                return makeError(
                    ErrorCode::Invalid,
                    u"store URL %1: unknown parameter '%2' (PostgreSQL takes %3)"_qs.arg(
                        shownUrl(text), name, tls.join(u", "_qs)));
            if (name == u"sslmode"_qs && !modes.contains(value))
                return makeError(ErrorCode::Invalid,
                                 u"store URL %1: sslmode must be one of %2"_qs.arg(
                                     shownUrl(text), modes.join(u", "_qs)));
            url.postgresTls.append({name, value});
        }
    } else {
        return makeError(
            ErrorCode::Invalid,
            u"store URL '%1': unknown scheme; use sqlite:PATH, redis://host:port[/db], redis-cluster://host:port[,host:port…] or postgresql://user@host:port/dbname"_qs
                .arg(shownUrl(text)));
    }
    if (!parsed.isValid() || parsed.host().isEmpty())
        return makeError(ErrorCode::Invalid,
                         u"store URL '%1': missing or invalid host"_qs.arg(shownUrl(text)));
    url.host = parsed.host();
    url.user = parsed.userName(QUrl::FullyDecoded);
    url.password = parsed.password(QUrl::FullyDecoded);
    return url;
}

QString StoreUrl::display() const
{
    switch (kind) {
    case Kind::Sqlite:
        return u"sqlite:"_qs + path;
    case Kind::Redis:
    case Kind::Postgres: {
        QString s = kind == Kind::Redis ? (cluster ? u"redis-cluster://"_qs : u"redis://"_qs)
                                        : u"postgresql://"_qs;
        if (!user.isEmpty() || !password.isEmpty())
            s += user + (password.isEmpty() ? QString() : u":***"_qs) + u"@"_qs;
        if (cluster) {
            QStringList nodes;
            for (const auto &[h, p] : clusterSeeds)
                nodes << h + u":"_qs + QString::number(p);
            return s + nodes.join(u","_qs);
        }
        s += host + u":"_qs + QString::number(port) + u"/"_qs + database;
        QStringList tls;
        for (const auto &[name, value] : postgresTls)
            tls << name + u"="_qs + value;
        if (!tls.isEmpty())
            s += u"?"_qs + tls.join(u"&"_qs);
        return s;
    }
    }
    return original;
}

} // namespace idem
