#include "store/postgresstore.h"

#include <QElapsedTimer>
#include <QFile>
#include <QJsonDocument>

#include <pqxx/pqxx>

#include <algorithm>
#include <cctype>
#include <numeric>

#include <poll.h>

namespace idem {

// The schema's versioned steps, applied in order at connect (the version is how many were).
const char *const kSchemaSteps[] = {":/sql/postgres/001_init.sql", ":/sql/postgres/002_clock.sql",
                                    ":/sql/postgres/003_delivery_count.sql",
                                    ":/sql/postgres/004_shared.sql", ":/sql/postgres/005_type.sql"};

namespace {

constexpr long kSchemaLock = 0x1de3de5c; // pg_advisory_xact_lock key for schema changes

const char *const kColumns =
    "key, endpoint, provider, state, fingerprint, token, attempts, created_ms, updated_ms,"
    " lease_until_ms, expires_at_ms, req_method, req_path, req_headers, req_body, res_status,"
    " res_headers, res_body, error, history, type";

std::string s(const QString &text)
{
    return text.toStdString();
}

std::string s(const QByteArray &bytes)
{
    return bytes.toStdString();
}

pqxx::binarystring bin(const QByteArray &bytes)
{
    return pqxx::binarystring(bytes.constData(), size_t(bytes.size()));
}

QByteArray bytes(const pqxx::field &f)
{
    const pqxx::binarystring b(f);
    return QByteArray(b.get(), qsizetype(b.size()));
}

QString text(const pqxx::field &f)
{
    return QString::fromStdString(f.as<std::string>(std::string()));
}

KeyRecord recordFrom(const pqxx::row &row, bool full)
{
    KeyRecord r;
    r.key = text(row[0]);
    r.endpoint = text(row[1]);
    r.provider = text(row[2]);
    r.type = text(row[20]);
    r.state = keyStateFromString(text(row[3])).value_or(KeyState::Failed);
    r.fingerprint = text(row[4]).toLatin1();
    r.token = row[5].as<qint64>();
    r.attempts = row[6].as<int>();
    r.createdMs = row[7].as<qint64>();
    r.updatedMs = row[8].as<qint64>();
    r.leaseUntilMs = row[9].as<qint64>();
    r.expiresAtMs = row[10].as<qint64>();
    r.result.status = row[15].as<int>();
    r.error = text(row[18]);
    if (full) {
        r.request.method = text(row[11]).toLatin1();
        r.request.path = text(row[12]).toUtf8();
        readStoredHeaders(r.request, text(row[13]).toUtf8());
        r.request.body = bytes(row[14]);
        readStoredResult(r.result, text(row[16]).toUtf8(), bytes(row[17]));
        r.history = historyFromJson(parseJsonArray(text(row[19]).toUtf8()));
    }
    return r;
}

} // namespace

struct PostgresStore::Connection
{
    explicit Connection(const std::string &conninfo) : c(conninfo) {}
    pqxx::connection c;
};

PostgresStore::PostgresStore(std::unique_ptr<Connection> connection, StoreUrl url,
                             PostgresOptions options)
    : m_conn(std::move(connection)), m_url(std::move(url)), m_options(options)
{}

PostgresStore::~PostgresStore() = default;

// Between calls nothing is due from the server (no LISTEN, every answer read): anything readable
// on the socket is its goodbye — a FATAL notice, or the close itself.
bool PostgresStore::connectionDropped()
{
    const int fd = m_conn->c.sock();
    if (fd < 0)
        return true;
    pollfd p{fd, POLLIN | POLLRDHUP, 0};
    return ::poll(&p, 1, 0) != 0;
}

template<typename F>
auto PostgresStore::guarded(const char *what, bool writes, F &&body) -> decltype(body())
{
    const auto fail = [&](ErrorCode code, const char *message) {
        return makeError(code, u"PostgreSQL %1: %2: %3"_qs.arg(m_url.display(), QLatin1String(what),
                                                              QString::fromUtf8(message).trimmed()));
    };
    try {
        return body();
    } catch (const pqxx::in_doubt_error &e) {
        return fail(ErrorCode::InDoubt, e.what());
    } catch (const pqxx::broken_connection &e) {
        return fail(writes ? ErrorCode::InDoubt : ErrorCode::Unavailable, e.what());
    } catch (const std::exception &e) {
        return fail(ErrorCode::Unavailable, e.what());
    }
}

Result<std::unique_ptr<PostgresStore>> PostgresStore::connect(const StoreUrl &url,
                                                              const PostgresOptions &options)
{
    auto quote = [](const QString &v) {
        QString q = v;
        q.replace(u"\\"_qs, u"\\\\"_qs).replace(u"'"_qs, u"\\'"_qs);
        return u"'"_qs + q + u"'"_qs;
    };
    QString conninfo = u"host=%1 port=%2 dbname=%3 connect_timeout=%4 application_name=idemdesk"
                       " keepalives=1 keepalives_idle=5 keepalives_interval=2 keepalives_count=3"
                       " tcp_user_timeout=%5"_qs
                           .arg(quote(url.host))
                           .arg(url.port)
                           .arg(quote(url.database))
                           .arg(options.connectTimeoutSeconds)
                           .arg(options.statementTimeoutMs + 2000);
    if (!url.user.isEmpty())
        conninfo += u" user="_qs + quote(url.user);
    if (!url.password.isEmpty())
        conninfo += u" password="_qs + quote(url.password);
    for (const auto &[name, value] : url.postgresTls) // names checked by StoreUrl::parse
        conninfo += u" "_qs + name + u"="_qs + quote(value);

    std::unique_ptr<Connection> connection;
    try {
        connection = std::make_unique<Connection>(conninfo.toStdString());
    } catch (const std::exception &e) {
        return makeError(ErrorCode::Unavailable, u"cannot connect to PostgreSQL at %1: %2"_qs.arg(
                                                     url.display(), QString::fromUtf8(e.what()).trimmed()));
    }
    std::unique_ptr<PostgresStore> store(new PostgresStore(std::move(connection), url, options));
    auto ready = store->guarded("schema", false, [&]() -> Result<void> {
        pqxx::connection &c = store->m_conn->c;
        {
            pqxx::nontransaction n(c);
            n.exec("SET statement_timeout = " + std::to_string(options.statementTimeoutMs));
        }
        pqxx::work w(c);
        w.exec("SELECT pg_advisory_xact_lock(" + std::to_string(kSchemaLock) + ")");
        const bool present = w.exec1("SELECT to_regclass('idem_schema') IS NOT NULL")[0].as<bool>();
        const int version = present ? w.exec1("SELECT coalesce(max(version), 0) FROM idem_schema")[0].as<int>() : 0;
        for (int v = version; v < int(std::size(kSchemaSteps)); ++v) {
            QFile schema(QString::fromLatin1(kSchemaSteps[v]));
            if (!schema.open(QIODevice::ReadOnly))
                return makeError(ErrorCode::Internal, u"the PostgreSQL schema resource %1 is missing"_qs.arg(schema.fileName()));
            w.exec(schema.readAll().toStdString());
        }
        w.commit();

        const std::string cols = kColumns;
        static_assert(kHistoryCap == 64, "finish below keeps 64 history entries");
        // Every time below is the server's clock (idem_now_ms()), read once per statement.
        c.prepare(
            "claim_insert",
            "WITH t AS (SELECT nextval('idem_tokens') AS token, idem_now_ms() AS now)"
            " INSERT INTO idem_keys (key, endpoint, provider, state, fingerprint, token, attempts,"
            " created_ms, updated_ms, lease_until_ms, expires_at_ms, req_method, req_path,"
            " req_headers, req_body, history, type)"
            " SELECT $1, $2, $3, 'processing', $4, t.token, 1, t.now, t.now, t.now + $5, t.now + "
            "$6, $7, $8, $9, $10,"
            " json_build_array(json_build_object('at', t.now, 'event', 'claimed', 'token', "
            "t.token))::text,"
            " NULLIF($11, '') FROM t ON CONFLICT (key) DO NOTHING RETURNING token, created_ms");
        c.prepare("select_for_update", "SELECT " + cols + ", idem_now_ms() FROM idem_keys WHERE key = $1 FOR UPDATE");
        c.prepare("select", "SELECT " + cols + ", idem_now_ms() FROM idem_keys WHERE key = $1");
        c.prepare("now", "SELECT idem_now_ms()");
        c.prepare("next_token", "SELECT nextval('idem_tokens')");
        c.prepare(
            "replace",
            "UPDATE idem_keys SET endpoint = $2, provider = $3, state = 'processing', fingerprint "
            "= $4,"
            " token = $5, attempts = $6, created_ms = $7, updated_ms = $8, lease_until_ms = $9,"
            " expires_at_ms = $10, req_method = $11, req_path = $12, req_headers = $13, req_body = "
            "$14,"
            " res_status = 0, res_headers = '[]', res_body = '', error = '', history = $15,"
            " type = NULLIF($16, '') WHERE key = $1");
        c.prepare("touch", "UPDATE idem_keys SET attempts = attempts + 1, updated_ms = $2 WHERE key = $1");
        // A duplicate of a completed key, or of one whose lease is live, with the same payload:
        // answered in one statement (decideClaim() says Replay / InProgress for these rows).
        c.prepare("touch_duplicate",
                  "WITH c AS MATERIALIZED (SELECT idem_now_ms() AS now)"
                  " UPDATE idem_keys SET attempts = attempts + 1, updated_ms = c.now FROM c WHERE key = $1 AND fingerprint = $2"
                  " AND expires_at_ms > c.now AND (state = 'completed' OR (state = 'processing' AND lease_until_ms > c.now))"
                  " RETURNING " + cols + ", c.now");
        c.prepare("finish",
                  "WITH c AS MATERIALIZED (SELECT idem_now_ms() AS now)"
                  " UPDATE idem_keys SET state = $3, updated_ms = c.now, lease_until_ms = 0, "
                  "res_status = $4,"
                  " res_headers = $5, res_body = $6, error = $7,"
                  // appendHistory(): the first entry and the newest, kHistoryCap in all.
                  " history = (SELECT CASE WHEN jsonb_array_length(h.a) <= 64 THEN h.a"
                  " ELSE jsonb_build_array(h.a -> 0) || (SELECT jsonb_agg(e.v ORDER BY e.i)"
                  " FROM jsonb_array_elements(h.a) WITH ORDINALITY AS e(v, i) WHERE e.i > "
                  "jsonb_array_length(h.a) - 63)"
                  " END FROM (SELECT idem_keys.history::jsonb || "
                  "jsonb_build_array(jsonb_build_object('at', c.now,"
                  " 'event', $3::text, 'token', $2::bigint, 'detail', $7::text)) AS a) h)::text"
                  " FROM c WHERE key = $1 AND token = $2 AND state = 'processing' AND "
                  "expires_at_ms > c.now");
        c.prepare("operator_update",
                  "UPDATE idem_keys SET state = $2, updated_ms = $3, lease_until_ms = 0,"
                  " error = CASE WHEN $2 = 'failed' THEN $4 ELSE error END, history = $5 WHERE key = $1");
        c.prepare("delete", "DELETE FROM idem_keys WHERE key = $1");
        c.prepare("import_clear",
                  "DELETE FROM idem_keys WHERE key = $1 AND expires_at_ms <= idem_now_ms()");
        c.prepare(
            "import_insert",
            "WITH t AS (SELECT nextval('idem_tokens') AS token, idem_now_ms() AS now)"
            " INSERT INTO idem_keys (key, endpoint, provider, state, fingerprint, token, attempts,"
            " created_ms, updated_ms, lease_until_ms, expires_at_ms, req_method, req_path, "
            "req_headers,"
            " req_body, res_status, res_headers, res_body, error, history, type)"
            " SELECT $1, $2, $3, $4, $5, t.token, $6, $7, $8,"
            " CASE WHEN $4 = 'processing' THEN t.now + $9 ELSE 0 END, t.now + $10,"
            " $11, $12, $13, $14, $15, $16, $17, $18, $19, NULLIF($20, '') FROM t"
            " ON CONFLICT (key) DO NOTHING RETURNING token");
        c.prepare("token_last", "SELECT last_value FROM idem_tokens");
        c.prepare("token_raise",
                  "SELECT setval('idem_tokens', greatest(last_value, $1)) FROM idem_tokens");
        // The expiry is asked again of the row deleted, not only in the slice's list: a claim
        // that re-took an expired row (claimLocked's replace) while the slice was read commits a
        // live row, and READ COMMITTED checks again only the DELETE's own condition on it — the
        // fresh claim was purged, and the next delivery ran the key a second time, in its lease.
        c.prepare("purge", "DELETE FROM idem_keys WHERE key IN (SELECT key FROM idem_keys"
                           " WHERE expires_at_ms <= idem_now_ms() LIMIT 5000)"
                           " AND expires_at_ms <= idem_now_ms()");
        c.prepare("purge_deliveries", "DELETE FROM idem_deliveries WHERE at_ms <= idem_now_ms() - $1");
        // A batch's shared content: written in its records' transaction, kept past every record
        // naming it. The row found or written is held (FOR KEY SHARE: batches do not wait on
        // one another, a purge's DELETE waits) until the records are committed; a purge that
        // took it first leaves no row to hold, and it is written again. Batches whose app
        // answered alike share a row: it is moved only once its grace is used up.
        c.prepare("share", "INSERT INTO idem_shared (sha256, content, expires_at_ms)"
                           " VALUES ($1, $2, idem_now_ms() + $3) ON CONFLICT (sha256) DO NOTHING");
        c.prepare("share_hold", "SELECT expires_at_ms < idem_now_ms() + $2 FROM idem_shared"
                                " WHERE sha256 = $1 FOR KEY SHARE");
        c.prepare("share_longer", "UPDATE idem_shared SET expires_at_ms = idem_now_ms() + $2"
                                  " WHERE sha256 = $1");
        c.prepare("shared", "SELECT content FROM idem_shared WHERE sha256 = $1");
        c.prepare("purge_shared", "DELETE FROM idem_shared WHERE expires_at_ms <= idem_now_ms()");
        c.prepare("count", "SELECT state, count(*) FROM idem_keys WHERE expires_at_ms > idem_now_ms()"
                           " AND ($1 = '' OR endpoint = $1) GROUP BY state");
        c.prepare("log",
                  "INSERT INTO idem_deliveries (at_ms, endpoint, key, outcome, status, latency_us,"
                  " token, instance, detail, payload, count, type) VALUES ($1, $2, $3, $4, $5, $6, "
                  "$7, $8,"
                  " $9, $10, $11, NULLIF($12, ''))");
        // One key's through idem_deliveries_key: with `$2 = '' OR key = $2` a generic plan walks
        // the whole log by time (PostgreSQL picks one after five runs of a statement).
        c.prepare(
            "deliveries",
            "SELECT at_ms, endpoint, key, outcome, status, latency_us, token, instance,"
            " detail, payload, count, type FROM idem_deliveries WHERE at_ms >= $1 AND at_ms < $4"
            " AND ($2 = '' OR endpoint = $2) ORDER BY at_ms DESC, id DESC LIMIT $3");
        c.prepare("deliveries_of_key",
                  "SELECT at_ms, endpoint, key, outcome, status, latency_us, token,"
                  " instance, detail, payload, count, type FROM idem_deliveries WHERE key = $1"
                  " AND at_ms >= $2 AND at_ms < $5 AND ($3 = '' OR endpoint = $3)"
                  " ORDER BY at_ms DESC, id DESC LIMIT $4");
        return {};
    });
    if (!ready)
        return ready.error();
    return store;
}

namespace {
constexpr int kNowColumn = 21; // idem_now_ms() after the record's columns
constexpr int kHitColumn = 21; // findKeys(): after them, the body where it matched (else NULL)
}

std::optional<ClaimResult> PostgresStore::claimLocked(pqxx::transaction_base &w,
                                                      const ClaimRequest &req, bool insertFirst,
                                                      bool sharedHeaders)
{
    const std::string key = s(req.key);
    const std::string headers = s(storedHeadersJson(req.request, sharedHeaders));
    if (insertFirst) {
        const pqxx::result inserted = w.exec_prepared(
            "claim_insert", key, s(req.endpoint), s(req.provider), s(req.fingerprint),
            req.policy.leaseMs, req.policy.ttlMs, s(req.request.method), s(req.request.path),
            headers, bin(req.request.body), s(req.type));
        if (!inserted.empty()) {
            ClaimResult result;
            result.decision = {ClaimAction::Create, Outcome::Processed};
            result.storeNowMs = inserted[0][1].as<qint64>();
            result.record = claimedRecord(nullptr, req, result.decision, inserted[0][0].as<qint64>(), result.storeNowMs);
            return result;
        }
    }
    // The key exists: lock it, decide, apply.
    const pqxx::result rows = w.exec_prepared("select_for_update", key);
    if (rows.empty())
        return std::nullopt; // deleted or purged in between: nothing written, try the insert again
    const KeyRecord current = recordFrom(rows[0], true);
    // The clock after the lock was granted: a wait for the lock does not age the decision.
    const qint64 now = w.exec_prepared1("now")[0].as<qint64>();
    ClaimResult result;
    result.storeNowMs = now;
    result.decision = decideClaim(&current, req.fingerprint, now, req.policy);
    switch (result.decision.action) {
    case ClaimAction::Create:
    case ClaimAction::Reclaim: {
        const KeyRecord r = claimedRecord(&current, req, result.decision,
                                          w.exec_prepared1("next_token")[0].as<qint64>(), now);
        w.exec_prepared("replace", key, s(r.endpoint), s(r.provider), s(r.fingerprint), r.token,
                        r.attempts, r.createdMs, r.updatedMs, r.leaseUntilMs, r.expiresAtMs,
                        s(r.request.method), s(r.request.path), headers, bin(r.request.body),
                        s(compactJson(historyToJson(r.history))), s(r.type));
        result.record = r;
        break;
    }
    case ClaimAction::Replay:
    case ClaimAction::InProgress:
        w.exec_prepared("touch", key, now);
        result.record = current;
        result.record.attempts += 1;
        result.record.updatedMs = now;
        break;
    case ClaimAction::Mismatch:
        result.record = current; // nothing written
        break;
    }
    return result;
}

Result<ClaimResult> PostgresStore::claim(const ClaimRequest &req)
{
    auto claimed = guarded("claim", true, [&]() -> Result<ClaimResult> {
        for (int attempt = 0; attempt < 3; ++attempt) {
            {
                // The common cases first, each one statement, atomic on its own: a new key, and a
                // duplicate of a completed key or of one whose lease is live.
                pqxx::nontransaction n(m_conn->c);
                const pqxx::result inserted = n.exec_prepared(
                    "claim_insert", s(req.key), s(req.endpoint), s(req.provider),
                    s(req.fingerprint), req.policy.leaseMs, req.policy.ttlMs, s(req.request.method),
                    s(req.request.path), s(headersJson(req.request.headers)), bin(req.request.body),
                    s(req.type));
                if (!inserted.empty()) {
                    ClaimResult result;
                    result.decision = {ClaimAction::Create, Outcome::Processed};
                    result.storeNowMs = inserted[0][1].as<qint64>();
                    result.record = claimedRecord(nullptr, req, result.decision, inserted[0][0].as<qint64>(),
                                                  result.storeNowMs);
                    return result;
                }
                const pqxx::result touched = n.exec_prepared("touch_duplicate", s(req.key), s(req.fingerprint));
                if (!touched.empty()) {
                    ClaimResult result;
                    result.record = recordFrom(touched[0], true);
                    result.storeNowMs = touched[0][kNowColumn].as<qint64>();
                    // The row as it was: the update only counted this delivery.
                    KeyRecord before = result.record;
                    before.attempts -= 1;
                    result.decision = decideClaim(&before, req.fingerprint, result.storeNowMs, req.policy);
                    if (result.decision.action == ClaimAction::Replay || result.decision.action == ClaimAction::InProgress)
                        return result;
                    // Not reachable with the statement's conditions; counted once too many at
                    // worst.
                }
            }
            pqxx::work w(m_conn->c);
            auto result = claimLocked(w, req, false, false);
            if (!result)
                continue;
            if (result->decision.action == ClaimAction::Mismatch)
                w.abort();
            else
                w.commit();
            return *result;
        }
        return makeError(ErrorCode::Unavailable, u"PostgreSQL: the key kept changing under the claim"_qs);
    });
    if (!claimed)
        return answerUnwritten(req, claimed.error());
    return claimed;
}

namespace {
// The order in which a batch's rows are locked: by key, so that two batches sharing keys never
// wait on each other in a cycle (a deadlock).
template<typename Request>
QList<qsizetype> lockOrder(const QList<Request> &requests)
{
    QList<qsizetype> order(requests.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](qsizetype a, qsizetype b) { return requests.at(a).key < requests.at(b).key; });
    return order;
}
} // namespace

