#include "support/serveprocess.h"

#include "model/keyrecord.h"
#include "store/rediscluster.h"
#include "store/redisprotocol.h"
#include "store/sqlitestore.h"
#include "store/storeurl.h"
#include "util/clock.h"

#include <QFile>
#include <QRegularExpression>
#include <QScopeGuard>

#include <hiredis.h>
#include <sqlite3.h>
#include <sys/resource.h>
#include <unistd.h>

namespace idem::test {

std::unique_ptr<QProcess> startServe(const QString &binary, const QStringList &args, quint16 &port,
                                     QByteArray *stderrText, bool keepStdout,
                                     const QProcessEnvironment &environment, int openFiles,
                                     int stdoutFd)
{
    port = 0;
    auto process = std::make_unique<QProcess>();
    if (openFiles > 0 || stdoutFd >= 0)
        process->setChildProcessModifier([openFiles, stdoutFd] {
            if (openFiles > 0) {
                const rlimit files{rlim_t(openFiles), rlim_t(openFiles)};
                setrlimit(RLIMIT_NOFILE, &files);
            }
            if (stdoutFd >= 0) // after QProcess set up its channels: this one wins
                ::dup2(stdoutFd, STDOUT_FILENO);
        });
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

void generateSqliteKeys(const QString &path, int count, const QByteArray &body,
                        const KeyVariation &vary)
{
    (void)SqliteStore::open(path); // the schema
    sqlite3 *db = nullptr;
    sqlite3_open(QFile::encodeName(path).constData(), &db);
    sqlite3_exec(db, "PRAGMA synchronous=OFF; BEGIN", nullptr, nullptr, nullptr);
    sqlite3_stmt *insert = nullptr;
    sqlite3_prepare_v2(
        db,
        "INSERT INTO idem_keys (key, endpoint, provider, state, fingerprint, token, attempts,"
        " created_ms, updated_ms, lease_until_ms, expires_at_ms, req_body, res_status, res_body,"
        " type) VALUES (?1, 'big', 'generic', ?2, 'f', 1, 1, ?3, ?3, 0, ?4, ?5, 200,"
        " '{\"ok\":true}', ?6)",
        -1, &insert, nullptr);
    const qint64 now = wallMs();
    static const char *states[] = {"completed", "completed", "completed", "failed"};
    for (int i = 0; i < count; ++i) {
        const QByteArray key = "big:evt_" + QByteArray::number(i);
        sqlite3_bind_text(insert, 1, key.constData(), int(key.size()), SQLITE_TRANSIENT);
        sqlite3_bind_text(insert, 2, states[i % 4], -1, SQLITE_STATIC);
        sqlite3_bind_int64(insert, 3, now - count + i);
        sqlite3_bind_int64(insert, 4, now + 86'400'000);
        QByteArray b = body, type;
        if (vary)
            vary(i, b, type);
        sqlite3_bind_blob(insert, 5, b.constData(), int(b.size()), SQLITE_TRANSIENT);
        if (type.isEmpty())
            sqlite3_bind_null(insert, 6);
        else
            sqlite3_bind_text(insert, 6, type.constData(), int(type.size()), SQLITE_TRANSIENT);
        sqlite3_step(insert);
        sqlite3_reset(insert);
    }
    sqlite3_finalize(insert);
    sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr);
    sqlite3_close(db);
}

QString generateRedisKeys(const QString &urlText, int count, int endpoints, int expiredPercent,
                          const QByteArray &body, const KeyVariation &vary)
{
    auto url = StoreUrl::parse(urlText);
    if (!url || url->kind != StoreUrl::Kind::Redis)
        return u"not a Redis store URL: "_qs + urlText;
    const QByteArray prefix = url->prefix.toUtf8();
    // The connections: a single Redis's, or each master's, by slot (the desk's own routing).
    std::unique_ptr<redis::ClusterLinks> cluster;
    redisContext *single = nullptr;
    auto closeSingle = qScopeGuard([&] {
        if (single)
            redisFree(single);
    });
    if (url->cluster) {
        QList<redis::ClusterNode> seeds;
        for (const auto &[host, port] : std::as_const(url->clusterSeeds))
            seeds.append({host.toUtf8(), port});
        cluster = std::make_unique<redis::ClusterLinks>(
            seeds, 2000, 60000, [](redisContext *) { return Result<void>(); });
        if (auto r = cluster->refresh(); !r)
            return r.error().message;
    } else {
        single = redisConnect(url->host.toUtf8().constData(), url->port);
        if (!single || single->err)
            return u"cannot connect to "_qs + url->display();
        if (url->database != u"0"_qs)
            freeReplyObject(redisCommand(single, "SELECT %s", url->database.toUtf8().constData()));
    }
    // Commands queued per connection, sent to every one, then every answer read: the masters
    // work side by side.
    QHash<redisContext *, qsizetype> queued;
    QString failure;
    auto send = [&](const QList<QByteArray> &command) {
        redisContext *c = single;
        if (cluster) {
            // By the map read once, not link(): link() re-reads the map now and then, and a
            // re-read may free a connection holding commands queued here.
            auto master = cluster->map().master(redis::commandSlot(command));
            if (!master) {
                failure = u"a slot has no master"_qs;
                return;
            }
            auto link = cluster->linkTo(*master);
            if (!link) {
                failure = link.error().message;
                return;
            }
            c = *link;
        }
        redis::Argv a(command);
        redisAppendCommandArgv(c, a.count(), a.argv.data(), a.lengths.data());
        ++queued[c];
    };
    auto drain = [&] {
        for (auto it = queued.cbegin(); it != queued.cend(); ++it) {
            int done = 0;
            while (!done)
                if (redisBufferWrite(it.key(), &done) != REDIS_OK)
                    return QString::fromUtf8(it.key()->errstr);
        }
        for (auto it = queued.cbegin(); it != queued.cend(); ++it)
            for (qsizetype i = 0; i < it.value(); ++i) {
                void *raw = nullptr;
                if (redisGetReply(it.key(), &raw) != REDIS_OK || !raw)
                    return QString::fromUtf8(it.key()->errstr);
                const auto *reply = static_cast<redisReply *>(raw);
                QString error;
                if (reply->type == REDIS_REPLY_ERROR)
                    error = QString::fromUtf8(reply->str, int(reply->len));
                freeReplyObject(raw);
                if (!error.isEmpty())
                    return error;
            }
        queued.clear();
        return QString();
    };

    // What claim.lua and finish.lua write for a delivery claimed at `created`, finished a few
    // ms later (completed 200, or failed 500 with its error), live for a day from its claim.
    const QByteArray fingerprint(64, 'f');
    const QByteArray headers = headersJson({{"Content-Type", "application/json"}});
    constexpr qint64 kTtlMs = 86'400'000, kGraceMs = 86'400'000; // TOKEN_GRACE_MS
    const qint64 now = wallMs();
    const qint64 expired = qint64(count) * expiredPercent / 100;
    const redis::Layout layout(prefix, cluster ? redis::Layout::kClusterBuckets : 1);
    for (int i = 0; i < count && failure.isEmpty(); ++i) {
        const QByteArray endpoint =
            endpoints <= 1 ? QByteArrayLiteral("big") : "big" + QByteArray::number(i % endpoints);
        const QByteArray key = endpoint + ":evt_" + QByteArray::number(i);
        // Newest last; the oldest `expired` ones a day and more ago, past their expiry.
        const qint64 created = now - count + i - (i < expired ? kTtlMs + 60'000 : 0);
        const qint64 updated = created + 3, expiresAt = created + kTtlMs;
        const qint64 token = created * 1000 + 17;
        const bool failed = i % 4 == 3;
        const QByteArray t = QByteArray::number(token), c = QByteArray::number(created),
                         u = QByteArray::number(updated);
        const QByteArray meta = QByteArray(failed ? "failed " : "completed ") + t + " 1 " + c +
                                ' ' + u + " 0 " + QByteArray::number(expiresAt) +
                                (failed ? " 500" : " 200") + " generic " + endpoint + ' ' +
                                fingerprint;
        QByteArray history =
            "[{\"at\":" + c + ",\"event\":\"claimed\",\"token\":" + t + "},{\"at\":" + u +
            (failed ? ",\"event\":\"failed\",\"token\":" : ",\"event\":\"completed\",\"token\":") +
            t;
        history += failed ? ",\"detail\":\"downstream answered 500\"}]" : "}]";
        QByteArray b = body, type;
        if (vary)
            vary(i, b, type);
        const QByteArray request = "POST /hooks/" + endpoint + '\n' + headers + '\n' + b;
        const QByteArray result = (failed ? "500\n" : "200\n") + headers +
                                  (failed ? "\n{\"error\":\"boom\"}" : "\n{\"ok\":true}");
        const QByteArray rk = layout.record(QString::fromUtf8(key));
        QList<QByteArray> hset{"HSET", rk, "m", meta, "h", history, "q", request, "s", result};
        if (failed)
            hset << "e"
                 << "downstream answered 500";
        if (!type.isEmpty())
            hset << "t" << type;
        send(hset);
        send({"PEXPIREAT", rk, QByteArray::number(expiresAt + kGraceMs)});
        // The index entries claim.lua and finish.lua write with the record, in its bucket.
        const int bucket = layout.bucketOf(QString::fromUtf8(key));
        send({"ZADD", layout.keys(bucket, QString::fromUtf8(endpoint)),
              QByteArray::number(expiresAt), key});
        if (failed)
            send({"ZADD", layout.stateIndex(bucket, QString::fromUtf8(endpoint), KeyState::Failed),
                  QByteArray::number(expiresAt), key});
        send({"SADD", layout.endpoints(bucket), endpoint});
        if (i % 2000 == 1999 || i + 1 == count)
            if (failure.isEmpty())
                failure = drain();
    }
    if (failure.isEmpty()) {
        send({"SET", layout.layoutKey(),
              QByteArray::number(redis::kLayoutVersion)}); // as a desk leaves it
        failure = drain();
    }
    return failure;
}

} // namespace idem::test
