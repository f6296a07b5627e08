#pragma once

#include "store/idempotencystore.h"

#include <memory>

struct sqlite3;

namespace idem {

struct SqliteOptions
{
    int busyTimeoutMs = 5000;
    bool synchronousFull = false; // sqlite:PATH?synchronous=full: a commit survives a power cut
    qint64 deliveryRetentionMs = 7LL * 24 * 3600 * 1000;
};

// The embedded store: one SQLite file in WAL mode. Each transition is one BEGIN IMMEDIATE
// transaction (read, decide, write), so several threads and processes may share the file; in a
// batch (group commit, see IdempotencyStore::beginBatch) it is a savepoint of the batch's.
// With synchronous=NORMAL a committed transition survives a crash of the process (not a power
// cut: WAL checkpoints make it durable on disk a little later); synchronous=FULL survives both.
// Fencing tokens come from a counter row (idem_counters), never from the key's own record.
// The clock is this machine's: every process sharing the file shares it.
class SqliteStore final : public IdempotencyStore
{
public:
    static Result<std::unique_ptr<SqliteStore>> open(const QString &path,
                                                     const SqliteOptions &options = {});
    ~SqliteStore() override;

    Result<ClaimResult> claim(const ClaimRequest &request) override;
    Result<FinishVerdict> finish(const FinishRequest &request) override;
    Result<QList<ClaimResult>> claimBatch(const QList<ClaimRequest> &requests) override;
    Result<QList<FinishVerdict>> finishBatch(const QList<FinishRequest> &requests) override;
    Result<std::optional<KeyRecord>> key(const QString &key) override;
    Result<QList<KeyRecord>> listKeys(const KeyQuery &query) override;
    // A search reads each candidate row's body in place, newest first: no index on the bodies,
    // which every delivery would pay for (docs/stores.md#search).
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
    bool batches() const override { return true; }
    bool beginBatch() override;
    Result<void> endBatch() override;
    // The connection itself, for tests that play SQLite's own faults (a rollback it made itself).
    sqlite3 *handle() const { return m_db; }

private:
    SqliteStore(sqlite3 *db, const SqliteOptions &options);
    class Statement;
    struct Cache;
    Result<void> exec(const char *sql);
    Result<std::optional<KeyRecord>> readKey(const QString &key);
    Error lastError(const char *what) const;
    Result<void> fileInPlace() const;
    // claim() but for a refusal's answer (answerUnwritten); `sharedHeaders`: the record names
    // the request's shared headers (StoredRequest::headersRef) instead of holding them.
    Result<ClaimResult> claimWritten(const ClaimRequest &request, bool sharedHeaders);
    // finish(); `sharedResult`: the record names the shared result (StoredResult::ref).
    Result<FinishVerdict> finishWritten(const FinishRequest &request, bool sharedResult);
    Result<void> writeShared(const QList<SharedContent> &shared);
    Result<std::optional<QByteArray>> readShared(const QByteArray &ref);
    Error beginError(const char *what) const;
    Result<qint64> nextToken(qint64 currentToken);
    template<typename T, typename Request, typename Step>
    Result<QList<T>> inOneTransaction(const QList<Request> &requests, Step step);

    sqlite3 *m_db = nullptr;
    SqliteOptions m_options;
    std::unique_ptr<Cache> m_cache;
    bool m_inBatch = false; // inside beginBatch()/endBatch(): each call is a savepoint
};

} // namespace idem