Result<QList<ClaimResult>> PostgresStore::claimBatch(const QList<ClaimRequest> &requests)
{
    auto claimed = guarded("claim batch", true, [&]() -> Result<QList<ClaimResult>> {
        pqxx::work w(m_conn->c);
        // The shared content first, in the claims' transaction (IdempotencyStore::claimBatch).
        share(w, sharedContentOf(requests));
        QList<ClaimResult> results(requests.size());
        for (qsizetype i : lockOrder(requests)) {
            std::optional<ClaimResult> result;
            for (int attempt = 0; attempt < 3 && !result; ++attempt)
                result = claimLocked(w, requests.at(i), true, true);
            if (!result)
                return makeError(ErrorCode::Unavailable, u"PostgreSQL: the key kept changing under the claim"_qs);
            results[i] = *result;
        }
        w.commit();
        return results;
    });
    if (!claimed)
        return answerUnwritten(requests, claimed.error());
    if (auto filled = fillReplayedFailures(*claimed,
                                           [this](const QByteArray &ref) {
                                               return guarded("read", false, [&] {
                                                   pqxx::nontransaction n(m_conn->c);
                                                   return readShared(n, ref);
                                               });
                                           });
        !filled)
        return filled.error();
    return claimed;
}

void PostgresStore::share(pqxx::transaction_base &t, const QList<SharedContent> &shared)
{
    for (const SharedContent &c : shared) {
        for (;;) {
            t.exec_prepared("share", s(c.ref), bin(c.content), c.ttlMs);
            const pqxx::result held =
                t.exec_prepared("share_hold", s(c.ref), c.ttlMs - kSharedGraceMs);
            if (held.empty())
                continue; // purged between the two: written again
            if (held[0][0].as<bool>())
                t.exec_prepared("share_longer", s(c.ref), c.ttlMs);
            break;
        }
    }
}

