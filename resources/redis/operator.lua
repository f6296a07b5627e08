-- operator: reset | force-fail | delete, by the dashboard or the CLI (the twin of decideOperator()).
-- ARGV: prefix key action force(0|1) detail history_cap
-- Returns the verdict: accept | wrong-state | missing.
local prefix, key, action, force, detail = ARGV[1], ARGV[2], ARGV[3], ARGV[4] == '1', ARGV[5]
local now = clockMs()
local rk = prefix .. 'k:' .. key
local cur = redis.call('HMGET', rk, 'state', 'expires_at', 'endpoint', 'history', 'token')
local state = cur[1]
if not state or tonumber(cur[2]) <= now then
  return 'missing'
end
if action == 'delete' then
  redis.call('DEL', rk)
  unindex(prefix, key)
  return 'accept'
end
local to
if action == 'force-fail' then
  if state ~= 'processing' then return 'wrong-state' end
  to = 'failed'
else
  if not (state == 'failed' or (force and state ~= 'reset')) then return 'wrong-state' end
  to = 'reset'
end
local event = 'reset'
if to == 'failed' then event = 'force-failed' end
local history = appendHistory(cur[4], {at = now, event = event, token = tonumber(cur[5]), detail = detail},
                              tonumber(ARGV[6]))
redis.call('HSET', rk, 'state', to, 'updated', fmt(now), 'lease_until', 0, 'history', history)
if to == 'failed' then
  redis.call('HSET', rk, 'error', detail)
end
moveState(prefix, key, cur[3], state, to, now)
return 'accept'
