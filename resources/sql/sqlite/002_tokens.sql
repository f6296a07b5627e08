-- Idempotency Desk, SQLite schema version 2: fencing tokens from one counter for the whole
-- store, so a key that was deleted or expired and is claimed again never gets a token an older
-- worker still holds. Starts above every token already stored or logged.
CREATE TABLE IF NOT EXISTS idem_counters (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
INSERT OR IGNORE INTO idem_counters (name, value)
    SELECT 'token', max(coalesce((SELECT max(token) FROM idem_keys), 0), coalesce((SELECT max(token) FROM idem_deliveries), 0));
