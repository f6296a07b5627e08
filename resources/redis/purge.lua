-- purge: drop expired records and their index entries, a slice at a time.
-- ARGV: prefix now limit. Returns how many keys were removed.
local prefix, now, limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local expired = redis.call('ZRANGEBYSCORE', prefix .. 'i:exp', '-inf', fmt(now), 'LIMIT', 0, limit)
for _, key in ipairs(expired) do
  redis.call('DEL', prefix .. 'k:' .. key) -- native expiry may not have run yet
  unindex(prefix, key)
end
return #expired
