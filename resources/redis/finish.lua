-- finish: complete or fail a claim; only the holder of the current fencing token may
-- (the twin of decideFinish()).
-- ARGV: prefix key token state(completed|failed) now res_status res_headers res_body error history_cap
-- Returns the verdict: accept | stale-token | not-processing | missing.
local prefix, key, token, newState, now = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local rk = prefix .. 'k:' .. key
local cur = redis.call('HMGET', rk, 'state', 'token', 'expires_at', 'endpoint', 'history')
if not cur[1] or tonumber(cur[3]) <= now then
  return 'missing'
end
if cur[2] ~= token then
  return 'stale-token'
end
if cur[1] ~= 'processing' then
  return 'not-processing'
end
local history = appendHistory(cur[5], {at = now, event = newState, token = tonumber(token),
                                       detail = ARGV[9]}, tonumber(ARGV[10]))
redis.call('HSET', rk, 'state', newState, 'updated', fmt(now), 'lease_until', 0,
           'res_status', ARGV[6], 'res_headers', ARGV[7], 'res_body', ARGV[8], 'error', ARGV[9],
           'history', history)
moveState(prefix, key, cur[4], 'processing', newState, now)
return 'accept'
