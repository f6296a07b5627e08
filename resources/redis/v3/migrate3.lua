-- migrate3: one key to layout v3, by `idemdesk migrate` and by a desk at start (after
-- migrate.lua, v1 to v2, where there was a v1): a v2 record rewritten in place (convertV2), or a
-- v2 token counter P{key}:t whose record is gone made the key's tombstone (its token the floor of
-- the next one, until the counter would have expired). Run again on a key already v3, it only
-- answers, so that a migration cut short indexes everything when it runs again.
-- KEYS: P{key}:r  P{key}:t
-- Returns {converted (0|1), state, endpoint, updated, expires_at} of a live record (the desk
-- indexes it), or {converted, ''} when there is none (gone, or a tombstone).
local rk, tk = KEYS[1], KEYS[2]
local converted = 0
local cur = redis.call('HMGET', rk, 'm', 'state')
local m = cur[1]
if m and cur[2] then
  refuseMixed(rk)
end
if not m then
  m = convertV2(rk)
  if m then converted = 1 end
end
local counter = redis.call('GET', tk)
if counter then
  if not m then
    local until_ = redis.call('PEXPIRETIME', tk)
    m = tombstoneMeta('reset', fmt(tonumber(counter)), '0', '0', '', '', '')
    redis.call('HSET', rk, 'm', m)
    if until_ > 0 then
      redis.call('PEXPIREAT', rk, until_)
    else
      redis.call('PEXPIREAT', rk, keyExpiry(clock())) -- a counter without expiry: a day, not forever
    end
    converted = 1
  end
  redis.call('DEL', tk)
end
if not m then
  return {converted, ''}
end
local state, _, _, _, updated, _, expires, _, _, endpoint = unpackMeta(m, rk)
local now = clock()
if tonumber(expires) <= now then
  return {converted, ''}
end
return {converted, state, endpoint, updated, expires}
