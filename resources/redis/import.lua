-- import: write a record exported from another store (`keys import`), with its indexes; a live
-- key is left alone. The token is this store's (INCR), expiry and lease are counted from TIME.
-- ARGV: prefix key endpoint provider state fingerprint attempts created updated lease_ms ttl_ms
--       req_method req_path req_headers req_body res_status res_headers res_body error history
-- Returns the new token, or 0 when the key exists.
local prefix, key, endpoint, state = ARGV[1], ARGV[2], ARGV[3], ARGV[5]
local now = clockMs()
local rk = prefix .. 'k:' .. key
local expires = tonumber(redis.call('HGET', rk, 'expires_at') or '0')
if expires > now then
  return 0
end
if redis.call('ZSCORE', prefix .. 'i:exp', key) then
  unindex(prefix, key)
end
redis.call('DEL', rk)
local token = redis.call('INCR', prefix .. 'tokens')
local leaseUntil = 0
if state == 'processing' then
  leaseUntil = now + tonumber(ARGV[10])
end
local expiresAt = now + tonumber(ARGV[11])
redis.call('HSET', rk, 'key', key, 'endpoint', endpoint, 'provider', ARGV[4], 'state', state,
           'fingerprint', ARGV[6], 'token', token, 'attempts', ARGV[7], 'created', ARGV[8],
           'updated', ARGV[9], 'lease_until', fmt(leaseUntil), 'expires_at', fmt(expiresAt),
           'req_method', ARGV[12], 'req_path', ARGV[13], 'req_headers', ARGV[14], 'req_body', ARGV[15],
           'res_status', ARGV[16], 'res_headers', ARGV[17], 'res_body', ARGV[18], 'error', ARGV[19],
           'history', ARGV[20])
redis.call('PEXPIREAT', rk, fmt(expiresAt))
index(prefix, key, endpoint, state, tonumber(ARGV[9]), expiresAt)
return token
