-- pgbench: the claim and complete statements of the PostgreSQL store, one transaction each.
\set r random(1, 2000000000)
WITH t AS (SELECT nextval('idem_tokens') AS token)
INSERT INTO idem_keys (key, endpoint, provider, state, fingerprint, token, attempts, created_ms, updated_ms,
                       lease_until_ms, expires_at_ms, req_method, req_path, req_headers, req_body, history)
SELECT 'pgbench:' || :client_id || '-' || :r, 'pgbench', 'generic', 'processing', 'fp', t.token, 1, 1, 1, 60000,
       9999999999999, 'POST', '/hooks/pgbench', '[]', convert_to(repeat('x', 1000), 'UTF8'), '[]'
FROM t ON CONFLICT (key) DO NOTHING RETURNING token;
UPDATE idem_keys SET state = 'completed', updated_ms = 2, lease_until_ms = 0, res_status = 200, res_body = '\x7b7d'
WHERE key = 'pgbench:' || :client_id || '-' || :r AND state = 'processing';
