#include "store/postgresstore.h"

#include <QFile>
#include <QJsonDocument>

#include <pqxx/pqxx>

namespace idem {

namespace {

constexpr long kSchemaLock = 0x1de3de5c; // pg_advisory_xact_lock key for schema changes

const char *const kColumns =
    "key, endpoint, provider, state, fingerprint, token, attempts, created_ms, updated_ms,"
    " lease_until_ms, expires_at_ms, req_method, req_path, req_headers, req_body, res_status,"
    " res_headers, res_body, error, history";

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
        r.request.headers = headersFromJson(parseJsonArray(text(row[13]).toUtf8()));
        r.request.body = bytes(row[14]);
        r.result.headers = headersFromJson(parseJsonArray(text(row[16]).toUtf8()));
        r.result.body = bytes(row[17]);
        r.history = historyFromJson(parseJsonArray(text(row[19]).toUtf8()));
    }
    return r;
}

} // namespace

QString globToPosixRegex(const QString &glob)
{
    QString re = u"^"_qs;
    for (qsizetype i = 0; i < glob.size(); ++i) {
        const QChar c = glob.at(i);
        if (c == u'*') {
            re += u".*"_qs;
        } else if (c == u'?') {
            re += u'.';
        } else if (c == u'[') {
            const qsizetype close = glob.indexOf(u']', i + 1);
            if (close < 0) {
                re += u"\\["_qs;
                continue;
            }
            QString set = glob.mid(i + 1, close - i - 1);
            if (set.startsWith(u'!'))
                set[0] = u'^';
            re += u'[' + set.replace(u"\\"_qs, u"\\\\"_qs) + u']';
            i = close;
        } else if (QStringLiteral("\\.^$|()+{}").contains(c)) {
            re += u'\\';
            re += c;
        } else {
            re += c;
        }
    }
    return re + u'$';
}

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
        QFile schema(u":/sql/postgres/001_init.sql"_qs);
        if (!schema.open(QIODevice::ReadOnly))
            return makeError(ErrorCode::Internal, u"the PostgreSQL schema resource is missing"_qs);
        pqxx::work w(c);
        w.exec("SELECT pg_advisory_xact_lock(" + std::to_string(kSchemaLock) + ")");
        const bool present = w.exec1("SELECT to_regclass('idem_schema') IS NOT NULL")[0].as<bool>();
        const bool current = present && w.exec1("SELECT count(*) FROM idem_schema WHERE version >= 1")[0].as<int>() > 0;
        if (!current)
            w.exec(schema.readAll().toStdString());
        w.commit();

        const std::string cols = kColumns;
        c.prepare("claim_insert",
                  "WITH t AS (SELECT nextval('idem_tokens') AS token)"
                  " INSERT INTO idem_keys (key, endpoint, provider, state, fingerprint, token, attempts,"
                  " created_ms, updated_ms, lease_until_ms, expires_at_ms, req_method, req_path,"
                  " req_headers, req_body, history)"
                  " SELECT $1, $2, $3, 'processing', $4, t.token, 1, $5, $5, $6, $7, $8, $9, $10, $11,"
                  " json_build_array(json_build_object('at', $5::bigint, 'event', 'claimed', 'token', t.token))::text"
                  " FROM t ON CONFLICT (key) DO NOTHING RETURNING token");
        c.prepare("select_for_update", "SELECT " + cols + " FROM idem_keys WHERE key = $1 FOR UPDATE");
        c.prepare("select", "SELECT " + cols + " FROM idem_keys WHERE key = $1");
        c.prepare("next_token", "SELECT nextval('idem_tokens')");
        c.prepare("replace",
                  "UPDATE idem_keys SET endpoint = $2, provider = $3, state = 'processing', fingerprint = $4,"
                  " token = $5, attempts = $6, created_ms = $7, updated_ms = $8, lease_until_ms = $9,"
                  " expires_at_ms = $10, req_method = $11, req_path = $12, req_headers = $13, req_body = $14,"
                  " res_status = 0, res_headers = '[]', res_body = '', error = '', history = $15 WHERE key = $1");
        c.prepare("touch", "UPDATE idem_keys SET attempts = attempts + 1, updated_ms = $2 WHERE key = $1");
        // A duplicate of a completed key, or of one whose lease is live, with the same payload:
        // answered in one statement (decideClaim() says Replay / InProgress for these rows).
        c.prepare("touch_duplicate",
                  "UPDATE idem_keys SET attempts = attempts + 1, updated_ms = $2 WHERE key = $1 AND fingerprint = $3"
                  " AND expires_at_ms > $2 AND (state = 'completed' OR (state = 'processing' AND lease_until_ms > $2))"
                  " RETURNING " + cols);
        c.prepare("finish",
                  "UPDATE idem_keys SET state = $3, updated_ms = $4, lease_until_ms = 0, res_status = $5,"
                  " res_headers = $6, res_body = $7, error = $8,"
                  " history = (history::jsonb || jsonb_build_array(jsonb_build_object('at', $4::bigint,"
                  " 'event', $3::text, 'token', $2::bigint, 'detail', $8::text)))::text"
                  " WHERE key = $1 AND token = $2 AND state = 'processing' AND expires_at_ms > $4");
        c.prepare("operator_update",
                  "UPDATE idem_keys SET state = $2, updated_ms = $3, lease_until_ms = 0,"
                  " error = CASE WHEN $2 = 'failed' THEN $4 ELSE error END, history = $5 WHERE key = $1");
        c.prepare("delete", "DELETE FROM idem_keys WHERE key = $1");
        c.prepare("purge", "DELETE FROM idem_keys WHERE key IN (SELECT key FROM idem_keys"
                           " WHERE expires_at_ms <= $1 LIMIT 5000)");
        c.prepare("purge_deliveries", "DELETE FROM idem_deliveries WHERE at_ms <= $1");
        c.prepare("count", "SELECT state, count(*) FROM idem_keys WHERE expires_at_ms > $1"
                           " AND ($2 = '' OR endpoint = $2) GROUP BY state");
        c.prepare("log", "INSERT INTO idem_deliveries (at_ms, endpoint, key, outcome, status, latency_us,"
                         " token, instance, detail, payload) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)");
        c.prepare("deliveries", "SELECT at_ms, endpoint, key, outcome, status, latency_us, token, instance,"
                                " detail, payload FROM idem_deliveries WHERE at_ms >= $1 AND ($2 = '' OR key = $2)"
                                " AND ($3 = '' OR endpoint = $3) ORDER BY at_ms DESC, id DESC LIMIT $4");
        return {};
    });
    if (!ready)
        return ready.error();
    return store;
}

