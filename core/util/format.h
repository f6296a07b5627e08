#pragma once

#include "model/keyrecord.h"

#include <QString>
#include <QUrl>

namespace idem {

// "6d 23h 12m", "4h 5m", "12m 3s", "45s": a TTL or an age as people read it.
QString formatDuration(qint64 ms);
// "1 delivery", "3 deliveries": a count with the noun in the right number (English).
QString countOf(qint64 n, QStringView one, QStringView many);
// ISO 8601 in UTC with milliseconds.
QString formatTime(qint64 epochMs);

// Headers that carry secrets or signatures (Authorization, *-Signature*, *Hmac*, *Secret*,
// *Token*, Cookie, ...): shown masked in logs, the UI and the CLI.
bool isSecretHeader(QByteArrayView name);
HeaderList maskSecrets(const HeaderList &headers);
// A stored body for people: pretty JSON when it is JSON (unless `raw`), else the text, or a
// note and base64 for binary data.
QString prettyBody(const QByteArray &body, bool raw = false);

// Text for a terminal or a text log: control characters (C0 but tab, DEL, C1) and the bidi
// and line-separator controls become \u001b-style escapes, so a sender's bytes can neither
// forge a log line nor drive the terminal. Line breaks are kept only with `keepLineBreaks`
// (multi-line output), never a carriage return. The escape is JSON's: JSON text stays JSON.
QString escapeControls(QStringView text, bool keepLineBreaks = false);

// An RFC 9110 token (a method, a header field name): 1*tchar. Note that tchar admits ` $ ' | &:
// a token is safe on a request line, not in a shell.
bool isHttpToken(QByteArrayView text);

// A URL for people (answers, logs, stored errors, the window): without user name and password.
QString displayUrl(const QUrl &url);
// A URL for the operator's log and stored errors, never for a sender: displayUrl's, with each
// query value masked and no fragment, since apps take API keys in the query (?api_key=…).
QString redactedUrl(const QUrl &url);
// The same for text that may not parse as a URL (a store URL in an error message): everything
// between "://" and the last '@' goes.
QString displayUrl(const QString &text);
// The password of a URL given as text, as written (percent-encoded), found where displayUrl
// finds the user information (a user information holding '/', '?' or '#' is none: a path's
// '@'); null without one. withUrlPassword puts another in its place and keeps every other
// character, so a URL QUrl cannot hold (redis-cluster://:pass@host:port,host:port) stays whole.
QString urlPassword(const QString &text);
QString withUrlPassword(const QString &text, const QString &password);

// "whsec_…abcd"-style mask for a secret that must be recognisable but not readable.
QString maskSecret(const QString &secret);

} // namespace idem
