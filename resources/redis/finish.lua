-- finish: complete or fail a claim; only the holder of the current fencing token may
-- (the twin of decideFinish()). Sent again after a lost answer, the same token and result find
-- the key already finished: 'repeated', not a refusal. TIME, one HMGET, one HSET.
-- KEYS: P{key}:r
-- ARGV: token state(completed|failed) res_status res_headers res_body error
-- Returns {'accept', now, endpoint} (the desk moves the key in the indexes), or the verdict:
-- repeated | stale-token | not-processing | missing.
local rk, token, newState = KEYS[1], ARGV[1], ARGV[2]
local now = clock()
local nowText = fmt(now)
local cur = redis.call('HMGET', rk, 'state', 'token', 'expires_at', 'endpoint', 'history', 'res_status', 'res_body')
if not cur[1] or tonumber(cur[3]) <= now then
  return 'missing'
end
if cur[2] ~= token then
  return 'stale-token'
end
if cur[1] ~= 'processing' then
  if cur[1] == newState and cur[6] == ARGV[3] and cur[7] == ARGV[5] then
    return 'repeated'
  end
  return 'not-processing'
end
redis.call('HSET', rk, 'state', newState, 'updated', nowText, 'lease_until', 0, 'res_status', ARGV[3],
           'res_headers', ARGV[4], 'res_body', ARGV[5], 'error', ARGV[6],
           'history', appendHistory(cur[5], historyEntry(now, newState, token, ARGV[6])))
return {'accept', nowText, cur[4]}
