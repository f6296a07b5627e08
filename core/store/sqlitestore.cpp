#include "store/sqlitestore.h"

#include <QDir>
#include <QElapsedTimer>
#include <QFile>
#include <QFileInfo>
#include <QHash>
#include <QJsonDocument>

#include "util/clock.h"

#include <sqlite3.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace idem {

// The schema's versioned steps, applied in order at connect (the version is how many were).
const char *const kSchemaSteps[] = {
    ":/sql/sqlite/001_init.sql",        ":/sql/sqlite/002_tokens.sql",
    ":/sql/sqlite/003_count_index.sql", ":/sql/sqlite/004_delivery_count.sql",
    ":/sql/sqlite/005_shared.sql",      ":/sql/sqlite/006_type.sql"};

namespace {

const char *const kSelectKey =
    "SELECT key, endpoint, provider, state, fingerprint, token, attempts, created_ms, updated_ms,"
    " lease_until_ms, expires_at_ms, req_method, req_path, req_headers, req_body, res_status,"
    " res_headers, res_body, error, history, type FROM idem_keys";

} // namespace

// A cached prepared statement, reset and unbound when it goes out of scope.
class SqliteStore::Statement
{
public:
    explicit Statement(sqlite3_stmt *stmt) : m_stmt(stmt) {}
    Statement(const Statement &) = delete;
    ~Statement()
    {
        sqlite3_reset(m_stmt);
        sqlite3_clear_bindings(m_stmt);
    }
    Statement &bind(int i, qint64 v)
    {
        sqlite3_bind_int64(m_stmt, i, v);
        return *this;
    }
    Statement &bind(int i, const QString &v) { return bindText(i, v.toUtf8()); }
    Statement &bindText(int i, const QByteArray &utf8)
    {
        sqlite3_bind_text(m_stmt, i, utf8.constData(), int(utf8.size()), SQLITE_TRANSIENT);
        return *this;
    }
    Statement &bindBlob(int i, const QByteArray &v)
    {
        sqlite3_bind_blob(m_stmt, i, v.constData(), int(v.size()), SQLITE_TRANSIENT);
        return *this;
    }
    int step() { return sqlite3_step(m_stmt); }
    qint64 i64(int c) const { return sqlite3_column_int64(m_stmt, c); }
    QByteArray bytes(int c) const
    {
        const void *data = sqlite3_column_blob(m_stmt, c);
        return QByteArray(static_cast<const char *>(data), sqlite3_column_bytes(m_stmt, c));
    }
    QString text(int c) const { return QString::fromUtf8(bytes(c)); }
    // The column's bytes where SQLite holds them, until the next step.
    QByteArrayView view(int c) const
    {
        const void *data = sqlite3_column_blob(m_stmt, c);
        return {static_cast<const char *>(data), qsizetype(sqlite3_column_bytes(m_stmt, c))};
    }
    // A text column that may be NULL: bound and read as NULL when empty (the type's index
    // leaves those rows out).
    Statement &bindOptional(int i, const QString &v)
    {
        if (!v.isEmpty())
            bind(i, v);
        return *this;
    }
    // A row of kSelectKey; `full` adds the stored request, result and history.
    KeyRecord record(bool full) const
    {
        KeyRecord r;
        r.key = text(0);
        r.endpoint = text(1);
        r.provider = text(2);
        r.type = text(20);
        r.state = keyStateFromString(text(3)).value_or(KeyState::Failed);
        r.fingerprint = bytes(4);
        r.token = i64(5);
        r.attempts = int(i64(6));
        r.createdMs = i64(7);
        r.updatedMs = i64(8);
        r.leaseUntilMs = i64(9);
        r.expiresAtMs = i64(10);
        r.result.status = int(i64(15));
        r.error = text(18);
        if (full) {
            r.request.method = bytes(11);
            r.request.path = bytes(12);
            readStoredHeaders(r.request, bytes(13));
            r.request.body = bytes(14);
            readStoredResult(r.result, bytes(16), bytes(17));
            r.history = historyFromJson(parseJsonArray(bytes(19)));
        }
        return r;
    }

private:
    sqlite3_stmt *m_stmt;
};

struct SqliteStore::Cache
{
    QHash<const char *, sqlite3_stmt *> statements;
};

SqliteStore::SqliteStore(sqlite3 *db, const SqliteOptions &options)
    : m_db(db), m_options(options), m_cache(std::make_unique<Cache>())
{}

SqliteStore::~SqliteStore()
{
    for (sqlite3_stmt *stmt : std::as_const(m_cache->statements))
        sqlite3_finalize(stmt);
    sqlite3_close(m_db);
}

Error SqliteStore::lastError(const char *what) const
{
    return makeError(ErrorCode::Unavailable, u"SQLite %1: %2"_qs.arg(QString::fromUtf8(what),
                                                                    QString::fromUtf8(sqlite3_errmsg(m_db))));
}

