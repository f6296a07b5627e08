-- Idempotency Desk, PostgreSQL schema version 2: the store's clock. Leases and expiry are
-- decided on the server's clock, never on a desk's, so desks whose clocks disagree keep the
-- guarantee. Declared STABLE so that an index scan on expires_at_ms reads it once; statements
-- that must see one instant throughout read it in a MATERIALIZED CTE. clock_timestamp() rather
-- than now() so a long transaction does not freeze it.
CREATE OR REPLACE FUNCTION idem_now_ms() RETURNS bigint LANGUAGE sql STABLE
    AS $$ SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint $$;
INSERT INTO idem_schema (version) VALUES (2) ON CONFLICT DO NOTHING;
