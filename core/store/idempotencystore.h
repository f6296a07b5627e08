#pragma once

#include "model/keyrecord.h"
#include "model/statemachine.h"
#include "util/result.h"

#include <QList>
#include <QString>

#include <functional>
#include <limits>
#include <optional>

namespace idem {

struct ClaimRequest
{
    QString key;
    QString endpoint;
    QString provider;
    QString type; // the event's type (Provider::eventType), kept with the request
    QByteArray fingerprint;
    StoredRequest request; // kept on the record when this delivery wins the claim
    ClaimPolicy policy;
};

struct ClaimResult
{
    ClaimDecision decision;
    KeyRecord record; // the record after the step (stored result for Replay, lease for InProgress)
    qint64 storeNowMs = 0; // the store's clock when it decided (a lease's time left is measured on it)
    // Not empty: the store refused to write this delivery's count (a full disk, a read-only or
    // out-of-memory server, a lock held past its timeout), and why. The answer (the stored
    // result, in progress, a mismatch) needed no write and is the store's all the same.
    QString uncounted;
    bool claimed() const
    {
        return decision.action == ClaimAction::Create || decision.action == ClaimAction::Reclaim;
    }
};

// The record a Create or Reclaim leaves: `current` is the record before (null when absent), the
// token is the backend's new fencing token, `nowMs` the store's clock. SQLite and PostgreSQL
// write this; claim.lua mirrors it.
KeyRecord claimedRecord(const KeyRecord *current, const ClaimRequest &request,
                        const ClaimDecision &decision, qint64 token, qint64 nowMs);

class IdempotencyStore;
// Resets every failed key (of `endpoint`, or all), a page at a time, telling `onReset` each key.
// Returns how many were reset. Shared by `keys reset --all-failed` and the window.
Result<qint64> resetFailedKeys(IdempotencyStore &store, const QString &endpoint, const QString &detail,
                               const std::function<void(const QString &key)> &onReset = {});

struct FinishRequest
{
    QString key;
    qint64 token = 0;
    KeyState state = KeyState::Completed; // Completed or Failed
    StoredResult result;
    QString error;
    qint64 ttlMs = 0; // the key's TTL: how long a shared result (StoredResult::ref) is kept
};

// How much longer a batch's shared content (StoredRequest::headersRef, StoredResult::ref) is
// kept than the records written with it: it covers the clock readings between its write and the
// records', and on a Redis Cluster the clocks of the nodes holding them. It is kept once per
// batch, so the grace costs little.
constexpr qint64 kSharedGraceMs = 24LL * 3600 * 1000;

// One piece of a batch's shared content, as claimBatch() and finishBatch() write it before the
// records that name it.
struct SharedContent
{
    QByteArray ref;     // its name: sharedRef(content)
    QByteArray content; // request headers' JSON, or sharedResultContent()
    qint64 ttlMs = 0;   // the longest TTL of a record naming it, plus kSharedGraceMs
};
// `result` as a store keeps it in the record: when `shared` and it has a ref, without headers
// and body (decideFinish() compares a finish with the record in this form).
StoredResult storedForm(const StoredResult &result, bool shared);
// The distinct shared content the requests name.
QList<SharedContent> sharedContentOf(const QList<ClaimRequest> &requests);
QList<SharedContent> sharedContentOf(const QList<FinishRequest> &requests);

struct KeyQuery
{
    std::optional<KeyState> state;
    QString endpoint; // empty: all
    QString glob;     // empty: all; shell glob on the whole stored key (keyGlobToRegex)
    QString type;     // empty: all; else the event type, exactly (KeyRecord::type)
    // findKeys() only. Empty: all; else text the stored request body contains, ASCII letters in
    // either case (bodyContains()).
    QString search;
    int limit = 100;
    int offset = 0; // listKeys() only; findKeys() goes on from `after`
    // findKeys(): where the previous page stopped (KeyPage::next); empty: at the newest key.
    QString after;
    // findKeys(): how long one call may read records before it answers with what it found
    // (KeyPage::next then says where to go on); 0: until the page is full or nothing is left.
    int budgetMs = 0;
};

// One page of findKeys(): what matched, newest first, and where to go on.
struct KeyPage
{
    QList<KeyRecord> records; // at most KeyQuery::limit, as listKeys() gives them
    qint64 scanned = 0;       // the records looked at for this page (matching or not)
    // Empty: nothing older matches. Else KeyQuery::after for the next page: the page is full,
    // or the call ran out of its budget before it was (fewer records than the limit, maybe
    // none: the search goes on from here).
    QString next;
};

// Where a findKeys() page stopped: the last key it looked at, in the store's order (newest
// first: `at` descending, then the key; `at` is the last activity on SQL stores, the expiry on
// Redis). As text, KeyPage::next: "<at>:<key>".
struct ListPosition
{
    qint64 at = 0;
    QString key;
    QString text() const { return QString::number(at) + u':' + key; }
    static std::optional<ListPosition> parse(const QString &text);
};
// The error for a KeyQuery::after that no page of this store gave.
Error badListPosition(const QString &after);

// A search's text is at most this many bytes (UTF-8): more finds nothing a shorter part would
// not, and each record read compares it.
constexpr int kMaxSearchBytes = 1024;
// The text a search looks for, as bodyContains() compares it: UTF-8, ASCII letters lower case.
QByteArray searchNeedle(const QString &text);
// Whether `body` contains `needle` (searchNeedle()) with ASCII letters in either case. Other
// bytes compare exactly: a search for "é" finds "é", not "É".
bool bodyContains(QByteArrayView body, QByteArrayView needle);

// KeyQuery::glob (`keys list --match`, the window's filter), alike on every store: `*` any
// characters, '/' included; `?` one character; `[abc]`, `[a-z]` one of a set, `[!abc]` or
// `[^abc]` one not in it (a ']' right after the '[', "[!" or "[^" belongs to the set). Every
// other character, a backslash too, stands for itself, and so does a '[' without its ']':
// `[*]` matches a '*'. As a regular expression without anchors, read alike by PCRE
// (QRegularExpression, with DotMatchesEverythingOption) and PostgreSQL's ~; as SQLite's GLOB.
QString keyGlobToRegex(const QString &glob);
QString keyGlobToSqlite(const QString &glob);

struct StateCounts
{
    qint64 processing = 0;
    qint64 completed = 0;
    qint64 failed = 0;
    qint64 reset = 0;
    qint64 total() const { return processing + completed + failed + reset; }
};

// What importing a record did: written, or left alone because the key is live in the store.
enum class ImportVerdict { Imported, Exists };

struct DeliveryQuery
{
    QString key;      // empty: all keys
    QString endpoint; // empty: all endpoints
    qint64 sinceMs = 0;
    qint64 untilMs = 0; // 0: no bound; else only deliveries before it (at < untilMs)
    int limit = 1000;   // newest first
    // untilMs as the upper end of a range every store compares with (no bound: the largest).
    qint64 untilBound() const { return untilMs > 0 ? untilMs : std::numeric_limits<qint64>::max(); }
};

// One connection to an idempotency store. Every transition is atomic in the store, so any
// number of connections, threads and processes may share one store. An instance is NOT
// thread-safe: it belongs to one thread at a time (StorePool gives each worker its own).
// Errors are values: Unavailable (could not reach / store error) or InDoubt (may have applied).
// Time is the store's: leases and expiry are decided on the clock where the record lives (Redis
// TIME, PostgreSQL clock_timestamp(), the local clock for SQLite), never on a caller's, so
// instances whose clocks disagree keep the guarantee. Fencing tokens come from one counter per
// store that never goes back, so a key deleted or expired and claimed again gets a higher token.
class IdempotencyStore
{
public:
    virtual ~IdempotencyStore() = default;

