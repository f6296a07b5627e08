-- tombstone: purge's step for keys of one bucket and endpoint whose index entries say they
-- expired. Decided here, on the store's clock and atomically with the indexes, so that a key
-- claimed again meanwhile is left alone (its entries already carry its new expiry).
-- KEYS: the bucket's P{tag}:k:<ep>, P{tag}:s:<ep>:processing|failed|reset, then each key's
--       P{tag}:r:<key>
-- ARGV: the keys, in the order of their records in KEYS
-- An expired record keeps only its meta, the token floor, until Redis expires the key; its
-- expires_at becomes 0 so that it stays absent even if the clock steps back. A record already
-- gone (Redis expired it, or it was evicted) leaves its entries too.
-- Returns how many keys left the indexes.
local now = clock()
local removed = 0
for i = 1, #ARGV do
  local rk, key = KEYS[4 + i], ARGV[i]
  local m = redis.call('HGET', rk, 'm')
  if not m then
    redis.call('ZREM', KEYS[1], key)
    for s = 2, 4 do
      redis.call('ZREM', KEYS[s], key)
    end
    removed = removed + 1
  else
    local state, token, attempts, created, _, _, expires, _, provider, endpoint, fp = unpackMeta(m, rk)
    if tonumber(expires) <= now then
      if expires ~= '0' then
        redis.call('HDEL', rk, 'q', 's', 'h', 'e', 't')
        redis.call('HSET', rk, 'm', tombstoneMeta(state, token, attempts, created, provider, endpoint, fp))
      end
      reindex(1, key, state, nil)
      removed = removed + 1
    end
  end
end
return removed