Result<ClaimResult> PostgresStore::claim(const ClaimRequest &req)
{
    return guarded("claim", true, [&]() -> Result<ClaimResult> {
        const std::string key = s(req.key);
        const std::string headers = s(compactJson(headersToJson(req.request.headers)));
        for (int attempt = 0; attempt < 3; ++attempt) {
            {
                // The common case, a new key: one statement, atomic on its own.
                pqxx::nontransaction n(m_conn->c);
                const pqxx::result inserted = n.exec_prepared(
                    "claim_insert", key, s(req.endpoint), s(req.provider), s(req.fingerprint), req.nowMs,
                    req.nowMs + req.policy.leaseMs, req.nowMs + req.policy.ttlMs, s(req.request.method),
                    s(req.request.path), headers, bin(req.request.body));
                if (!inserted.empty()) {
                    ClaimResult result;
                    result.decision = {ClaimAction::Create, Outcome::Processed};
                    KeyRecord &r = result.record;
                    r.key = req.key;
                    r.endpoint = req.endpoint;
                    r.provider = req.provider;
                    r.state = KeyState::Processing;
                    r.fingerprint = req.fingerprint;
                    r.token = inserted[0][0].as<qint64>();
                    r.attempts = 1;
                    r.createdMs = r.updatedMs = req.nowMs;
                    r.leaseUntilMs = req.nowMs + req.policy.leaseMs;
                    r.expiresAtMs = req.nowMs + req.policy.ttlMs;
                    r.request = req.request;
                    r.history = {{req.nowMs, u"claimed"_qs, r.token, {}}};
                    return result;
                }
            }
            {
                pqxx::nontransaction n(m_conn->c);
                const pqxx::result touched = n.exec_prepared("touch_duplicate", key, req.nowMs, s(req.fingerprint));
                if (!touched.empty()) {
                    ClaimResult result;
                    result.record = recordFrom(touched[0], true);
                    // The row as it was: the update only counted this delivery.
                    KeyRecord before = result.record;
                    before.attempts -= 1;
                    result.decision = decideClaim(&before, req.fingerprint, req.nowMs, req.policy);
                    if (result.decision.action == ClaimAction::Replay || result.decision.action == ClaimAction::InProgress)
                        return result;
                    // Not reachable with the statement's conditions; counted once too many at worst.
                }
            }
            // The key exists: lock it, decide, apply, in one transaction.
            pqxx::work w(m_conn->c);
            const pqxx::result rows = w.exec_prepared("select_for_update", key);
            if (rows.empty())
                continue; // deleted or purged in between: nothing written, try the insert again
            const KeyRecord current = recordFrom(rows[0], true);
            ClaimResult result;
            result.decision = decideClaim(&current, req.fingerprint, req.nowMs, req.policy);
            switch (result.decision.action) {
            case ClaimAction::Create:
            case ClaimAction::Reclaim: {
                const KeyRecord r = claimedRecord(&current, req, result.decision,
                                                  w.exec_prepared1("next_token")[0].as<qint64>());
                w.exec_prepared("replace", key, s(r.endpoint), s(r.provider), s(r.fingerprint), r.token,
                                r.attempts, r.createdMs, r.updatedMs, r.leaseUntilMs, r.expiresAtMs,
                                s(r.request.method), s(r.request.path), headers, bin(r.request.body),
                                s(compactJson(historyToJson(r.history))));
                result.record = r;
                break;
            }
            case ClaimAction::Replay:
            case ClaimAction::InProgress:
                w.exec_prepared("touch", key, req.nowMs);
                result.record = current;
                result.record.attempts += 1;
                result.record.updatedMs = req.nowMs;
                break;
            case ClaimAction::Mismatch:
                result.record = current;
                w.abort();
                return result;
            }
            w.commit();
            return result;
        }
        return makeError(ErrorCode::Unavailable, u"PostgreSQL: the key kept changing under the claim"_qs);
    });
}

