-- What a batch delivery's events have in common (IdempotencyStore::claimBatch, finishBatch: the
-- request's headers, the app's answer), written before the records that name it: P
-- shared:<sha256> holds the content, named by its own hash, so whoever writes the name writes
-- the same bytes. A record names it where it would hold it ({"shared":"<sha256>"} in field q in
-- place of the headers' JSON, in field s in place of the result's, its body then empty). It must
-- outlive every record naming it, so its expiry only ever moves later: to at least ARGV[2] ms
-- from now (the records' TTL and a grace, which covers the clocks of other cluster nodes).
-- KEYS: P shared:<sha256>   ARGV: content, ms to live at least
local left = redis.call('PTTL', KEYS[1])
if left == -2 then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
elseif left >= 0 and left < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 1