    // Atomically: read the key, ask decideClaim(), apply. Every delivery counts in `attempts`
    // except a mismatch, which leaves the record untouched.
    virtual Result<ClaimResult> claim(const ClaimRequest &request) = 0;
    // complete/fail, guarded by the fencing token (decideFinish()). Safe to send again after an
    // answer was lost: the same token and result find the key finished and answer Repeated.
    virtual Result<FinishVerdict> finish(const FinishRequest &request) = 0;
    // A SendGrid-style batch: every claim (or finish) applied in one atomic step where the store
    // allows it (one transaction, one MULTI/EXEC), so a failure half-way leaves none applied.
    // Results in the order asked. What the requests name as shared (StoredRequest::headersRef,
    // StoredResult::ref) is written once, before the records (in their transaction where there
    // is one), kept at least as long as every record naming it, and dropped after (by expiry or
    // purgeExpired()); content that cannot be written fails the batch, nothing applied. A
    // replayed failure's result comes back filled in. claim() and finish() keep everything in
    // the record.
    virtual Result<QList<ClaimResult>> claimBatch(const QList<ClaimRequest> &requests);
    virtual Result<QList<FinishVerdict>> finishBatch(const QList<FinishRequest> &requests);
    // The live record, with the shared content it names filled in (StoredRequest::headersRef,
    // StoredResult::ref).
    virtual Result<std::optional<KeyRecord>> key(const QString &key) = 0;
    virtual Result<QList<KeyRecord>> listKeys(const KeyQuery &query) = 0;
    // The keys the query's filters match, newest activity first, a page at a time from
    // `query.after`, within `query.budgetMs`: `keys list --type/--search` and the window's
    // filter (docs/stores.md#search). A type is found through an
    // index where the store has one (SQLite, PostgreSQL); a search reads the stored bodies, so
    // its pages stop on the budget and say where to go on. Keys claimed again during a search
    // may be listed twice or, having moved ahead of it, not at all: a new search finds them.
    // This default: listKeys() pages (no search), `after` holding the offset.
    virtual Result<KeyPage> findKeys(const KeyQuery &query);
    // Every live key's name the filter matches (endpoint, glob and, except on Redis, state;
    // not offset and limit), in one pass that neither loses nor repeats a key living from its
    // start to its end, whatever claims and finishes do meanwhile (`keys export`). It may name
    // keys no longer live too (Redis: its tombstones): the caller reading the records checks
    // their state and expiry. Names only: millions of keys, millions of names.
    virtual Result<QStringList> keyNames(const KeyQuery &filter) = 0;
    virtual Result<StateCounts> countKeys(const QString &endpoint) = 0;
    virtual Result<OperatorVerdict> applyOperator(const QString &key, OperatorAction action,
                                                  bool force, const QString &detail) = 0;
    virtual Result<qint64> purgeExpired() = 0;
    // Writes a record exported from another store (`keys import`), atomically with its indexes:
    // state, fingerprint, attempts, created / updated, request, result, error and history as
    // given; a new fencing token from this store's counter, above the record's own `token` (the
    // last the app saw for the key; at most kMaxImportToken, transfer.h), the counter moved past
    // it, so that every later token of the key (reclaim, claim after a delete or expiry) is
    // above it too; expiry `ttlMs` and, for a processing key, the lease `leaseMs` from now on
    // the store's clock. A live key is left alone (Exists); an expired one is replaced.
    virtual Result<ImportVerdict> importRecord(const KeyRecord &record, qint64 ttlMs,
                                               qint64 leaseMs) = 0;
    // The store server's name and version ("Redis 7.0.15"), for Help → About.
    virtual Result<QString> serverVersion() = 0;
    // Converts records kept in an earlier version's layout (Redis: layouts v1, v2) to the current
    // one, before anything else reads them; answers how many. Run again, it finds none left.
    // Unless `confirmed` (`idemdesk migrate`: the operator says the desks of the previous version
    // are stopped), a store that such a desk may still be writing is refused, not migrated.
    virtual Result<qint64> migrateLayout(bool confirmed = false)
    {
        Q_UNUSED(confirmed);
        return qint64(0);
    }
    // The store's clock, in ms since the epoch: what leases and expiry are measured against.
    virtual Result<qint64> clockMs() = 0;
    // What may lose acknowledged records on this store as it is configured (eviction, no
    // persistence), in words for a log line, `stats` and the status bar. Empty: nothing known.
    virtual Result<QStringList> durabilityWarnings() { return QStringList(); }
    virtual Result<void> appendDeliveries(const QList<DeliveryEvent> &events) = 0;
    // Whether deliveries() of one key reads an index (SQLite, PostgreSQL) or walks the whole
    // log (Redis: its capped stream). An export of many keys reads such a log once.
    virtual bool deliveriesIndexedByKey() const { return true; }
    virtual Result<QList<DeliveryEvent>> deliveries(const DeliveryQuery &query) = 0;
    virtual Result<void> ping() = 0;
    // Ready to take deliveries (/readyz): the store answers and its schema is the one this build
    // writes (not one a newer desk migrated to, nor tables gone). A store without a versioned
    // schema (Redis: its scripts are loaded on use) is ready when it answers.
    virtual Result<void> ready() { return ping(); }
    // ready()'s verdict for a store whose schema is at version `have` while this build writes
    // `want`.
    static Result<void> schemaCurrent(const QString &store, qint64 have, qint64 want);
    // After a claim the store refused with `refused` (Unavailable: it answered, but would not
    // write): a duplicate whose answer needs no write (the stored result, in progress, a
    // mismatch) gets it from a read of the record and the store's clock, uncounted; any other
    // claim, or a read that fails too, gets `refused`. Writes nothing, so runs nothing twice.
    Result<ClaimResult> answerUnwritten(const ClaimRequest &request, const Error &refused);
    Result<QList<ClaimResult>> answerUnwritten(const QList<ClaimRequest> &requests,
                                               const Error &refused);

