-- Idempotency Desk, SQLite schema version 6: each key's event type (Provider::eventType), NULL
-- when its delivery named none and on the keys written before. `keys list --type T` and the
-- window's type filter read a type's keys, newest first, from idem_keys_type, never the other
-- rows; keys without a type are not in it. The delivery log keeps each delivery's type too.
-- Applied once, under the version check of the same transaction (ADD COLUMN has no IF NOT
-- EXISTS in SQLite).
ALTER TABLE idem_keys ADD COLUMN type TEXT;
CREATE INDEX IF NOT EXISTS idem_keys_type ON idem_keys (type, updated_ms) WHERE type IS NOT NULL;
ALTER TABLE idem_deliveries ADD COLUMN type TEXT;
