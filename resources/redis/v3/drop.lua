-- drop: the v3 record moved by migrate4.lua goes, unless it changed since it was read (a desk of
-- the previous version still writing: it is moved again on the next pass).
-- KEYS: P{<key>}:r (layout v3)
-- ARGV: its meta line as read
-- Returns 1 when deleted, 0 when it changed.
if redis.call('HGET', KEYS[1], 'm') ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
