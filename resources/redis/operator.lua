-- operator: reset | force-fail | delete, by the dashboard or the CLI (the twin of decideOperator()).
-- KEYS: P{key}:r  P{key}:t (a deleted record leaves its token there, so that the key claimed
--       again gets a higher one whatever the clock does)
-- ARGV: action force(0|1) detail
-- Returns {'accept', now, endpoint, state before, state after ('' when deleted)} (the desk
-- moves the key in the indexes), or the verdict: wrong-state | missing.
local rk, tk, action, force, detail = KEYS[1], KEYS[2], ARGV[1], ARGV[2] == '1', ARGV[3]
local now = clock()
local cur = redis.call('HMGET', rk, 'm', 'h')
if not cur[1] then
  return 'missing'
end
local state, token, attempts, created, _, _, expires, provider, endpoint, fp = unpackMeta(cur[1], rk)
if tonumber(expires) <= now then
  return 'missing'
end
if action == 'delete' then
  redis.call('DEL', rk)
  if tonumber(redis.call('GET', tk) or '0') < tonumber(token) then
    redis.call('SET', tk, token, 'PXAT', fmt(tonumber(expires) + TOKEN_GRACE_MS))
  end
  return {'accept', fmt(now), endpoint, state, ''}
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
redis.call('HSET', rk, 'm', packMeta(to, token, attempts, created, fmt(now), '0', expires, provider, endpoint, fp),
           'h', appendHistory(cur[2], historyEntry(now, event, token, detail)))
if to == 'failed' then
  redis.call('HSET', rk, 'e', detail)
end
return {'accept', fmt(now), endpoint, state, to}