Result<std::optional<QByteArray>> PostgresStore::readShared(pqxx::transaction_base &t,
                                                            const QByteArray &ref)
{
    const pqxx::result shared = t.exec_prepared("shared", s(ref));
    if (shared.empty())
        return std::optional<QByteArray>();
    return std::optional<QByteArray>(bytes(shared[0][0]));
}

FinishVerdict PostgresStore::finishIn(pqxx::transaction_base &t, const FinishRequest &req,
                                      bool sharedResult)
{
    const StoredResult result = storedForm(req.result, sharedResult);
    const pqxx::result updated = t.exec_prepared(
        "finish", s(req.key), req.token, s(toString(req.state)), result.status,
        s(storedResultHeadersJson(result, sharedResult)), bin(result.body), s(req.error));
    if (updated.affected_rows() == 1)
        return FinishVerdict::Accept;
    // Refused, or sent again after a lost answer: say which, with the same rules as every backend.
    const pqxx::result rows = t.exec_prepared("select", s(req.key));
    if (rows.empty())
        return FinishVerdict::Missing;
    const KeyRecord current = recordFrom(rows[0], true);
    const FinishVerdict verdict =
        decideFinish(&current, req.token, req.state, result, rows[0][kNowColumn].as<qint64>());
    return verdict == FinishVerdict::Accept ? FinishVerdict::StaleToken : verdict;
}