Result<std::unique_ptr<SqliteStore>> SqliteStore::open(const QString &path,
                                                        const SqliteOptions &options)
{
    const QFileInfo info(path);
    if (!QDir().mkpath(info.absolutePath()))
        return makeError(ErrorCode::Unavailable,
                         u"cannot create the folder of the store %1"_qs.arg(path));
    // The file holds request bodies: readable by its owner only. SQLite gives the -wal and -shm
    // files the mode of the database file.
    // Only a file that is not there yet is opened (and closed) here: closing any descriptor of
    // an existing database file drops every POSIX lock this process holds on it — another pool
    // worker's connection included, which another process could then overrun (SQLite, "How To
    // Corrupt An SQLite Database File", 2.2).
    const QByteArray native = QFile::encodeName(path);
    if (const int fd = ::open(native.constData(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
        fd >= 0)
        ::close(fd);
    sqlite3 *db = nullptr;
    const int rc = sqlite3_open_v2(QFile::encodeName(path).constData(), &db,
                                   SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                                   nullptr);
    if (rc != SQLITE_OK) {
        const QString message = db ? QString::fromUtf8(sqlite3_errmsg(db)) : u"out of memory"_qs;
        sqlite3_close(db);
        return makeError(ErrorCode::Unavailable,
                         u"cannot open SQLite store %1: %2"_qs.arg(path, message));
    }
    sqlite3_busy_timeout(db, options.busyTimeoutMs);
    std::unique_ptr<SqliteStore> store(new SqliteStore(db, options));
    // Another program's database (tables, and no schema version of ours) is left as it is: the
    // desk's tables were added to it and WAL set on it (a store path mistyped onto it).
    {
        sqlite3_stmt *probe = nullptr;
        static const char *const kForeign = "SELECT (SELECT user_version FROM pragma_user_version),"
                                            " (SELECT count(*) FROM sqlite_master"
                                            "  WHERE name NOT LIKE 'idem\\_%' ESCAPE '\\'"
                                            "  AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\')";
        const int prepared = sqlite3_prepare_v2(db, kForeign, -1, &probe, nullptr);
        const int stepped = prepared == SQLITE_OK ? sqlite3_step(probe) : prepared;
        const bool foreign = stepped == SQLITE_ROW && sqlite3_column_int(probe, 0) == 0 &&
                             sqlite3_column_int(probe, 1) > 0;
        sqlite3_finalize(probe);
        if (stepped != SQLITE_ROW)
            return makeError(
                ErrorCode::Unavailable,
                u"SQLite: %1 (store %2)"_qs.arg(QString::fromUtf8(sqlite3_errmsg(db)), path));
        if (foreign)
            return makeError(ErrorCode::Invalid,
                             u"%1 is another program's SQLite database (it holds tables, not the "
                             u"desk's): not used as a store"_qs.arg(path));
    }
    // journal_size_limit: a WAL grown while readers held back its checkpoints is cut back to
    // 64 MiB once one completes (without it, it keeps its largest size for good).
    for (const char *pragma :
         {"PRAGMA journal_mode=WAL", "PRAGMA journal_size_limit=67108864",
          options.synchronousFull ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL"}) {
        if (auto r = store->exec(pragma); !r) // the first read of the file: a database?
            return makeError(r.error().code, u"%1 (store %2)"_qs.arg(r.error().message, path));
    }

    // Schema: versioned by PRAGMA user_version, each step applied in the same transaction —
    // taken only when a step is due, so that a file whose schema is current opens without the
    // write lock (held by another program, or refused on a full disk: reads still answer).
    const auto schemaVersion = [db] {
        sqlite3_stmt *version = nullptr;
        sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &version, nullptr);
        const int v = sqlite3_step(version) == SQLITE_ROW ? sqlite3_column_int(version, 0) : 0;
        sqlite3_finalize(version);
        return v;
    };
    if (schemaVersion() < int(std::size(kSchemaSteps))) {
        if (auto r = store->exec("BEGIN IMMEDIATE"); !r)
            return r.error();
        for (int v = schemaVersion(); v < int(std::size(kSchemaSteps)); ++v) {
            QFile schema(QString::fromLatin1(kSchemaSteps[v]));
            if (!schema.open(QIODevice::ReadOnly)) {
                (void)store->exec("ROLLBACK");
                return makeError(
                    ErrorCode::Internal,
                    u"the SQLite schema resource %1 is missing"_qs.arg(schema.fileName()));
            }
            const QByteArray sql =
                schema.readAll() + "\nPRAGMA user_version = " + QByteArray::number(v + 1);
            if (auto r = store->exec(sql.constData()); !r) {
                (void)store->exec("ROLLBACK");
                return r.error();
            }
        }
        if (auto r = store->exec("COMMIT"); !r)
            return r.error();
    }
    // Only the owner may read it (request bodies), once it is known to be a database: a store path
    // mistyped onto another file (/etc/passwd, as root) made that file 0600 before it was refused.
    for (const char *suffix : {"", "-wal", "-shm"})
        (void)::chmod((native + suffix).constData(), 0600);
    return store;
}

Result<void> SqliteStore::exec(const char *sql)
{
    char *message = nullptr;
    if (sqlite3_exec(m_db, sql, nullptr, nullptr, &message) != SQLITE_OK) {
        const QString text = QString::fromUtf8(message ? message : sqlite3_errmsg(m_db));
        sqlite3_free(message);
        return makeError(ErrorCode::Unavailable, u"SQLite: %1"_qs.arg(text));
    }
    return {};
}

// Statements are prepared once per connection and kept (SQLITE_PREPARE_PERSISTENT).
#define IDEM_PREPARE(var, sqlText)                                                                 \
    sqlite3_stmt *var##Raw = m_cache->statements.value(sqlText);                                   \
    if (!var##Raw) {                                                                               \
        if (sqlite3_prepare_v3(m_db, sqlText, -1, SQLITE_PREPARE_PERSISTENT, &var##Raw,            \
                               nullptr) != SQLITE_OK)                                              \
            return lastError("prepare");                                                           \
        m_cache->statements.insert(sqlText, var##Raw);                                             \
    }                                                                                              \
    Statement var(var##Raw)

namespace {
// Rolls back unless committed: every early return inside a transaction leaves the file clean.
// Inside a batch (group commit) it is a savepoint of the batch's transaction instead.
class Transaction
{
public:
    Transaction(sqlite3 *db, bool inBatch) : m_db(db), m_nested(inBatch) {}
    ~Transaction()
    {
        if (m_open)
            sqlite3_exec(m_db, m_nested ? "ROLLBACK TO idem_step; RELEASE idem_step" : "ROLLBACK",
                         nullptr, nullptr, nullptr);
    }
    bool begin()
    {
        // SQLite rolls a whole transaction back by itself on some errors (SQLITE_FULL, IOERR,
        // INTERRUPT): the batch is gone, and a step must not then commit on its own.
        if (m_nested && sqlite3_get_autocommit(m_db))
            return false;
        m_open = sqlite3_exec(m_db, m_nested ? "SAVEPOINT idem_step" : "BEGIN IMMEDIATE", nullptr,
                              nullptr, nullptr) == SQLITE_OK;
        return m_open;
    }
    bool commit()
    {
        if (m_nested) {
            const bool ok = sqlite3_exec(m_db, "RELEASE idem_step", nullptr, nullptr, nullptr) == SQLITE_OK;
            m_open = !ok;
            return ok;
        }
        const bool ok = sqlite3_exec(m_db, "COMMIT", nullptr, nullptr, nullptr) == SQLITE_OK;
        m_open = !ok && !sqlite3_get_autocommit(m_db);
        return ok;
    }

private:
    sqlite3 *m_db;
    bool m_nested;
    bool m_open = false;
};
} // namespace

bool SqliteStore::beginBatch()
{
    m_inBatch = sqlite3_get_autocommit(m_db) && exec("BEGIN IMMEDIATE").ok();
    return m_inBatch;
}

Result<void> SqliteStore::endBatch()
{
    m_inBatch = false;
    if (sqlite3_get_autocommit(m_db)) // SQLite rolled the batch back itself (I/O error, full disk)
        return makeError(ErrorCode::Unavailable, u"SQLite: the batch's transaction was rolled back"_qs);
    if (auto committed = exec("COMMIT"); !committed) {
        if (!sqlite3_get_autocommit(m_db))
            (void)exec("ROLLBACK");
        return committed.error();
    }
    return {};
}

Result<std::optional<KeyRecord>> SqliteStore::readKey(const QString &key)
{
    static const QByteArray sql = QByteArray(kSelectKey) + " WHERE key = ?1";
    IDEM_PREPARE(select, sql.constData());
    select.bind(1, key);
    const int rc = select.step();
    if (rc == SQLITE_DONE)
        return std::optional<KeyRecord>();
    if (rc != SQLITE_ROW)
        return lastError("read");
    return std::optional<KeyRecord>(select.record(true));
}

Result<qint64> SqliteStore::nextToken(qint64 currentToken)
{
    // Above the key's own token too: an older desk sharing the file may not move the counter.
    IDEM_PREPARE(next, "UPDATE idem_counters SET value = max(value, ?1) + 1 WHERE name = 'token' RETURNING value");
    next.bind(1, currentToken);
    if (next.step() != SQLITE_ROW)
        return lastError("token");
    return next.i64(0);
}

Result<qint64> SqliteStore::clockMs()
{
    return wallMs();
}

Error SqliteStore::beginError(const char *what) const
{
    if (m_inBatch && sqlite3_get_autocommit(m_db))
        return makeError(ErrorCode::Unavailable,
                         u"SQLite %1: the batch's transaction was rolled back by SQLite"_qs.arg(QLatin1String(what)));
    return lastError(what);
}

Result<ClaimResult> SqliteStore::claim(const ClaimRequest &req)
{
    auto result = claimWritten(req, false); // its transaction (or savepoint) is over
    if (!result)
        return answerUnwritten(req, result.error());
    return result;
}

Result<ClaimResult> SqliteStore::claimWritten(const ClaimRequest &req, bool sharedHeaders)
{
    if (auto inPlace = fileInPlace(); !inPlace)
        return inPlace.error();
    const qint64 nowMs = wallMs();
    Transaction tx(m_db, m_inBatch);
    if (!tx.begin())
        return beginError("claim");
    auto existing = readKey(req.key);
    if (!existing)
        return existing.error();
    const KeyRecord *current = existing->has_value() ? &existing->value() : nullptr;

    ClaimResult result;
    result.storeNowMs = nowMs;
    result.decision = decideClaim(current, req.fingerprint, nowMs, req.policy);

    switch (result.decision.action) {
    case ClaimAction::Create:
    case ClaimAction::Reclaim: {
        auto token = nextToken(current ? current->token : 0);
        if (!token)
            return token.error();
        result.record = claimedRecord(current, req, result.decision, *token, nowMs);
        const KeyRecord &r = result.record;

        IDEM_PREPARE(
            upsert,
            "INSERT OR REPLACE INTO idem_keys (key, endpoint, provider, state, fingerprint,"
            " token, attempts, created_ms, updated_ms, lease_until_ms, expires_at_ms,"
            " req_method, req_path, req_headers, req_body, res_status, res_headers, res_body,"
            " error, history, type) VALUES (?1, ?2, ?3, 'processing', ?4, ?5, ?6, ?7, ?8, ?9,"
            " ?10, ?11, ?12, ?13, ?14, 0, '[]', NULL, '', ?15, ?16)");
        upsert.bind(1, r.key).bind(2, r.endpoint).bind(3, r.provider).bindText(4, r.fingerprint);
        upsert.bind(5, r.token).bind(6, qint64(r.attempts)).bind(7, r.createdMs).bind(8, r.updatedMs);
        upsert.bind(9, r.leaseUntilMs).bind(10, r.expiresAtMs);
        upsert.bindText(11, r.request.method).bindText(12, r.request.path);
        upsert.bindText(13, storedHeadersJson(r.request, sharedHeaders));
        upsert.bindBlob(14, r.request.body);
        upsert.bindText(15, compactJson(historyToJson(r.history))).bindOptional(16, r.type);
        if (upsert.step() != SQLITE_DONE)
            return lastError("claim");
        break;
    }
    case ClaimAction::Replay:
    case ClaimAction::InProgress: {
        result.record = *current;
        result.record.attempts += 1;
        result.record.updatedMs = nowMs;
        IDEM_PREPARE(touch,
                     "UPDATE idem_keys SET attempts = attempts + 1, updated_ms = ?2 WHERE key = ?1");
        touch.bind(1, req.key).bind(2, nowMs);
        if (touch.step() != SQLITE_DONE)
            return lastError("claim");
        break;
    }
    case ClaimAction::Mismatch:
        result.record = *current; // untouched
        return result;            // the transaction rolls back: nothing was written
    }
    if (!tx.commit())
        return lastError("commit claim");
    return result;
}

Result<FinishVerdict> SqliteStore::finish(const FinishRequest &req)
{
    return finishWritten(req, false);
}

Result<FinishVerdict> SqliteStore::finishWritten(const FinishRequest &req, bool sharedResult)
{
    const qint64 nowMs = wallMs();
    Transaction tx(m_db, m_inBatch);
    if (!tx.begin())
        return beginError("finish");
    auto existing = readKey(req.key);
    if (!existing)
        return existing.error();
    const KeyRecord *current = existing->has_value() ? &existing->value() : nullptr;
    const StoredResult result = storedForm(req.result, sharedResult);
    const FinishVerdict verdict = decideFinish(current, req.token, req.state, result, nowMs);
    if (verdict != FinishVerdict::Accept)
        return verdict;

    QList<HistoryEntry> history = current->history;
    appendHistory(history, {nowMs, toString(req.state), req.token, req.error});
    IDEM_PREPARE(update,
                 "UPDATE idem_keys SET state = ?2, updated_ms = ?3, lease_until_ms = 0,"
                 " res_status = ?4, res_headers = ?5, res_body = ?6, error = ?7, history = ?8"
                 " WHERE key = ?1");
    update.bind(1, req.key).bind(2, toString(req.state)).bind(3, nowMs);
    update.bind(4, qint64(result.status))
        .bindText(5, storedResultHeadersJson(result, sharedResult));
    update.bindBlob(6, result.body)
        .bind(7, req.error)
        .bindText(8, compactJson(historyToJson(history)));
    if (update.step() != SQLITE_DONE)
        return lastError("finish");
    if (!tx.commit())
        return lastError("commit finish");
    return verdict;
}

template<typename T, typename Request, typename Step>
Result<QList<T>> SqliteStore::inOneTransaction(const QList<Request> &requests, Step step)
{
    Transaction tx(m_db, m_inBatch);
    if (!tx.begin())
        return beginError("batch");
    // Each step is a savepoint of this transaction.
    const bool wasInBatch = m_inBatch;
    m_inBatch = true;
    QList<T> results;
    for (const Request &request : requests) {
        auto one = step(request);
        if (!one) {
            m_inBatch = wasInBatch;
            return one.error();
        }
        results.append(std::move(*one));
    }
    m_inBatch = wasInBatch;
    if (!tx.commit())
        return lastError("commit batch");
    return results;
}

Result<QList<ClaimResult>> SqliteStore::claimBatch(const QList<ClaimRequest> &requests)
{
    // The shared content first, in the claims' transaction: a record is never written without
    // it, and it expires after every record naming it.
    bool shared = false;
    auto results = inOneTransaction<ClaimResult>(
        requests, [this, &requests, &shared](const ClaimRequest &r) -> Result<ClaimResult> {
            if (!std::exchange(shared, true))
                if (auto written = writeShared(sharedContentOf(requests)); !written)
                    return written.error();
            return claimWritten(r, true);
        });
    if (!results)
        return answerUnwritten(requests, results.error());
    if (auto filled = fillReplayedFailures(
            *results, [this](const QByteArray &ref) { return readShared(ref); });
        !filled)
        return filled.error();
    return results;
}

Result<QList<FinishVerdict>> SqliteStore::finishBatch(const QList<FinishRequest> &requests)
{
    bool shared = false;
    return inOneTransaction<FinishVerdict>(
        requests, [this, &requests, &shared](const FinishRequest &r) -> Result<FinishVerdict> {
            if (!std::exchange(shared, true))
                if (auto written = writeShared(sharedContentOf(requests)); !written)
                    return written.error();
            return finishWritten(r, true);
        });
}

Result<void> SqliteStore::writeShared(const QList<SharedContent> &shared)
{
    const qint64 nowMs = wallMs();
    for (const SharedContent &c : shared) {
        IDEM_PREPARE(upsert, "INSERT INTO idem_shared (sha256, content, expires_at_ms)"
                             " VALUES (?1, ?2, ?3) ON CONFLICT (sha256) DO UPDATE"
                             " SET expires_at_ms = max(expires_at_ms, excluded.expires_at_ms)");
        upsert.bindText(1, c.ref).bindBlob(2, c.content).bind(3, nowMs + c.ttlMs);
        if (upsert.step() != SQLITE_DONE)
            return lastError("shared content");
    }
    return {};
}

Result<std::optional<QByteArray>> SqliteStore::readShared(const QByteArray &ref)
{
    IDEM_PREPARE(select, "SELECT content FROM idem_shared WHERE sha256 = ?1");
    select.bindText(1, ref);
    const int rc = select.step();
    if (rc == SQLITE_DONE)
        return std::optional<QByteArray>();
    if (rc != SQLITE_ROW)
        return lastError("read shared content");
    return std::optional<QByteArray>(select.bytes(0));
}

Result<std::optional<KeyRecord>> SqliteStore::key(const QString &key)
{
    auto r = readKey(key);
    if (!r || !r->has_value())
        return r;
    if ((*r)->expiredAt(wallMs()))
        return std::optional<KeyRecord>();
    if (auto resolved =
            resolveShared(**r, [this](const QByteArray &ref) { return readShared(ref); });
        !resolved)
        return resolved.error();
    return r;
}

namespace {
// The WHERE of a key query: ?1 now, ?2 state, ?3 endpoint, ?4 glob, ?7 type.
QByteArray keyFilter(const KeyQuery &q)
{
    QByteArray sql = " WHERE expires_at_ms > ?1";
    if (q.state)
        sql += " AND state = ?2";
    if (!q.endpoint.isEmpty())
        sql += " AND endpoint = ?3";
    if (!q.glob.isEmpty())
        sql += " AND key GLOB ?4";
    if (!q.type.isEmpty())
        sql += " AND type = ?7";
    return sql;
}

template <typename Statement> void bindFilter(Statement &s, const KeyQuery &q, qint64 nowMs)
{
    s.bind(1, nowMs);
    if (q.state)
        s.bind(2, toString(*q.state));
    if (!q.endpoint.isEmpty())
        s.bind(3, q.endpoint);
    if (!q.glob.isEmpty())
        s.bind(4, keyGlobToSqlite(q.glob));
    if (!q.type.isEmpty())
        s.bind(7, q.type);
}
} // namespace

Result<QList<KeyRecord>> SqliteStore::listKeys(const KeyQuery &q)
{
    const QByteArray sql = QByteArray(kSelectKey) + keyFilter(q) +
                           " ORDER BY updated_ms DESC, key DESC LIMIT ?5 OFFSET ?6";
    sqlite3_stmt *raw = nullptr;
    if (sqlite3_prepare_v2(m_db, sql.constData(), -1, &raw, nullptr) != SQLITE_OK)
        return lastError("list");
    std::unique_ptr<sqlite3_stmt, int (*)(sqlite3_stmt *)> owner(raw, sqlite3_finalize);
    {
        Statement s(raw);
        bindFilter(s, q, wallMs());
        s.bind(5, qint64(q.limit)).bind(6, qint64(q.offset));
        QList<KeyRecord> keys;
        int rc;
        while ((rc = s.step()) == SQLITE_ROW) {
            keys.append(s.record(false));
        }
        if (rc != SQLITE_DONE)
            return lastError("list");
        return keys;
    }
}

Result<KeyPage> SqliteStore::findKeys(const KeyQuery &q)
{
    std::optional<ListPosition> from;
    if (!q.after.isEmpty() && !(from = ListPosition::parse(q.after)))
        return badListPosition(q.after);
    const bool searching = !q.search.isEmpty();
    // Newest first from where the last page stopped, through idem_keys_updated (or, for a
    // type, idem_keys_type): a search steps through the rows until its page is full or its
    // budget spent; a type alone reads one page and the row after it.
    QByteArray sql = QByteArray(kSelectKey) + keyFilter(q);
    if (from)
        sql += " AND (updated_ms, key) < (?5, ?6)";
    sql += " ORDER BY updated_ms DESC, key DESC";
    if (!searching)
        sql += " LIMIT ?8";
    sqlite3_stmt *raw = nullptr;
    if (sqlite3_prepare_v2(m_db, sql.constData(), -1, &raw, nullptr) != SQLITE_OK)
        return lastError("find");
    std::unique_ptr<sqlite3_stmt, int (*)(sqlite3_stmt *)> owner(raw, sqlite3_finalize);
    Statement s(raw);
    bindFilter(s, q, wallMs());
    if (from)
        s.bind(5, from->at).bind(6, from->key);
    if (!searching)
        s.bind(8, qint64(q.limit) + 1);
    const QByteArray needle = searchNeedle(q.search);
    QElapsedTimer spent;
    spent.start();
    KeyPage page;
    int rc;
    while ((rc = s.step()) == SQLITE_ROW) {
        if (!searching && page.records.size() == q.limit) { // the row after a full page
            page.next = ListPosition{page.records.last().updatedMs, page.records.last().key}.text();
            break;
        }
        ++page.scanned;
        if (!searching || bodyContains(s.view(14), needle))
            page.records.append(s.record(false));
        if (searching &&
            (page.records.size() == q.limit ||
             (q.budgetMs > 0 && page.scanned % 64 == 0 && spent.elapsed() >= q.budgetMs))) {
            page.next = ListPosition{s.i64(8), s.text(0)}.text();
            break;
        }
    }
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return lastError("find");
    return page;
}

Result<QStringList> SqliteStore::keyNames(const KeyQuery &q)
{
    // One statement: one snapshot of the table, whatever is written meanwhile.
    const QByteArray sql = "SELECT key FROM idem_keys" + keyFilter(q) + " ORDER BY key";
    sqlite3_stmt *raw = nullptr;
    if (sqlite3_prepare_v2(m_db, sql.constData(), -1, &raw, nullptr) != SQLITE_OK)
        return lastError("list");
    std::unique_ptr<sqlite3_stmt, int (*)(sqlite3_stmt *)> owner(raw, sqlite3_finalize);
    Statement s(raw);
    bindFilter(s, q, wallMs());
    QStringList names;
    int rc;
    while ((rc = s.step()) == SQLITE_ROW)
        names << s.text(0);
    if (rc != SQLITE_DONE)
        return lastError("list");
    return names;
}

Result<StateCounts> SqliteStore::countKeys(const QString &endpoint)
{
    const qint64 nowMs = wallMs();
    // Both read the covering index of schema step 3, never the rows: one endpoint's range of
    // it, or all of it (the planner would pick the rows' state index, which is not covering).
    IDEM_PREPARE(one, "SELECT state, count(*) FROM idem_keys WHERE endpoint = ?2"
                      " AND expires_at_ms > ?1 GROUP BY state");
    IDEM_PREPARE(all, "SELECT state, count(*) FROM idem_keys"
                      " INDEXED BY idem_keys_endpoint_state_expires"
                      " WHERE expires_at_ms > ?1 GROUP BY state");
    Statement &count = endpoint.isEmpty() ? all : one;
    count.bind(1, nowMs);
    if (!endpoint.isEmpty())
        count.bind(2, endpoint);
    StateCounts counts;
    int rc;
    while ((rc = count.step()) == SQLITE_ROW) {
        const qint64 n = count.i64(1);
        switch (keyStateFromString(count.text(0)).value_or(KeyState::Failed)) {
        case KeyState::Processing: counts.processing += n; break;
        case KeyState::Completed: counts.completed += n; break;
        case KeyState::Failed: counts.failed += n; break;
        case KeyState::Reset: counts.reset += n; break;
        }
    }
    if (rc != SQLITE_DONE)
        return lastError("count");
    return counts;
}

Result<OperatorVerdict> SqliteStore::applyOperator(const QString &key, OperatorAction action,
                                                   bool force, const QString &detail)
{
    const qint64 nowMs = wallMs();
    Transaction tx(m_db, m_inBatch);
    if (!tx.begin())
        return beginError("operator");
    auto existing = readKey(key);
    if (!existing)
        return existing.error();
    const KeyRecord *current = existing->has_value() ? &existing->value() : nullptr;
    const OperatorVerdict verdict = decideOperator(current, action, force, nowMs);
    if (verdict != OperatorVerdict::Accept)
        return verdict;
    if (action == OperatorAction::Delete) {
        IDEM_PREPARE(del, "DELETE FROM idem_keys WHERE key = ?1");
        del.bind(1, key);
        if (del.step() != SQLITE_DONE)
            return lastError("delete");
    } else {
        const bool reset = action == OperatorAction::Reset;
        QList<HistoryEntry> history = current->history;
        appendHistory(history, {nowMs, reset ? u"reset"_qs : u"force-failed"_qs, current->token, detail});
        IDEM_PREPARE(update, "UPDATE idem_keys SET state = ?2, updated_ms = ?3, lease_until_ms = 0,"
                             " error = CASE WHEN ?2 = 'failed' THEN ?4 ELSE error END, history = ?5"
                             " WHERE key = ?1");
        update.bind(1, key).bind(2, reset ? u"reset"_qs : u"failed"_qs).bind(3, nowMs);
        update.bind(4, detail).bindText(5, compactJson(historyToJson(history)));
        if (update.step() != SQLITE_DONE)
            return lastError("update");
    }
    if (!tx.commit())
        return lastError("commit");
    return verdict;
}

Result<ImportVerdict> SqliteStore::importRecord(const KeyRecord &r, qint64 ttlMs, qint64 leaseMs)
{
    const qint64 nowMs = wallMs();
    Transaction tx(m_db, m_inBatch);
    if (!tx.begin())
        return beginError("import");
    auto existing = readKey(r.key);
    if (!existing)
        return existing.error();
    if (existing->has_value() && !existing->value().expiredAt(nowMs))
        return ImportVerdict::Exists;
    // Above the token the app last saw (the record's) and the key's own, the counter with it.
    auto token = nextToken(std::max(r.token, existing->has_value() ? existing->value().token : 0));
    if (!token)
        return token.error();
    IDEM_PREPARE(insert,
                 "INSERT OR REPLACE INTO idem_keys (key, endpoint, provider, state, fingerprint,"
                 " token, attempts, created_ms, updated_ms, lease_until_ms, expires_at_ms,"
                 " req_method, req_path, req_headers, req_body, res_status, res_headers, res_body,"
                 " error, history, type) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11,"
                 " ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21)");
    insert.bind(1, r.key)
        .bind(2, r.endpoint)
        .bind(3, r.provider)
        .bind(4, toString(r.state))
        .bindText(5, r.fingerprint);
    insert.bind(6, *token).bind(7, qint64(r.attempts)).bind(8, r.createdMs).bind(9, r.updatedMs);
    insert.bind(10, r.state == KeyState::Processing ? nowMs + leaseMs : qint64(0))
        .bind(11, nowMs + ttlMs);
    insert.bindText(12, r.request.method).bindText(13, r.request.path);
    insert.bindText(14, headersJson(r.request.headers)).bindBlob(15, r.request.body);
    insert.bind(16, qint64(r.result.status))
        .bindText(17, headersJson(r.result.headers));
    insert.bindBlob(18, r.result.body)
        .bind(19, r.error)
        .bindText(20, compactJson(historyToJson(r.history)))
        .bindOptional(21, r.type);
    if (insert.step() != SQLITE_DONE)
        return lastError("import");
    if (!tx.commit())
        return lastError("commit import");
    return ImportVerdict::Imported;
}

Result<QString> SqliteStore::serverVersion()
{
    return u"SQLite %1 (embedded)"_qs.arg(QString::fromLatin1(sqlite3_libversion()));
}

Result<qint64> SqliteStore::purgeExpired()
{
    const qint64 nowMs = wallMs();
    // In slices, so a purge of a large backlog never holds the write lock for long.
    qint64 removed = 0;
    for (;;) {
        IDEM_PREPARE(purge, "DELETE FROM idem_keys WHERE key IN (SELECT key FROM idem_keys"
                            " WHERE expires_at_ms <= ?1 LIMIT 2000)");
        purge.bind(1, nowMs);
        if (purge.step() != SQLITE_DONE)
            return lastError("purge");
        const int n = sqlite3_changes(m_db);
        removed += n;
        if (n < 2000)
            break;
    }
    // Shared content outlives every record naming it (claimBatch, finishBatch): past its own
    // expiry none does.
    IDEM_PREPARE(shared, "DELETE FROM idem_shared WHERE expires_at_ms <= ?1");
    shared.bind(1, nowMs);
    if (shared.step() != SQLITE_DONE)
        return lastError("purge shared content");
    IDEM_PREPARE(old, "DELETE FROM idem_deliveries WHERE at_ms <= ?1");
    old.bind(1, nowMs - m_options.deliveryRetentionMs);
    if (old.step() != SQLITE_DONE)
        return lastError("purge deliveries");
    return removed;
}

Result<void> SqliteStore::appendDeliveries(const QList<DeliveryEvent> &events)
{
    Transaction tx(m_db, m_inBatch);
    if (!tx.begin())
        return beginError("log");
    for (const DeliveryEvent &e : events) {
        IDEM_PREPARE(insert,
                     "INSERT INTO idem_deliveries (at_ms, endpoint, key, outcome, status,"
                     " latency_us, token, instance, detail, payload, count, type) VALUES (?1, ?2,"
                     " ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)");
        insert.bind(1, e.atMs).bind(2, e.endpoint).bind(3, e.key).bind(4, toString(e.outcome));
        insert.bind(5, qint64(e.status)).bind(6, e.latencyUs).bind(7, e.token).bind(8, e.instance);
        insert.bind(9, e.detail).bind(11, e.count).bindOptional(12, e.type);
        if (!e.payload.isNull())
            insert.bindBlob(10, e.payload);
        if (insert.step() != SQLITE_DONE)
            return lastError("log");
    }
    if (!tx.commit())
        return lastError("commit log");
    return {};
}

Result<QList<DeliveryEvent>> SqliteStore::deliveries(const DeliveryQuery &q)
{
    // One key's through the (key, at_ms) index: with `?2 = '' OR key = ?2` SQLite walked the whole
    // log by time for each key (0.1 s a key at 188k deliveries: an export of many keys for hours).
    static constexpr const char *kAll =
        "SELECT at_ms, endpoint, key, outcome, status, latency_us, token, instance, detail,"
        " payload, count, type FROM idem_deliveries WHERE at_ms >= ?1 AND at_ms < ?5"
        " AND (?3 = '' OR endpoint = ?3) ORDER BY at_ms DESC, id DESC LIMIT ?4";
    static constexpr const char *kOfKey =
        "SELECT at_ms, endpoint, key, outcome, status, latency_us, token, instance, detail,"
        " payload, count, type FROM idem_deliveries WHERE key = ?2 AND at_ms >= ?1 AND at_ms < ?5"
        " AND (?3 = '' OR endpoint = ?3) ORDER BY at_ms DESC, id DESC LIMIT ?4";
    IDEM_PREPARE(select, q.key.isEmpty() ? kAll : kOfKey);
    select.bind(1, q.sinceMs).bind(2, q.key).bind(3, q.endpoint).bind(4, qint64(q.limit));
    select.bind(5, q.untilBound()); // a bound of the index's range, not a filter after it
    QList<DeliveryEvent> events;
    int rc;
    while ((rc = select.step()) == SQLITE_ROW) {
        DeliveryEvent e;
        e.atMs = select.i64(0);
        e.endpoint = select.text(1);
        e.key = select.text(2);
        e.outcome = outcomeFromString(select.text(3)).value_or(Outcome::Rejected);
        e.status = int(select.i64(4));
        e.latencyUs = select.i64(5);
        e.token = select.i64(6);
        e.instance = select.text(7);
        e.detail = select.text(8);
        e.payload = select.bytes(9);
        e.count = deliveryCount(select.i64(10));
        e.type = select.text(11);
        events.append(std::move(e));
    }
    if (rc != SQLITE_DONE)
        return lastError("deliveries");
    return events;
}

// The file the connection opened is no longer at its path (SQLITE_FCNTL_HAS_MOVED: deleted,
// renamed, replaced — or a stat that failed): a claim would be decided on a file another desk
// (or this one, restarted) does not see, which claims the same keys again. Refused, and checked
// again on every call, so putting the file back ends it; opening the path anew is left to a
// restart (a renamed store opened anew would be an empty one; a backup moved in beside the old
// -wal file is damaged by it).
Result<void> SqliteStore::fileInPlace() const
{
    int moved = 0;
    if (sqlite3_file_control(m_db, "main", SQLITE_FCNTL_HAS_MOVED, &moved) != SQLITE_OK || !moved)
        return {};
    return makeError(
        ErrorCode::Internal,
        u"the SQLite file %1 is no longer at its path (deleted, renamed or replaced while the desk "
        u"had it open): nothing is claimed until it is put back or the desk is restarted"_qs.arg(
            QString::fromUtf8(sqlite3_db_filename(m_db, "main"))));
}

Result<void> SqliteStore::ping()
{
    if (auto inPlace = fileInPlace(); !inPlace)
        return inPlace.error();
    IDEM_PREPARE(ping, "SELECT 1");
    if (ping.step() != SQLITE_ROW)
        return lastError("ping");
    return {};
}

} // namespace idem

namespace idem {

Result<void> SqliteStore::ready()
{
    if (auto inPlace = fileInPlace(); !inPlace)
        return inPlace.error();
    IDEM_PREPARE(version, "PRAGMA user_version");
    if (version.step() != SQLITE_ROW)
        return lastError("ready");
    return schemaCurrent(u"SQLite"_qs, version.i64(0), qint64(std::size(kSchemaSteps)));
}

} // namespace idem
