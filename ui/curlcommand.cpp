#include "curlcommand.h"

#include "processing/processor.h"
#include "util/format.h"

namespace idem {

namespace {

// Whether `bytes` can stand between single quotes as they are: valid UTF-8 with no control
// character (a line break only where `lineBreaks`), no format character (bidi, zero-width), no
// line or paragraph separator and none Qt does not know. Pasted, a raw ESC ends a terminal's
// bracketed paste and what follows is typed as keys (Ctrl-U, Enter); bidi controls make the
// command read otherwise than it runs.
bool printable(const QByteArray &bytes, bool lineBreaks)
{
    const QString text = QString::fromUtf8(bytes);
    if (text.toUtf8() != bytes)
        return false;
    const QList<uint> codePoints = text.toUcs4();
    return std::none_of(codePoints.begin(), codePoints.end(), [lineBreaks](uint c) {
        if (c == '\n')
            return !lineBreaks;
        switch (QChar::category(char32_t(c))) {
        case QChar::Other_Control:
        case QChar::Other_Format:
        case QChar::Other_Surrogate:
        case QChar::Other_NotAssigned:
        case QChar::Separator_Line:
        case QChar::Separator_Paragraph:
            return true;
        default:
            return false;
        }
    });
}

// A quoted printf format (POSIX printf: \ooo escapes) that prints `bytes` exactly, in
// printable ASCII. A leading '-' is escaped too: printf would read it as an option.
QString printfFormat(const QByteArray &bytes)
{
    QString format;
    format.reserve(bytes.size() * 2);
    for (qsizetype i = 0; i < bytes.size(); ++i) {
        const auto b = uchar(bytes[i]);
        if (b == '%') {
            format += u"%%";
        } else if (b == '\\') {
            format += u"\\\\";
        } else if (b >= 0x20 && b < 0x7f && !(i == 0 && b == '-')) {
            format += QLatin1Char(char(b));
        } else {
            format += u'\\';
            format += QChar(u'0' + (b >> 6));
            format += QChar(u'0' + ((b >> 3) & 7));
            format += QChar(u'0' + (b & 7));
        }
    }
    return shellQuote(format);
}

// A word that is exactly `bytes` after the shell has read it: quoted as it is when printable,
// else printf's output. Command substitution drops trailing line breaks: for words without any.
QString shellWord(const QByteArray &bytes)
{
    if (printable(bytes, false))
        return shellQuote(QString::fromUtf8(bytes));
    return u"\"$(printf "_qs + printfFormat(bytes) + u")\""_qs;
}

// The path as curl should send it: bytes outside printable ASCII percent-encoded (a request
// target is ASCII; a stored one that is not was never valid HTTP).
QString encodedPath(const QByteArray &path)
{
    QString out;
    out.reserve(path.size());
    for (const char ch : path) {
        const auto b = uchar(ch);
        if (b > 0x20 && b < 0x7f)
            out += QLatin1Char(char(b));
        else
            out += u"%%1"_qs.arg(uint(b), 2, 16, QLatin1Char('0')).toUpper();
    }
    return out;
}

// A header curl sends as one field: a token name (so never `-H @file`), a value without the
// bytes that end a field.
bool sendable(const QByteArray &name, const QByteArray &value)
{
    return isHttpToken(name) && !value.contains('\r') && !value.contains('\n') &&
           !value.contains('\0');
}

// Linux refuses one argument over 128 KiB at exec (MAX_ARG_STRLEN): a body longer than this
// is piped in by printf, a builtin of every POSIX shell, never exec'd.
constexpr qsizetype kMaxInlineBody = 64 * 1024;

} // namespace

QString shellQuote(QStringView text)
{
    QString quoted = text.toString();
    quoted.replace(u"'"_qs, u"'\\''"_qs);
    return u"'"_qs + quoted + u"'"_qs;
}

Result<CurlCommand> curlCommand(const StoredRequest &r, const QString &base)
{
    const QByteArray method = r.method.isEmpty() ? QByteArray("POST") : r.method;
    if (!isHttpToken(method) || method.size() > 32)
        return makeError(ErrorCode::Invalid,
                         u"the stored method \"%1\" is not an HTTP method"_qs.arg(
                             escapeControls(QString::fromUtf8(method.left(40)))));
    CurlCommand curl;
    // --globoff: a stored path's [ ] { } are not curl's URL patterns.
    QString args = u"curl -i --globoff -X "_qs + shellQuote(QString::fromLatin1(method)) + u' ' +
                   shellQuote(base + encodedPath(r.path));
    for (const auto &[name, value] : maskSecrets(r.headers)) {
        if (isHopByHopHeader(name))
            continue;
        if (!sendable(name, value)) {
            ++curl.headersLeftOut;
            continue;
        }
        // "Name;" is curl's way to send an empty value ("Name:" would remove the header).
        args += u" \\\n  -H "_qs + shellWord(value.isEmpty() ? name + ';' : name + ": " + value);
    }
    // --data-raw, not --data-binary FILE: a body that begins with @ is sent as it is, never
    // read as the name of one of the operator's files.
    if (r.body.size() <= kMaxInlineBody && printable(r.body, true)) {
        curl.text = args + u" \\\n  --data-raw "_qs + shellQuote(QString::fromUtf8(r.body));
    } else {
        curl.text =
            u"printf "_qs + printfFormat(r.body) + u" | "_qs + args + u" \\\n  --data-binary @-"_qs;
    }
    return curl;
}

} // namespace idem