Result<FinishVerdict> PostgresStore::finish(const FinishRequest &req)
{
    return guarded("finish", true, [&]() -> Result<FinishVerdict> {
        pqxx::nontransaction n(m_conn->c);
        return finishIn(n, req, false);
    });
}

Result<QList<FinishVerdict>> PostgresStore::finishBatch(const QList<FinishRequest> &requests)
{
    return guarded("finish batch", true, [&]() -> Result<QList<FinishVerdict>> {
        pqxx::work w(m_conn->c);
        // The shared result first, in the finishes' transaction (IdempotencyStore::finishBatch).
        share(w, sharedContentOf(requests));
        QList<FinishVerdict> verdicts(requests.size());
        for (qsizetype i : lockOrder(requests))
            verdicts[i] = finishIn(w, requests.at(i), true);
        w.commit();
        return verdicts;
    });
}

Result<qint64> PostgresStore::clockMs()
{
    return guarded("clock", false, [&]() -> Result<qint64> {
        pqxx::nontransaction n(m_conn->c);
        return n.exec_prepared1("now")[0].as<qint64>();
    });
}

Result<std::optional<KeyRecord>> PostgresStore::key(const QString &key)
{
    return guarded("read", false, [&]() -> Result<std::optional<KeyRecord>> {
        pqxx::nontransaction n(m_conn->c);
        const pqxx::result rows = n.exec_prepared("select", s(key));
        if (rows.empty())
            return std::optional<KeyRecord>();
        KeyRecord r = recordFrom(rows[0], true);
        if (r.expiredAt(rows[0][kNowColumn].as<qint64>()))
            return std::optional<KeyRecord>();
        auto resolved =
            resolveShared(r, [&n](const QByteArray &ref) { return readShared(n, ref); });
        if (!resolved)
            return resolved.error();
        return std::optional<KeyRecord>(std::move(r));
    });
}

