-- purge: drop expired records and their index entries, a slice at a time.
-- ARGV: prefix limit. Returns how many keys were removed. Expiry is decided on Redis's clock.
local prefix, limit = ARGV[1], tonumber(ARGV[2])
local now = clockMs()
local expired = redis.call('ZRANGEBYSCORE', prefix .. 'i:exp', '-inf', fmt(now), 'LIMIT', 0, limit)
for _, key in ipairs(expired) do
  redis.call('DEL', prefix .. 'k:' .. key) -- native expiry may not have run yet
  unindex(prefix, key)
end
return #expired
