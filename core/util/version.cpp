#include "util/version.h"

#include <hiredis/hiredis.h>
#include <libpq-fe.h>
#include <openssl/crypto.h>
#include <pqxx/version>
#include <sqlite3.h>

#include <QtGlobal>

#ifndef IDEM_GIT_COMMIT
#define IDEM_GIT_COMMIT "unknown"
#endif

namespace idem {

namespace {

// libpq's PQlibVersion(): 150005 is 15.5 (10 and later: major * 10000 + minor).
QString libpqVersion()
{
    const int v = PQlibVersion();
    return v >= 100000 ? u"%1.%2"_qs.arg(v / 10000).arg(v % 10000)
                       : u"%1.%2.%3"_qs.arg(v / 10000).arg(v / 100 % 100).arg(v % 100);
}

} // namespace

QString deskVersion()
{
    return QStringLiteral(IDEM_VERSION);
}

QString deskCommit()
{
    return QStringLiteral(IDEM_GIT_COMMIT);
}

QList<std::pair<QString, QString>> libraryVersions()
{
    return {
        {u"Qt"_qs, QString::fromLatin1(qVersion())},
        {u"hiredis"_qs, u"%1.%2.%3"_qs.arg(HIREDIS_MAJOR).arg(HIREDIS_MINOR).arg(HIREDIS_PATCH)},
        {u"libpqxx"_qs, QStringLiteral(PQXX_VERSION)},
        {u"libpq"_qs, libpqVersion()},
        {u"SQLite"_qs, QString::fromLatin1(sqlite3_libversion())},
        // "OpenSSL 3.0.17 1 Jul 2025": the version is the second word.
        {u"OpenSSL"_qs, QString::fromLatin1(OpenSSL_version(OPENSSL_VERSION)).section(u' ', 1, 1)},
    };
}

QString versionReport()
{
    QString text = u"idemdesk %1 (commit %2)\n"_qs.arg(deskVersion(), deskCommit());
    for (const auto &[name, version] : libraryVersions())
        text += name + u' ' + version + u'\n';
    return text;
}

} // namespace idem