namespace {
// The WHERE of a key query, its values quoted by `n`.
std::string keyFilter(const pqxx::transaction_base &n, const KeyQuery &q)
{
    std::string sql = " WHERE expires_at_ms > idem_now_ms()";
    if (q.state)
        sql += " AND state = " + n.quote(s(toString(*q.state)));
    if (!q.endpoint.isEmpty())
        sql += " AND endpoint = " + n.quote(s(q.endpoint));
    if (!q.glob.isEmpty())
        sql += " AND key ~ " + n.quote(s(u"^(?:"_qs + keyGlobToRegex(q.glob) + u")$"_qs));
    if (!q.type.isEmpty())
        sql += " AND type = " + n.quote(s(q.type));
    return sql;
}
} // namespace

Result<QList<KeyRecord>> PostgresStore::listKeys(const KeyQuery &q)
{
    return guarded("list", false, [&]() -> Result<QList<KeyRecord>> {
        pqxx::nontransaction n(m_conn->c);
        const std::string sql = std::string("SELECT ") + kColumns + " FROM idem_keys" +
                                keyFilter(n, q) + " ORDER BY updated_ms DESC, key DESC LIMIT " +
                                std::to_string(q.limit) + " OFFSET " + std::to_string(q.offset);
        QList<KeyRecord> records;
        for (const auto &row : n.exec(sql))
            records.append(recordFrom(row, false));
        return records;
    });
}

