-- migrate4: one record of layout v3 (P{<key>}:r) written into the current layout, with its index
-- entries, by `idemdesk migrate` and by a desk at start. The desk read the v3 record and passes
-- its fields; it deletes the v3 key after this answered (v3/drop.lua). A record already there
-- with the same token or a lower one is an earlier pass's copy: replaced. One with a higher
-- token was claimed by a desk of this layout after the migration finished (a migrator that
-- lost its lock, paused past it, writes late): kept, and this answers 0. An expired record (or
-- a v3 tombstone) comes over as a tombstone: only its meta, its token the key's floor.
-- KEYS: P{tag}:r:<key>, then its bucket's P{tag}:k:<ep>, P{tag}:s:<ep>:processing|failed|reset,
--       P{tag}:eps
-- ARGV: key m h q s e key_expiry(ms since the epoch; 0 when the v3 key had none) endpoint(of key)
-- Returns 1 when written, 0 when a newer record was kept.
local rk, key = KEYS[1], ARGV[1]
local state, token, attempts, created, _, _, expires, _, provider, endpoint, fp = unpackMeta(ARGV[2], rk)
local from -- the state of an earlier pass's copy, in the indexes under it
local old = redis.call('HGET', rk, 'm')
if old then
  local oldState, oldToken, _, _, _, _, oldExpires = unpackMeta(old, rk)
  if tonumber(oldToken) > tonumber(token) then
    return 0
  end
  if oldExpires ~= '0' then
    from = oldState
  end
end
redis.call('DEL', rk)
local now = clock()
local keyAt = tonumber(ARGV[7])
if keyAt <= 0 then
  keyAt = tonumber(keyExpiry(math.max(tonumber(expires), now)))
end
if tonumber(expires) <= now then
  redis.call('HSET', rk, 'm', tombstoneMeta(state, token, attempts, created, provider, endpoint, fp))
  if from then
    reindex(2, key, from, nil)
  end
else
  local fields = {'m', ARGV[2], 'h', ARGV[3], 'q', ARGV[4]}
  if ARGV[5] ~= '' then
    table.insert(fields, 's')
    table.insert(fields, ARGV[5])
  end
  if ARGV[6] ~= '' then
    table.insert(fields, 'e')
    table.insert(fields, ARGV[6])
  end
  redis.call('HSET', rk, unpack(fields))
  reindex(2, key, from, state, expires, true)
  redis.call('SADD', KEYS[6], ARGV[8])
end
redis.call('PEXPIREAT', rk, fmt(keyAt))
return 1
