-- lock: the migration lock (P migrating) renewed or let go by the desk that holds it and by no
-- other: a desk that lost it (paused past its lifetime) must neither renew nor delete the lock of
-- the desk that took over.
-- KEYS: P migrating
-- ARGV: the holder's value, then the new lifetime in ms, or 0 to let it go
-- Returns 1 when this holder had it (renewed, or let go), 0 when it did not.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[2] == '0' then
  redis.call('DEL', KEYS[1])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 1
