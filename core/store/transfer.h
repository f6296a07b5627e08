#pragma once

#include "store/idempotencystore.h"

#include <functional>

namespace idem {

// `keys export` / `keys import` (and the window's Export / Import): whole records as JSON Lines,
// one object per key: {"record": {…, "ttl_ms", "lease_ms"}, "request", "result", "history",
// "timeline"}. Bodies are base64, so any bytes survive. Times of the record are kept as they
// were; expiry and lease travel as what was left of them, and are counted again from the
// importing store's clock. Blocking: run on a store worker or the CLI's thread.

// One key as an export line (without the newline); `storeNowMs` is the exporting store's clock.
QByteArray exportLine(const KeyRecord &record, const QList<DeliveryEvent> &timeline,
                      qint64 storeNowMs);

// Exports the `keys` named (or, when empty, every key the filter matches; offset and limit are
// ignored), each with its delivery timeline, handing each line to `write`. Returns how many.
Result<qint64> exportKeys(IdempotencyStore &store, const KeyQuery &filter, const QStringList &keys,
                          const std::function<void(const QByteArray &line)> &write);

struct ImportedLine
{
    QString key;
    ImportVerdict verdict = ImportVerdict::Imported;
};
// Imports one export line: Invalid (with what is wrong) when it is not one; an expired record
// is refused too. A key that exists is left alone and its timeline is not added.
Result<ImportedLine> importLine(IdempotencyStore &store, const QByteArray &line);

} // namespace idem
