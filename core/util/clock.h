#pragma once

#include <QtGlobal>

namespace idem {

// Microseconds on one monotonic clock shared by the whole process (for latencies).
qint64 monotonicUs();
// Milliseconds since the epoch (for records, TTLs and leases shared with other processes).
qint64 wallMs();

} // namespace idem
