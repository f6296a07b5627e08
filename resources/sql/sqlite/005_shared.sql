-- Idempotency Desk, SQLite schema version 5: what a batch delivery's events have in common (the
-- request's headers, the app's answer: SendGrid), kept once for all their records, which name it
-- by its SHA-256 ({"shared":"<hex>"} in place of req_headers, or of res_headers with res_body
-- empty). Kept in each record, a batch of many small events grew the store by the headers and
-- the answer once per event. A row lives at least as long as every record naming it: the batch
-- that writes those records moves its expires_at_ms past theirs, in their transaction; purge
-- drops it after.
CREATE TABLE IF NOT EXISTS idem_shared (
    sha256        TEXT PRIMARY KEY,
    content       BLOB NOT NULL,
    expires_at_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS idem_shared_expires ON idem_shared (expires_at_ms);
