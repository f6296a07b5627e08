-- tombstone: purge's step for a key whose index entry says it expired. Decided here, on the
-- store's clock and atomically, so that a key claimed again meanwhile is left alone.
-- KEYS: P{key}:r
-- Returns 'gone' (nothing there), 'tombstone' (expired: its payloads dropped, its meta kept as
-- the token floor until Redis expires the key, its expires_at 0 so that it stays absent even if
-- the clock steps back) or the live record's expires_at.
local rk = KEYS[1]
local m = readMeta(rk)
if not m then
  return 'gone'
end
local state, token, attempts, created, _, _, expires, _, provider, endpoint, fp = unpackMeta(m, rk)
if tonumber(expires) > clock() then
  return expires
end
if expires ~= '0' then
  redis.call('HDEL', rk, 'q', 's', 'h', 'e')
  redis.call('HSET', rk, 'm', tombstoneMeta(state, token, attempts, created, provider, endpoint, fp))
end
return 'tombstone'
