-- unindex: purge's removal of expired keys from an endpoint's i:k, each only if its entry still
-- carries an expiry that has passed: a key claimed again since (its new entry written by the
-- desk meanwhile, scored by its new expiry) keeps it.
-- KEYS: P i:k:<ep>
-- ARGV: now(ms) key...
-- Returns the keys whose entries went (or had none): the desk drops their i:es entries too.
local index, now = KEYS[1], tonumber(ARGV[1])
local removed = {}
for i = 2, #ARGV do
  local score = redis.call('ZSCORE', index, ARGV[i])
  if not score or tonumber(score) <= now then
    if score then
      redis.call('ZREM', index, ARGV[i])
    end
    table.insert(removed, ARGV[i])
  end
end
return removed
