#pragma once

#include <QList>
#include <QString>

#include <utility>

namespace idem {

// The desk's version, e.g. "0.1.0".
QString deskVersion();
// The git commit it was built from (as of the last configure: "abc1234def56", 12 hex digits
// of `git rev-parse --short=12 HEAD`, with "-dirty" when tracked files differed from it), or
// "unknown" when built outside a git checkout (a source tarball).
QString deskCommit();
// The libraries it runs with, in order: Qt, hiredis, libpqxx, libpq, SQLite, OpenSSL. The
// version the running process loaded where the library tells it (Qt, libpq, SQLite, OpenSSL);
// hiredis and libpqxx expose none, so theirs is the one built against.
QList<std::pair<QString, QString>> libraryVersions();
// What `idemdesk --version` prints: the first line "idemdesk 0.1.0 (commit abc1234)", then one
// line per library ("Qt 6.4.2").
QString versionReport();

} // namespace idem
