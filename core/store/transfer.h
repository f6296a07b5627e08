#pragma once

#include "config/config.h"
#include "store/idempotencystore.h"

#include <QHash>
#include <QIODevice>

#include <atomic>
#include <functional>

namespace idem {

// `keys export` / `keys import` (and the window's Export / Import): whole records as JSON Lines,
// one object per key: {"record": {…, "ttl_ms", "lease_ms"}, "request", "result", "history",
// "timeline"}. Bodies are base64, so any bytes survive. Times of the record are kept as they
// were; expiry and lease travel as what was left of them (measured on the exporting store's
// clock when that record was read), and are counted again from the importing store's clock.
// Blocking: run on a store worker or the CLI's thread.

// The newest deliveries of a key an export line carries, and the most an import takes.
constexpr int kTimelineCap = kHistoryCap;
// The longest TTL and lease an import accepts: the config's own maxima (ttl_seconds,
// lease_seconds).
constexpr qint64 kMaxImportTtlMs = 10LL * 365 * 24 * 3600 * 1000;
constexpr qint64 kMaxImportLeaseMs = 24LL * 3600 * 1000;
// The highest fencing token an import accepts: 2^52, far above any store's (Redis's are µs of
// its clock: 2^52 is the year 2112), and low enough that the importing store's later tokens
// (one above it, and on) stay exact in JSON numbers and Redis's Lua (2^53).
constexpr qint64 kMaxImportToken = qint64(1) << 52;

// One key as an export line (without the newline); `storeNowMs` is the exporting store's clock.
QByteArray exportLine(const KeyRecord &record, const QList<DeliveryEvent> &timeline,
                      qint64 storeNowMs);

struct ExportReport
{
    qint64 written = 0;
    QStringList missing; // keys named that the store does not hold (or no longer)
    // "<key>: <lostSharedContent()>": records not written, as the shared content they name is
    // no longer in the store (the line would carry made-up headers or an empty answer)
    QStringList incomplete;
};
// Exports the `keys` named (or, when empty, every key the filter matches; offset and limit are
// ignored), each with its newest kTimelineCap deliveries, handing each line to `write`. The set
// is consistent while deliveries arrive: the store's keyNames() first (every key live from
// the start to the end of that pass, once), then each record read on its own; a key that
// left the filter (or the store) meanwhile is not written. `cancel`, when set, stops it
// (Cancelled).
Result<ExportReport> exportKeys(IdempotencyStore &store, const KeyQuery &filter,
                                const QStringList &keys,
                                const std::function<void(const QByteArray &line)> &write,
                                const std::atomic<bool> *cancel = nullptr);

struct ImportedLine
{
    QString key;
    ImportVerdict verdict = ImportVerdict::Imported;
};
// Imports one export line, checked as a delivery would be: Invalid (with what is wrong) when
// it is not one — the key as the receiver makes them (endpoint ':' key, printable ASCII, at
// most 255 bytes), a known state, a SHA-256 fingerprint, attempts ≥ 1, a result status for a
// finished key, the TTL and lease in the config's ranges, bodies within the endpoint's
// max_body_bytes / max_response_bytes (the config's defaults for an endpoint it does not
// have). An expired record is refused too. A key that exists is left alone. The line's
// timeline goes into the record's history (events "delivered", marked imported), never into
// this store's delivery log: the live log, stats and Traffic show this desk's deliveries only.
// `earlier`: the keys of the lines before it (key → line number); one of those is refused as a
// duplicate before anything is written.
Result<ImportedLine> importLine(IdempotencyStore &store, const QByteArray &line,
                                const Config &config, const QHash<QString, qint64> &earlier = {});

// The longest line an import reads for `config` (bodies in base64 plus room for the rest).
qint64 maxImportLine(const Config &config);

struct ImportReport
{
    qint64 imported = 0, existing = 0, refused = 0;
    QString stopped; // the store went away: why, and the run ended there
};
// Reads export lines from `in` into the store, one at a time; each line's verdict goes to
// `onLine` (the line number, and the key imported / left alone or the error). A bad line,
// or one the store refused, is reported and the next one is read; when the store itself no
// longer answers the run stops (`stopped`). A line longer than maxImportLine() is refused
// without being kept in memory; a key already on an earlier line of the same input is refused
// as a duplicate.
// `cancel`, when set, stops it before the next line (`stopped` says so).
ImportReport
importLines(IdempotencyStore &store, QIODevice &in, const Config &config,
            const std::function<void(qint64 number, const Result<ImportedLine> &)> &onLine,
            const std::atomic<bool> *cancel = nullptr);

} // namespace idem
