-- import: write a record exported from another store (`keys import`) into layout v2; a live key
-- is left alone. Its fencing token is this store's (newToken, as claim.lua); expiry and lease
-- count from TIME. The desk writes the indexes after it, as for every transition.
-- KEYS: P{key}:r  P{key}:t
-- ARGV: endpoint provider state fingerprint attempts created updated lease_ms ttl_ms
--       req_head req_body res_status res_headers res_body error history
-- Returns {token, expires_at}, or 0 when the key exists and has not expired.
local rk, tk = KEYS[1], KEYS[2]
local now, nowUs = clock()
local cur = redis.call('HMGET', rk, 'expires_at', 'token')
if tonumber(cur[1] or '0') > now then
  return 0
end
local expiresAt = now + tonumber(ARGV[9])
local token = newToken(tk, tonumber(cur[2] or '0'), nowUs, expiresAt)
local leaseUntil = 0
if ARGV[3] == 'processing' then
  leaseUntil = now + tonumber(ARGV[8])
end
redis.call('DEL', rk)
redis.call('HSET', rk, 'endpoint', ARGV[1], 'provider', ARGV[2], 'state', ARGV[3], 'fingerprint', ARGV[4],
           'token', fmt(token), 'attempts', ARGV[5], 'created', ARGV[6], 'updated', ARGV[7],
           'lease_until', fmt(leaseUntil), 'expires_at', fmt(expiresAt), 'req_head', ARGV[10],
           'req_body', ARGV[11], 'res_status', ARGV[12], 'res_headers', ARGV[13], 'res_body', ARGV[14],
           'error', ARGV[15], 'history', ARGV[16])
redis.call('PEXPIREAT', rk, fmt(expiresAt))
return {fmt(token), fmt(expiresAt)}
