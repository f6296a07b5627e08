-- import: write a record exported from another store (`keys import`), with its index entries;
-- a live key is left alone. Its fencing token is this store's (newToken, as claim.lua), above the token it
-- carries (the last the app saw for the key) as above a tombstone's: the record, then its
-- tombstone, keep that floor for the key's later tokens. Expiry and lease count from TIME.
-- KEYS: P{tag}:r:<key>, then its bucket's P{tag}:k:<ep>, P{tag}:s:<ep>:processing|failed|reset,
--       P{tag}:eps
-- ARGV: endpoint provider state fingerprint attempts created updated lease_ms ttl_ms
--       request result error history status token key type
--       (request and result: the q and s fields, common.lua; token: the exported one, < 2^53)
-- Returns {token, expires_at}, or 0 when the key exists and has not expired.
local rk = KEYS[1]
local now, nowUs = clock()
local cur = redis.call('HGET', rk, 'm')
local before = tonumber(ARGV[15])
local from
if cur then
  local state, token, _, _, _, _, expires = unpackMeta(cur, rk)
  if tonumber(expires) > now then
    return 0
  end
  before = math.max(before, tonumber(token)) -- a tombstone, or a record expired under its state
  if expires ~= '0' then
    from = state
  end
end
local expiresAt = now + tonumber(ARGV[9])
local token = newToken(before, nowUs)
local leaseUntil = 0
if ARGV[3] == 'processing' then
  leaseUntil = now + tonumber(ARGV[8])
end
redis.call('DEL', rk)
redis.call('HSET', rk, 'm', packMeta(ARGV[3], fmt(token), ARGV[5], ARGV[6], ARGV[7], fmt(leaseUntil), fmt(expiresAt),
                                     ARGV[14], ARGV[2], ARGV[1], ARGV[4]),
           'h', ARGV[13], 'q', ARGV[10], 's', ARGV[11])
if ARGV[12] ~= '' then
  redis.call('HSET', rk, 'e', ARGV[12])
end
if ARGV[17] ~= '' then
  redis.call('HSET', rk, 't', ARGV[17])
end
redis.call('PEXPIREAT', rk, keyExpiry(expiresAt))
reindex(2, ARGV[16], from, ARGV[3], expiresAt, true)
redis.call('SADD', KEYS[6], ARGV[1])
return {fmt(token), fmt(expiresAt)}
