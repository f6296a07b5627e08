-- Idempotency Desk, SQLite schema version 4: an entry of the delivery log may stand for many
-- deliveries (a summary of rejected ones past the endpoint's budget, IdempotencyEngine), so
-- counting readers add `count`; every entry written before counts as 1. Applied once, under
-- the version check of the same transaction (ADD COLUMN has no IF NOT EXISTS in SQLite).
ALTER TABLE idem_deliveries ADD COLUMN count INTEGER NOT NULL DEFAULT 1;