    // Group commit. A store that has it (SQLite) lets the pool run several calls between
    // beginBatch() and endBatch(): one transaction, each call a savepoint in it, so one commit
    // for all of them. Their callers hear back only after endBatch() succeeded, so an answer
    // never tells of a write that was not kept; after a failed commit the pool runs each call
    // again on its own (StorePool).
    virtual bool batches() const { return false; }
    // True when the connection is known to be gone before anything is sent on it (the server
    // closed it while it sat idle: idle_session_timeout, pg_terminate_backend, a restart): the
    // pool connects again before the call instead of failing it (a delivery's 503).
    virtual bool connectionDropped() { return false; }
    virtual bool beginBatch() { return false; }
    virtual Result<void> endBatch() { return {}; }

protected:
    // The shared content `record` names (StoredRequest::headersRef, StoredResult::ref), filled
    // in: read by `read` (nullopt when the store has none of that name: the record reads
    // without it). Shared content never changes (its name is its hash): the last pieces read are
    // remembered, as a batch's records are often read one after another (export, the window).
    using SharedReader = std::function<Result<std::optional<QByteArray>>(const QByteArray &ref)>;
    Result<void> resolveShared(KeyRecord &record, const SharedReader &read);
    Result<void> resolveShared(StoredResult &result, const SharedReader &read);
    // claimBatch()'s answers that replay a stored failure (the batch answers with the first
    // one), their shared result filled in. A completed key's result is not read: a batch
    // answers for all of its events together.
    Result<void> fillReplayedFailures(QList<ClaimResult> &results, const SharedReader &read);

private:
    Result<std::optional<QByteArray>> sharedContent(const QByteArray &ref,
                                                    const SharedReader &read);
    QList<QPair<QByteArray, QByteArray>> m_sharedRead; // the newest last, a few
};

} // namespace idem
