#include "support/serveprocess.h"

#include "store/sqlitestore.h"
#include "util/clock.h"

#include <QFile>
#include <QRegularExpression>

#include <sqlite3.h>

namespace idem::test {

std::unique_ptr<QProcess> startServe(const QString &binary, const QStringList &args, quint16 &port,
                                     QByteArray *stderrText, bool keepStdout, const QProcessEnvironment &environment)
{
    port = 0;
    auto process = std::make_unique<QProcess>();
    if (!environment.isEmpty())
        process->setProcessEnvironment(environment);
    if (!keepStdout)
        process->setStandardOutputFile(QProcess::nullDevice());
    process->start(binary, QStringList{QStringLiteral("serve"), QStringLiteral("--listen"), QStringLiteral("127.0.0.1:0")} + args);
    if (!process->waitForStarted(5000))
        return process;
    static const QRegularExpression re(QStringLiteral("receiving webhooks at http://127\\.0\\.0\\.1:(\\d+)/"));
    QByteArray err;
    for (int i = 0; i < 100 && !port && process->state() != QProcess::NotRunning; ++i) {
        process->waitForReadyRead(100);
        err += process->readAllStandardError();
        if (const auto m = re.match(QString::fromUtf8(err)); m.hasMatch())
            port = quint16(m.captured(1).toUInt());
    }
    err += process->readAllStandardError();
    if (!port)
        qWarning("serve did not start: %s", err.constData());
    if (stderrText)
        *stderrText = err;
    return process;
}

void generateSqliteKeys(const QString &path, int count, const QByteArray &body)
{
    (void)SqliteStore::open(path); // the schema
    sqlite3 *db = nullptr;
    sqlite3_open(QFile::encodeName(path).constData(), &db);
    sqlite3_exec(db, "PRAGMA synchronous=OFF; BEGIN", nullptr, nullptr, nullptr);
    sqlite3_stmt *insert = nullptr;
    sqlite3_prepare_v2(db, "INSERT INTO idem_keys (key, endpoint, provider, state, fingerprint, token, attempts,"
                           " created_ms, updated_ms, lease_until_ms, expires_at_ms, req_body, res_status, res_body)"
                           " VALUES (?1, 'big', 'generic', ?2, 'f', 1, 1, ?3, ?3, 0, ?4, ?5, 200, '{\"ok\":true}')",
                       -1, &insert, nullptr);
    const qint64 now = wallMs();
    static const char *states[] = {"completed", "completed", "completed", "failed"};
    for (int i = 0; i < count; ++i) {
        const QByteArray key = "big:evt_" + QByteArray::number(i);
        sqlite3_bind_text(insert, 1, key.constData(), int(key.size()), SQLITE_TRANSIENT);
        sqlite3_bind_text(insert, 2, states[i % 4], -1, SQLITE_STATIC);
        sqlite3_bind_int64(insert, 3, now - count + i);
        sqlite3_bind_int64(insert, 4, now + 86'400'000);
        sqlite3_bind_blob(insert, 5, body.constData(), int(body.size()), SQLITE_STATIC);
        sqlite3_step(insert);
        sqlite3_reset(insert);
    }
    sqlite3_finalize(insert);
    sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr);
    sqlite3_close(db);
}

} // namespace idem::test
