#pragma once

#include "store/idempotencystore.h"
#include "store/storeurl.h"

#include <memory>
#include <optional>

namespace pqxx {
class transaction_base;
}

namespace idem {

struct PostgresOptions
{
    int connectTimeoutSeconds = 3;
    int statementTimeoutMs = 5000; // every statement; a timeout is an error (503)
    qint64 deliveryRetentionMs = 7LL * 24 * 3600 * 1000;
};

// PostgreSQL (libpqxx 6.4). The versioned schema from resources/sql/postgres is applied at
// connect under an advisory lock. A new key is claimed by one INSERT … ON CONFLICT DO NOTHING
// RETURNING; an existing one is locked (SELECT … FOR UPDATE), decided by decideClaim() and
// updated in the same transaction. complete/fail is one UPDATE guarded by the fencing token.
// Prepared statements; libpqxx's in_doubt_error is reported as InDoubt and never retried.
// Time is the server's (idem_now_ms(), clock_timestamp()); tokens come from one sequence.
// NOT thread-safe: a libpqxx connection is "a world of its own" (one per worker).
class PostgresStore final : public IdempotencyStore
{
public:
    static Result<std::unique_ptr<PostgresStore>> connect(const StoreUrl &url,
                                                          const PostgresOptions &options = {});
    ~PostgresStore() override;

    Result<ClaimResult> claim(const ClaimRequest &request) override;
    bool connectionDropped() override;
    Result<FinishVerdict> finish(const FinishRequest &request) override;
    Result<QList<ClaimResult>> claimBatch(const QList<ClaimRequest> &requests) override;
    Result<QList<FinishVerdict>> finishBatch(const QList<FinishRequest> &requests) override;
    Result<std::optional<KeyRecord>> key(const QString &key) override;
    Result<QList<KeyRecord>> listKeys(const KeyQuery &query) override;
    // A search reads the candidates a chunk at a time, newest first, and the server compares
    // their bodies (no index on them, which every delivery would pay for: docs/stores.md#search);
    // only matching bodies cross the wire, checked here.
    Result<KeyPage> findKeys(const KeyQuery &query) override;
    Result<QStringList> keyNames(const KeyQuery &filter) override;
    Result<StateCounts> countKeys(const QString &endpoint) override;
    Result<OperatorVerdict> applyOperator(const QString &key, OperatorAction action, bool force,
                                          const QString &detail) override;
    Result<qint64> purgeExpired() override;
    Result<ImportVerdict> importRecord(const KeyRecord &record, qint64 ttlMs,
                                       qint64 leaseMs) override;
    Result<QString> serverVersion() override;
    Result<qint64> clockMs() override;
    Result<void> appendDeliveries(const QList<DeliveryEvent> &events) override;
    Result<QList<DeliveryEvent>> deliveries(const DeliveryQuery &query) override;
    Result<void> ping() override;
    Result<void> ready() override;

private:
    struct Connection;
    PostgresStore(std::unique_ptr<Connection> connection, StoreUrl url, PostgresOptions options);
    template<typename F>
    auto guarded(const char *what, bool writes, F &&body) -> decltype(body());
    // `sharedHeaders`: the record names the request's shared headers (StoredRequest::headersRef)
    // instead of holding them; the caller wrote them in `w`.
    static std::optional<ClaimResult> claimLocked(pqxx::transaction_base &w,
                                                  const ClaimRequest &request, bool insertFirst,
                                                  bool sharedHeaders);
    // `sharedResult`: the record names the shared result (StoredResult::ref), written in `t`.
    static FinishVerdict finishIn(pqxx::transaction_base &t, const FinishRequest &request,
                                  bool sharedResult);
    // A batch's shared content written (or kept longer) in `t`; read back.
    static void share(pqxx::transaction_base &t, const QList<SharedContent> &shared);
    static Result<std::optional<QByteArray>> readShared(pqxx::transaction_base &t,
                                                        const QByteArray &ref);

    std::unique_ptr<Connection> m_conn;
    StoreUrl m_url;
    PostgresOptions m_options;
};

} // namespace idem
