#pragma once

#include "model/keyrecord.h"

#include <QString>

namespace idem {

// "6d 23h 12m", "4h 5m", "12m 3s", "45s": a TTL or an age as people read it.
QString formatDuration(qint64 ms);
// ISO 8601 in UTC with milliseconds.
QString formatTime(qint64 epochMs);

// Headers that carry secrets or signatures (Authorization, *-Signature*, *Hmac*, *Secret*,
// *Token*, Cookie, ...): shown masked in logs, the UI and the CLI.
bool isSecretHeader(QByteArrayView name);
HeaderList maskSecrets(const HeaderList &headers);
// A stored body for people: pretty JSON when it is JSON (unless `raw`), else the text, or a
// note and base64 for binary data.
QString prettyBody(const QByteArray &body, bool raw = false);

// "whsec_…abcd"-style mask for a secret that must be recognisable but not readable.
QString maskSecret(const QString &secret);

} // namespace idem
