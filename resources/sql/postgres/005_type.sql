-- Idempotency Desk, PostgreSQL schema version 5: each key's event type (Provider::eventType),
-- NULL when its delivery named none and on the keys written before. `keys list --type T` and
-- the window's type filter read a type's keys, newest first, from idem_keys_type, never the
-- other rows; keys without a type are not in it. The delivery log keeps each delivery's type
-- too. Adding a column without a default rewrites nothing; the index is built in this
-- transaction, while claims wait (about a second per 100,000 keys).
ALTER TABLE idem_keys ADD COLUMN IF NOT EXISTS type text;
CREATE INDEX IF NOT EXISTS idem_keys_type ON idem_keys (type, updated_ms DESC, key DESC)
    WHERE type IS NOT NULL;
ALTER TABLE idem_deliveries ADD COLUMN IF NOT EXISTS type text;
INSERT INTO idem_schema (version) VALUES (5) ON CONFLICT DO NOTHING;
