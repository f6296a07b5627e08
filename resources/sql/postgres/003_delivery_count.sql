-- Idempotency Desk, PostgreSQL schema version 3: an entry of the delivery log may stand for
-- many deliveries (a summary of rejected ones past the endpoint's budget, IdempotencyEngine), so
-- counting readers add `count`; every entry written before counts as 1 (a constant default:
-- no rewrite of the table).
ALTER TABLE idem_deliveries ADD COLUMN IF NOT EXISTS count bigint NOT NULL DEFAULT 1;
INSERT INTO idem_schema (version) VALUES (3) ON CONFLICT DO NOTHING;
