-- Idempotency Desk, SQLite schema version 1. Applied inside one transaction when
-- PRAGMA user_version < 1; every statement is also safe to run twice.
CREATE TABLE IF NOT EXISTS idem_keys (
    key            TEXT PRIMARY KEY,
    endpoint       TEXT NOT NULL,
    provider       TEXT NOT NULL,
    state          TEXT NOT NULL CHECK (state IN ('processing', 'completed', 'failed', 'reset')),
    fingerprint    TEXT NOT NULL,
    token          INTEGER NOT NULL,
    attempts       INTEGER NOT NULL,
    created_ms     INTEGER NOT NULL,
    updated_ms     INTEGER NOT NULL,
    lease_until_ms INTEGER NOT NULL,
    expires_at_ms  INTEGER NOT NULL,
    req_method     TEXT NOT NULL DEFAULT '',
    req_path       TEXT NOT NULL DEFAULT '',
    req_headers    TEXT NOT NULL DEFAULT '[]',
    req_body       BLOB,
    res_status     INTEGER NOT NULL DEFAULT 0,
    res_headers    TEXT NOT NULL DEFAULT '[]',
    res_body       BLOB,
    error          TEXT NOT NULL DEFAULT '',
    history        TEXT NOT NULL DEFAULT '[]'
) WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS idem_keys_updated ON idem_keys (updated_ms);
CREATE INDEX IF NOT EXISTS idem_keys_state_updated ON idem_keys (state, updated_ms);
CREATE INDEX IF NOT EXISTS idem_keys_expires ON idem_keys (expires_at_ms);

CREATE TABLE IF NOT EXISTS idem_deliveries (
    id         INTEGER PRIMARY KEY,
    at_ms      INTEGER NOT NULL,
    endpoint   TEXT NOT NULL,
    key        TEXT NOT NULL,
    outcome    TEXT NOT NULL,
    status     INTEGER NOT NULL,
    latency_us INTEGER NOT NULL,
    token      INTEGER NOT NULL,
    instance   TEXT NOT NULL,
    detail     TEXT NOT NULL DEFAULT '',
    payload    BLOB
);

CREATE INDEX IF NOT EXISTS idem_deliveries_at ON idem_deliveries (at_ms);
CREATE INDEX IF NOT EXISTS idem_deliveries_key ON idem_deliveries (key, at_ms);