namespace {
// A search's text as a regular expression (~*) over encode(req_body, 'escape'), which writes a
// backslash as two and a byte 0 or above 0x7f as \ooo: its ASCII letters then match in either
// case, and everything else exactly. It may also match inside an \ooo of the body (a search
// for "303" in "é", \303\251): each match is checked again on the bytes (bodyContains()).
std::string searchPattern(const QString &search)
{
    std::string pattern;
    for (const char c : search.toUtf8()) {
        const uchar b = uchar(c);
        std::string escaped;
        if (b == '\\')
            escaped = "\\\\";
        else if (b == 0 || b > 0x7e)
            escaped = '\\' + std::to_string(b >> 6) + std::to_string((b >> 3) & 7) +
                      std::to_string(b & 7);
        else
            escaped = std::string(1, c);
        for (const char e : escaped) {
            if (!std::isalnum(uchar(e)))
                pattern += '\\';
            pattern += e;
        }
    }
    return pattern;
}
} // namespace

Result<KeyPage> PostgresStore::findKeys(const KeyQuery &q)
{
    std::optional<ListPosition> from;
    if (!q.after.isEmpty() && !(from = ListPosition::parse(q.after)))
        return badListPosition(q.after);
    const bool searching = !q.search.isEmpty();
    // Enough rows for a page, or for a few ms of the server's comparing (~20 µs a 1 KB body).
    const int chunk = searching ? 500 : q.limit + 1;
    const QByteArray needle = searchNeedle(q.search);
    return guarded("find", false, [&]() -> Result<KeyPage> {
        pqxx::nontransaction n(m_conn->c);
        const std::string hit = searching
                                    ? ", CASE WHEN encode(req_body, 'escape') ~* " +
                                          n.quote(searchPattern(q.search)) + " THEN req_body END"
                                    : std::string(", NULL");
        QElapsedTimer spent;
        spent.start();
        KeyPage page;
        for (;;) {
            std::string sql =
                std::string("SELECT ") + kColumns + hit + " FROM idem_keys" + keyFilter(n, q);
            if (from)
                sql += " AND (updated_ms, key) < (" + std::to_string(from->at) + ", " +
                       n.quote(s(from->key)) + ")";
            sql += " ORDER BY updated_ms DESC, key DESC LIMIT " + std::to_string(chunk);
            const pqxx::result rows = n.exec(sql);
            for (const auto &row : rows) {
                if (!searching && page.records.size() == q.limit) { // the row after a full page
                    page.next =
                        ListPosition{page.records.last().updatedMs, page.records.last().key}.text();
                    return page;
                }
                ++page.scanned;
                from = ListPosition{row[8].as<qint64>(), text(row[0])};
                const pqxx::field body = row[kHitColumn];
                if (!searching || (!body.is_null() && bodyContains(bytes(body), needle)))
                    page.records.append(recordFrom(row, false));
                if (searching && page.records.size() == q.limit) {
                    page.next = from->text();
                    return page;
                }
            }
            if (!searching || rows.size() < size_t(chunk))
                return page; // nothing older
            if (q.budgetMs > 0 && spent.elapsed() >= q.budgetMs) {
                page.next = from->text();
                return page;
            }
        }
    });
}

