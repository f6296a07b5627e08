#pragma once

#include "model/keyrecord.h"
#include "util/result.h"

namespace idem {

struct CurlCommand
{
    QString text;
    // Stored headers curl cannot send as they are, left out: a name that is no RFC 9110 token
    // (curl reads `-H @file` as a file of headers), a CR, LF or NUL in the value.
    int headersLeftOut = 0;
};

// A command that sends `request` again to `base` ("http://host:port") with curl, for the
// clipboard. What the request holds comes from senders and shared stores, so every word is
// quoted for a POSIX shell (bash, dash, zsh) and the command holds no control, bidi or other
// invisible character: running it runs curl with the stored bytes and nothing else, and pasting
// it into a terminal types nothing but the command. A header value or body that is not
// printable UTF-8 is written as a printf format of octal escapes; such a body, or one over
// 64 KiB (more than one argument may hold), is piped in by printf, NUL and final line breaks
// kept. A path's bytes outside printable ASCII are percent-encoded.
// Secret headers are masked, hop-by-hop ones left out. Refused when the method is no token.
Result<CurlCommand> curlCommand(const StoredRequest &request, const QString &base);

// One word for a POSIX shell: between single quotes, each ' as '\''.
QString shellQuote(QStringView text);

} // namespace idem
