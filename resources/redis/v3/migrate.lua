-- migrate: one record from layout v1 (P k:<key>, a hash with key, req_method, req_path,
-- req_headers) to layout v2 (P{key}:r and its token counter P{key}:t, see common.lua). The
-- index entries (P i:s:*, P i:es:*, P i:exp) mean the same in both layouts and stay. Run by
-- `idemdesk migrate` and by a desk at start; only on a single Redis (v1 never ran on a cluster:
-- the old key is in another slot).
-- KEYS: P{key}:r  P{key}:t  P k:<key>
-- ARGV: the v1 token counter (every v1 token is at or below it)
-- Returns 1 if migrated, 0 if there was nothing to (gone, or a v2 record exists: it is newer).
local old = redis.call('HGETALL', KEYS[3])
if #old == 0 then
  return 0
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('DEL', KEYS[3])
  return 0
end
local r = {}
for i = 1, #old, 2 do
  r[old[i]] = old[i + 1]
end
local fields = {'req_head', (r.req_method or '') .. ' ' .. (r.req_path or '') .. '\n' .. (r.req_headers or '[]')}
for _, name in ipairs({'state', 'fingerprint', 'token', 'attempts', 'created', 'updated', 'lease_until',
                       'expires_at', 'endpoint', 'provider', 'req_body', 'res_status', 'res_headers',
                       'res_body', 'error', 'history'}) do
  if r[name] then
    table.insert(fields, name)
    table.insert(fields, r[name])
  end
end
redis.call('HSET', KEYS[1], unpack(fields))
local expiresAt = tonumber(r.expires_at or '0')
redis.call('PEXPIREAT', KEYS[1], fmt(expiresAt))
local token = math.max(tonumber(r.token or '0'), tonumber(ARGV[1]))
if tonumber(redis.call('GET', KEYS[2]) or '0') < token then
  redis.call('SET', KEYS[2], fmt(token), 'PXAT', fmt(expiresAt + TOKEN_GRACE_MS))
end
redis.call('DEL', KEYS[3])
return 1