Result<QStringList> PostgresStore::keyNames(const KeyQuery &q)
{
    // One statement: one snapshot, whatever is written meanwhile.
    return guarded("list", false, [&]() -> Result<QStringList> {
        pqxx::nontransaction n(m_conn->c);
        QStringList names;
        for (const auto &row :
             n.exec("SELECT key FROM idem_keys" + keyFilter(n, q) + " ORDER BY key"))
            names << text(row[0]);
        return names;
    });
}

Result<StateCounts> PostgresStore::countKeys(const QString &endpoint)
{
    return guarded("count", false, [&]() -> Result<StateCounts> {
        pqxx::nontransaction n(m_conn->c);
        StateCounts counts;
        for (const auto &row : n.exec_prepared("count", s(endpoint))) {
            const qint64 c = row[1].as<qint64>();
            switch (keyStateFromString(text(row[0])).value_or(KeyState::Failed)) {
            case KeyState::Processing: counts.processing += c; break;
            case KeyState::Completed: counts.completed += c; break;
            case KeyState::Failed: counts.failed += c; break;
            case KeyState::Reset: counts.reset += c; break;
            }
        }
        return counts;
    });
}

Result<OperatorVerdict> PostgresStore::applyOperator(const QString &key, OperatorAction action, bool force,
                                                     const QString &detail)
{
    return guarded("operator", true, [&]() -> Result<OperatorVerdict> {
        pqxx::work w(m_conn->c);
        const pqxx::result rows = w.exec_prepared("select_for_update", s(key));
        std::optional<KeyRecord> current;
        if (!rows.empty())
            current = recordFrom(rows[0], true);
        const qint64 nowMs = w.exec_prepared1("now")[0].as<qint64>();
        const OperatorVerdict verdict = decideOperator(current ? &*current : nullptr, action, force, nowMs);
        if (verdict != OperatorVerdict::Accept)
            return verdict;
        if (action == OperatorAction::Delete) {
            w.exec_prepared("delete", s(key));
        } else {
            const bool reset = action == OperatorAction::Reset;
            QList<HistoryEntry> history = current->history;
            appendHistory(history, {nowMs, reset ? u"reset"_qs : u"force-failed"_qs, current->token, detail});
            w.exec_prepared("operator_update", s(key), reset ? std::string("reset") : std::string("failed"),
                            nowMs, s(detail), s(compactJson(historyToJson(history))));
        }
        w.commit();
        return verdict;
    });
}

