-- migrate3: one record from layout v2 (a field per column, common.lua) to layout v3 (m h q s e),
-- in place, its expiry kept. Run by `idemdesk migrate` and by a desk at start, after
-- migrate.lua (v1 to v2) where there was a v1. The token counter P{key}:t of v2 stays: v3 reads
-- it as the key's token floor.
-- KEYS: P{key}:r
-- Returns {1, state, endpoint, updated, expires_at} if migrated (the desk indexes it), 0 if
-- there was nothing to (gone, or already v3).
local old = redis.call('HGETALL', KEYS[1])
if #old == 0 then
  return 0
end
local r = {}
for i = 1, #old, 2 do
  r[old[i]] = old[i + 1]
end
if r.m or not r.state then
  return 0
end
local function n(v) return fmt(tonumber(v or '0') or 0) end
local expiresAt = redis.call('PEXPIRETIME', KEYS[1]) -- absolute: kept to the ms
local fields = {'m', packMeta(r.state, n(r.token), n(r.attempts), n(r.created), n(r.updated), n(r.lease_until),
                             n(r.expires_at), r.provider or '', r.endpoint or '', r.fingerprint or ''),
                'h', r.history or '[]', 'q', (r.req_head or ' \n[]') .. '\n' .. (r.req_body or '')}
if r.res_status and r.res_status ~= '' then
  table.insert(fields, 's')
  table.insert(fields, r.res_status .. '\n' .. (r.res_headers or '[]') .. '\n' .. (r.res_body or ''))
end
if r.error and r.error ~= '' then
  table.insert(fields, 'e')
  table.insert(fields, r.error)
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(fields))
if expiresAt > 0 then
  redis.call('PEXPIREAT', KEYS[1], expiresAt)
end
return {1, r.state, r.endpoint or '', n(r.updated), n(r.expires_at)}
