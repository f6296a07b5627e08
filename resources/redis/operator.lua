-- operator: reset | force-fail | delete, by the dashboard or the CLI (the twin of decideOperator()).
-- KEYS: P{key}:r  (the token counter is left alone: it outlives a deleted record)
-- ARGV: action force(0|1) detail
-- Returns {'accept', now, endpoint, state before, state after ('' when deleted)} (the desk
-- moves the key in the indexes), or the verdict: wrong-state | missing.
local rk, action, force, detail = KEYS[1], ARGV[1], ARGV[2] == '1', ARGV[3]
local now = clock()
local cur = redis.call('HMGET', rk, 'state', 'expires_at', 'endpoint', 'history', 'token')
local state = cur[1]
if not state or tonumber(cur[2]) <= now then
  return 'missing'
end
if action == 'delete' then
  redis.call('DEL', rk)
  return {'accept', fmt(now), cur[3], state, ''}
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
redis.call('HSET', rk, 'state', to, 'updated', fmt(now), 'lease_until', 0,
           'history', appendHistory(cur[4], historyEntry(now, event, cur[5], detail)))
if to == 'failed' then
  redis.call('HSET', rk, 'error', detail)
end
return {'accept', fmt(now), cur[3], state, to}
