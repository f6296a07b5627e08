-- finish: complete or fail a claim; only the holder of the current fencing token may
-- (the twin of decideFinish()). Sent again after a lost answer, the same token and result find
-- the key already finished: 'repeated', not a refusal.
-- ARGV: prefix key token state(completed|failed) res_status res_headers res_body error history_cap
-- Returns the verdict: accept | repeated | stale-token | not-processing | missing.
local prefix, key, token, newState = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local now = clockMs()
local rk = prefix .. 'k:' .. key
local cur = redis.call('HMGET', rk, 'state', 'token', 'expires_at', 'endpoint', 'history')
if not cur[1] or tonumber(cur[3]) <= now then
  return 'missing'
end
if cur[2] ~= token then
  return 'stale-token'
end
if cur[1] ~= 'processing' then
  if cur[1] == newState then
    local stored = redis.call('HMGET', rk, 'res_status', 'res_body')
    if stored[1] == ARGV[5] and stored[2] == ARGV[7] then
      return 'repeated'
    end
  end
  return 'not-processing'
end
local history = appendHistory(cur[5], {at = now, event = newState, token = tonumber(token),
                                       detail = ARGV[8]}, tonumber(ARGV[9]))
redis.call('HSET', rk, 'state', newState, 'updated', fmt(now), 'lease_until', 0,
           'res_status', ARGV[5], 'res_headers', ARGV[6], 'res_body', ARGV[7], 'error', ARGV[8],
           'history', history)
moveState(prefix, key, cur[4], 'processing', newState, now)
return 'accept'
