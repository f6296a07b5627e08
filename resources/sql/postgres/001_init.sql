-- Idempotency Desk, PostgreSQL schema version 1. Applied at start under an advisory lock, in
-- one transaction; every statement is safe to run twice.
CREATE TABLE IF NOT EXISTS idem_keys (
    key            text PRIMARY KEY,
    endpoint       text NOT NULL,
    provider       text NOT NULL,
    state          text NOT NULL CHECK (state IN ('processing', 'completed', 'failed', 'reset')),
    fingerprint    text NOT NULL,
    token          bigint NOT NULL,
    attempts       integer NOT NULL,
    created_ms     bigint NOT NULL,
    updated_ms     bigint NOT NULL,
    lease_until_ms bigint NOT NULL,
    expires_at_ms  bigint NOT NULL,
    req_method     text NOT NULL DEFAULT '',
    req_path       text NOT NULL DEFAULT '',
    req_headers    text NOT NULL DEFAULT '[]',
    req_body       bytea NOT NULL DEFAULT '',
    res_status     integer NOT NULL DEFAULT 0,
    res_headers    text NOT NULL DEFAULT '[]',
    res_body       bytea NOT NULL DEFAULT '',
    error          text NOT NULL DEFAULT '',
    history        text NOT NULL DEFAULT '[]'
);

-- Fencing tokens: unique across keys and across a key's expiry.
CREATE SEQUENCE IF NOT EXISTS idem_tokens;

CREATE INDEX IF NOT EXISTS idem_keys_updated ON idem_keys (updated_ms DESC);
CREATE INDEX IF NOT EXISTS idem_keys_state_updated ON idem_keys (state, updated_ms DESC);
CREATE INDEX IF NOT EXISTS idem_keys_endpoint_state_updated ON idem_keys (endpoint, state, updated_ms DESC);
CREATE INDEX IF NOT EXISTS idem_keys_expires ON idem_keys (expires_at_ms);

CREATE TABLE IF NOT EXISTS idem_deliveries (
    id         bigserial PRIMARY KEY,
    at_ms      bigint NOT NULL,
    endpoint   text NOT NULL,
    key        text NOT NULL,
    outcome    text NOT NULL,
    status     integer NOT NULL,
    latency_us bigint NOT NULL,
    token      bigint NOT NULL,
    instance   text NOT NULL,
    detail     text NOT NULL DEFAULT '',
    payload    bytea
);

-- The dashboard's time queries, and a key's timeline.
CREATE INDEX IF NOT EXISTS idem_deliveries_at ON idem_deliveries (at_ms DESC);
CREATE INDEX IF NOT EXISTS idem_deliveries_key ON idem_deliveries (key, at_ms DESC);

CREATE TABLE IF NOT EXISTS idem_schema (version integer PRIMARY KEY);
INSERT INTO idem_schema (version) VALUES (1) ON CONFLICT DO NOTHING;