Result<ImportVerdict> PostgresStore::importRecord(const KeyRecord &r, qint64 ttlMs, qint64 leaseMs)
{
    return guarded("import", true, [&]() -> Result<ImportVerdict> {
        // The sequence first moves to at least the record's token (the last the app saw), so
        // that nextval, for this record and every later claim of any key, is above it. Under
        // ALTER SEQUENCE's lock, which holds off nextval until the commit: no claim takes a
        // value between the read and the setval that would be handed out again after it. In a
        // transaction of its own (a rollback would not undo setval anyway): in the import's, it
        // would keep that lock while waiting for the key's row, which a claim of the same key
        // may hold while waiting for nextval. Skipped when the sequence is past it already.
        if (pqxx::nontransaction(m_conn->c).exec_prepared1("token_last")[0].as<qint64>() <=
            r.token) {
            pqxx::work raise(m_conn->c);
            raise.exec0("ALTER SEQUENCE idem_tokens NO CYCLE"); // no change: the lock
            raise.exec_prepared("token_raise", r.token);
            raise.commit();
        }
        pqxx::work w(m_conn->c);
        const std::string key = s(r.key);
        w.exec_prepared("import_clear", key); // an expired record is replaced, a live one kept
        const pqxx::result inserted = w.exec_prepared(
            "import_insert", key, s(r.endpoint), s(r.provider), s(toString(r.state)),
            s(r.fingerprint), r.attempts, r.createdMs, r.updatedMs, leaseMs, ttlMs,
            s(r.request.method), s(r.request.path), s(headersJson(r.request.headers)),
            bin(r.request.body), r.result.status, s(headersJson(r.result.headers)),
            bin(r.result.body), s(r.error), s(compactJson(historyToJson(r.history))), s(r.type));
        w.commit();
        return inserted.empty() ? ImportVerdict::Exists : ImportVerdict::Imported;
    });
}

Result<QString> PostgresStore::serverVersion()
{
    return guarded("version", false, [&]() -> Result<QString> {
        pqxx::nontransaction n(m_conn->c);
        return u"PostgreSQL "_qs +
               QString::fromStdString(n.exec1("SHOW server_version")[0].as<std::string>());
    });
}

Result<qint64> PostgresStore::purgeExpired()
{
    return guarded("purge", true, [&]() -> Result<qint64> {
        pqxx::nontransaction n(m_conn->c);
        qint64 removed = 0;
        for (;;) {
            const auto r = n.exec_prepared("purge");
            removed += r.affected_rows();
            if (r.affected_rows() < 5000)
                break;
        }
        n.exec_prepared("purge_deliveries", m_options.deliveryRetentionMs);
        n.exec_prepared("purge_shared");
        return removed;
    });
}

Result<void> PostgresStore::appendDeliveries(const QList<DeliveryEvent> &events)
{
    return guarded("log", true, [&]() -> Result<void> {
        pqxx::work w(m_conn->c);
        for (const DeliveryEvent &e : events)
            w.exec_prepared("log", e.atMs, s(e.endpoint), s(e.key), s(toString(e.outcome)),
                            e.status, e.latencyUs, e.token, s(e.instance), s(e.detail),
                            bin(e.payload), e.count, s(e.type));
        w.commit();
        return {};
    });
}

Result<QList<DeliveryEvent>> PostgresStore::deliveries(const DeliveryQuery &q)
{
    return guarded("deliveries", false, [&]() -> Result<QList<DeliveryEvent>> {
        pqxx::nontransaction n(m_conn->c);
        QList<DeliveryEvent> events;
        const pqxx::result rows =
            q.key.isEmpty()
                ? n.exec_prepared("deliveries", q.sinceMs, s(q.endpoint), q.limit, q.untilBound())
                : n.exec_prepared("deliveries_of_key", s(q.key), q.sinceMs, s(q.endpoint), q.limit,
                                  q.untilBound());
        for (const auto &row : rows) {
            DeliveryEvent e;
            e.atMs = row[0].as<qint64>();
            e.endpoint = text(row[1]);
            e.key = text(row[2]);
            e.outcome = outcomeFromString(text(row[3])).value_or(Outcome::Rejected);
            e.status = row[4].as<int>();
            e.latencyUs = row[5].as<qint64>();
            e.token = row[6].as<qint64>();
            e.instance = text(row[7]);
            e.detail = text(row[8]);
            e.payload = bytes(row[9]);
            e.count = deliveryCount(row[10].as<qint64>());
            e.type = text(row[11]);
            events.append(e);
        }
        return events;
    });
}

Result<void> PostgresStore::ping()
{
    return guarded("ping", false, [&]() -> Result<void> {
        pqxx::nontransaction n(m_conn->c);
        n.exec("SELECT 1");
        return {};
    });
}

} // namespace idem

namespace idem {

Result<void> PostgresStore::ready()
{
    return guarded("ready", false, [&]() -> Result<void> {
        pqxx::nontransaction n(m_conn->c);
        const bool present = n.exec1("SELECT to_regclass('idem_schema') IS NOT NULL")[0].as<bool>();
        const int have =
            present ? n.exec1("SELECT coalesce(max(version), 0) FROM idem_schema")[0].as<int>() : 0;
        return schemaCurrent(u"PostgreSQL"_qs, have, qint64(std::size(kSchemaSteps)));
    });
}

} // namespace idem
