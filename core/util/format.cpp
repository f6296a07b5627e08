#include "util/format.h"

#include <algorithm>
#include <string_view>

#include <QDateTime>
#include <QJsonDocument>

namespace idem {

QString formatDuration(qint64 ms)
{
    if (ms <= 0)
        return u"0s"_qs;
    qint64 s = ms / 1000;
    const qint64 d = s / 86400;
    const qint64 h = (s % 86400) / 3600;
    const qint64 m = (s % 3600) / 60;
    s %= 60;
    if (d > 0)
        return u"%1d %2h %3m"_qs.arg(d).arg(h).arg(m);
    if (h > 0)
        return u"%1h %2m"_qs.arg(h).arg(m);
    if (m > 0)
        return u"%1m %2s"_qs.arg(m).arg(s);
    if (s > 0)
        return u"%1s"_qs.arg(s);
    return u"%1ms"_qs.arg(ms);
}

QString countOf(qint64 n, QStringView one, QStringView many)
{
    return QString::number(n) + u' ' + (n == 1 ? one : many).toString();
}

QString formatTime(qint64 epochMs)
{
    // On every delivery's path (the log line, the built-in processor's answer): QDateTime's
    // formatting once a second per thread, the milliseconds appended.
    thread_local qint64 cachedSecond = -1;
    thread_local QString cachedPrefix; // "2026-12-03T06:11:05."
    const qint64 second = epochMs / 1000;
    if (epochMs < 0)
        return QDateTime::fromMSecsSinceEpoch(epochMs, Qt::UTC).toString(Qt::ISODateWithMs);
    if (second != cachedSecond) {
        const QString full =
            QDateTime::fromMSecsSinceEpoch(second * 1000, Qt::UTC).toString(Qt::ISODateWithMs);
        if (!full.endsWith(u".000Z"))
            return QDateTime::fromMSecsSinceEpoch(epochMs, Qt::UTC).toString(Qt::ISODateWithMs);
        cachedPrefix = full.chopped(4);
        cachedSecond = second;
    }
    const int ms = int(epochMs % 1000);
    QString out;
    out.reserve(cachedPrefix.size() + 4);
    out += cachedPrefix;
    out += QChar(u'0' + ms / 100);
    out += QChar(u'0' + ms / 10 % 10);
    out += QChar(u'0' + ms % 10);
    out += u'Z';
    return out;
}

bool isSecretHeader(QByteArrayView name)
{
    // On every delivery's path (each request header): searched in place, case-insensitively,
    // without a lowered copy.
    const auto sameLetter = [](char a, char b) {
        return (a >= 'A' && a <= 'Z' ? char(a + 32) : a) == b;
    };
    for (const std::string_view part :
         {"authorization", "signature", "hmac", "secret", "token", "cookie", "api-key", "apikey"})
        if (std::search(name.begin(), name.end(), part.begin(), part.end(), sameLetter) !=
            name.end())
            return true;
    return false;
}

HeaderList maskSecrets(const HeaderList &headers)
{
    HeaderList masked = headers;
    for (auto &[name, value] : masked)
        if (isSecretHeader(name))
            value = "•••• (masked)";
    return masked;
}

QString prettyBody(const QByteArray &body, bool raw)
{
    if (body.isEmpty())
        return {};
    if (!raw) {
        QJsonParseError error;
        const QJsonDocument doc = QJsonDocument::fromJson(body, &error);
        if (error.error == QJsonParseError::NoError && !doc.isNull())
            return QString::fromUtf8(doc.toJson(QJsonDocument::Indented)).trimmed();
    }
    const QString text = QString::fromUtf8(body);
    if (text.toUtf8() == body)
        return text;
    return u"(%1 bytes of binary data; base64)\n%2"_qs.arg(body.size()).arg(QString::fromLatin1(body.toBase64()));
}

QString escapeControls(QStringView text, bool keepLineBreaks)
{
    auto unsafe = [keepLineBreaks](char16_t c) {
        if (c == u'\t' || (c == u'\n' && keepLineBreaks))
            return false;
        return c < 0x20 || (c >= 0x7f && c <= 0x9f) || c == 0x061c || c == 0x200e || c == 0x200f ||
               (c >= 0x2028 && c <= 0x202e) || (c >= 0x2066 && c <= 0x2069);
    };
    // Nearly every text has nothing to escape (a log line per delivery): then one copy.
    if (std::none_of(text.begin(), text.end(), [&](QChar ch) { return unsafe(ch.unicode()); }))
        return text.toString();
    QString out;
    out.reserve(text.size());
    for (const QChar ch : text) {
        if (unsafe(ch.unicode()))
            out += u"\\u%1"_qs.arg(uint(ch.unicode()), 4, 16, QLatin1Char('0'));
        else
            out += ch;
    }
    return out;
}

bool isHttpToken(QByteArrayView text)
{
    static constexpr std::string_view kSymbols = "!#$%&'*+-.^_`|~";
    return !text.isEmpty() && std::all_of(text.begin(), text.end(), [](char c) {
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
               (c != 0 && kSymbols.find(c) != std::string_view::npos);
    });
}

QString displayUrl(const QUrl &url)
{
    return url.adjusted(QUrl::RemoveUserInfo).toString();
}

QString redactedUrl(const QUrl &url)
{
    QUrl shown = url.adjusted(QUrl::RemoveUserInfo | QUrl::RemoveFragment);
    if (shown.hasQuery()) {
        QStringList parts = shown.query(QUrl::FullyEncoded).split(u'&');
        for (QString &part : parts) {
            const qsizetype equals = part.indexOf(u'=');
            part = equals < 0 ? u"***"_qs : part.left(equals + 1) + u"***"_qs;
        }
        shown.setQuery(parts.join(u'&'));
    }
    return shown.toString();
}

namespace {

// Where the user information of a URL given as text is: from after "://" to the last '@'
// (begin < 0: there is none).
struct UserInfo
{
    qsizetype begin = -1;
    qsizetype end = -1; // the '@'
};

UserInfo userInfoOf(const QString &text)
{
    const qsizetype scheme = text.indexOf(u"://"_qs);
    const qsizetype at = text.lastIndexOf(u'@');
    if (scheme < 0 || at < scheme + 3)
        return {};
    return {scheme + 3, at};
}

// The password's place in the user information ([begin, end)), or begin < 0.
UserInfo passwordOf(const QString &text)
{
    const UserInfo info = userInfoOf(text);
    if (info.begin < 0)
        return {};
    const QStringView userInfo = QStringView(text).mid(info.begin, info.end - info.begin);
    const qsizetype colon = userInfo.indexOf(u':');
    if (colon < 0 || userInfo.contains(u'/') || userInfo.contains(u'?') || userInfo.contains(u'#'))
        return {};
    return {info.begin + colon + 1, info.end};
}

} // namespace

QString displayUrl(const QString &text)
{
    const UserInfo info = userInfoOf(text);
    if (info.begin < 0)
        return text;
    return text.left(info.begin) + text.mid(info.end + 1);
}

QString urlPassword(const QString &text)
{
    const UserInfo password = passwordOf(text);
    return password.begin < 0 ? QString() : text.mid(password.begin, password.end - password.begin);
}

QString withUrlPassword(const QString &text, const QString &password)
{
    const UserInfo place = passwordOf(text);
    return place.begin < 0 ? text : text.left(place.begin) + password + text.mid(place.end);
}

QString maskSecret(const QString &secret)
{
    if (secret.size() <= 8)
        return u"••••"_qs;
    const qsizetype underscore = secret.indexOf(u'_');
    const QString head = underscore > 0 && underscore < 8 ? secret.left(underscore + 1) : QString();
    return head + u"••••"_qs + secret.right(4);
}

} // namespace idem