Result<FinishVerdict> PostgresStore::finish(const FinishRequest &req)
{
    return guarded("finish", true, [&]() -> Result<FinishVerdict> {
        pqxx::nontransaction n(m_conn->c);
        const pqxx::result updated = n.exec_prepared(
            "finish", s(req.key), req.token, s(toString(req.state)), req.nowMs, req.result.status,
            s(compactJson(headersToJson(req.result.headers))), bin(req.result.body), s(req.error));
        if (updated.affected_rows() == 1)
            return FinishVerdict::Accept;
        // Refused: say why, with the same rules as every backend.
        const pqxx::result rows = n.exec_prepared("select", s(req.key));
        if (rows.empty())
            return decideFinish(nullptr, req.token, req.nowMs);
        const KeyRecord current = recordFrom(rows[0], false);
        const FinishVerdict verdict = decideFinish(&current, req.token, req.nowMs);
        return verdict == FinishVerdict::Accept ? FinishVerdict::StaleToken : verdict;
    });
}

Result<std::optional<KeyRecord>> PostgresStore::key(const QString &key, qint64 nowMs)
{
    return guarded("read", false, [&]() -> Result<std::optional<KeyRecord>> {
        pqxx::nontransaction n(m_conn->c);
        const pqxx::result rows = n.exec_prepared("select", s(key));
        if (rows.empty())
            return std::optional<KeyRecord>();
        KeyRecord r = recordFrom(rows[0], true);
        if (r.expiredAt(nowMs))
            return std::optional<KeyRecord>();
        return std::optional<KeyRecord>(std::move(r));
    });
}

Result<QList<KeyRecord>> PostgresStore::listKeys(const KeyQuery &q)
{
    return guarded("list", false, [&]() -> Result<QList<KeyRecord>> {
        pqxx::nontransaction n(m_conn->c);
        std::string sql = std::string("SELECT ") + kColumns + " FROM idem_keys WHERE expires_at_ms > "
                          + std::to_string(q.nowMs);
        if (q.state)
            sql += " AND state = " + n.quote(s(toString(*q.state)));
        if (!q.endpoint.isEmpty())
            sql += " AND endpoint = " + n.quote(s(q.endpoint));
        if (!q.glob.isEmpty())
            sql += " AND key ~ " + n.quote(s(globToPosixRegex(q.glob)));
        sql += " ORDER BY updated_ms DESC, key LIMIT " + std::to_string(q.limit) + " OFFSET "
               + std::to_string(q.offset);
        QList<KeyRecord> records;
        for (const auto &row : n.exec(sql))
            records.append(recordFrom(row, false));
        return records;
    });
}

Result<StateCounts> PostgresStore::countKeys(const QString &endpoint, qint64 nowMs)
{
    return guarded("count", false, [&]() -> Result<StateCounts> {
        pqxx::nontransaction n(m_conn->c);
        StateCounts counts;
        for (const auto &row : n.exec_prepared("count", nowMs, s(endpoint))) {
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
                                                     const QString &detail, qint64 nowMs)
{
    return guarded("operator", true, [&]() -> Result<OperatorVerdict> {
        pqxx::work w(m_conn->c);
        const pqxx::result rows = w.exec_prepared("select_for_update", s(key));
        std::optional<KeyRecord> current;
        if (!rows.empty())
            current = recordFrom(rows[0], true);
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

Result<qint64> PostgresStore::purgeExpired(qint64 nowMs)
{
    return guarded("purge", true, [&]() -> Result<qint64> {
        pqxx::nontransaction n(m_conn->c);
        qint64 removed = 0;
        for (;;) {
            const auto r = n.exec_prepared("purge", nowMs);
            removed += r.affected_rows();
            if (r.affected_rows() < 5000)
                break;
        }
        n.exec_prepared("purge_deliveries", nowMs - m_options.deliveryRetentionMs);
        return removed;
    });
}

Result<void> PostgresStore::appendDeliveries(const QList<DeliveryEvent> &events)
{
    return guarded("log", true, [&]() -> Result<void> {
        pqxx::work w(m_conn->c);
        for (const DeliveryEvent &e : events)
            w.exec_prepared("log", e.atMs, s(e.endpoint), s(e.key), s(toString(e.outcome)), e.status,
                            e.latencyUs, e.token, s(e.instance), s(e.detail), bin(e.payload));
        w.commit();
        return {};
    });
}

Result<QList<DeliveryEvent>> PostgresStore::deliveries(const DeliveryQuery &q)
{
    return guarded("deliveries", false, [&]() -> Result<QList<DeliveryEvent>> {
        pqxx::nontransaction n(m_conn->c);
        QList<DeliveryEvent> events;
        for (const auto &row : n.exec_prepared("deliveries", q.sinceMs, s(q.key), s(q.endpoint), q.limit)) {
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
