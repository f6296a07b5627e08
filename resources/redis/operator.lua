-- operator: reset | force-fail | delete, by the dashboard or the CLI (the twin of decideOperator()).
-- KEYS: P{tag}:r:<key>, then its bucket's P{tag}:k:<ep>, P{tag}:s:<ep>:processing|failed|reset
-- ARGV: action force(0|1) detail key
-- Returns {'accept', now, endpoint, state before, state after ('' when deleted)}, or the verdict:
-- wrong-state | missing | leased (a processing key whose lease is live: a run may be going, and
-- nothing that would let it run again is done).
local rk, action, force, detail = KEYS[1], ARGV[1], ARGV[2] == '1', ARGV[3]
local now = clock()
local nowText = fmt(now)
local m = redis.call('HGET', rk, 'm')
if not m then
  return 'missing'
end
local state, token, attempts, created, _, leaseUntil, expires, status, provider, endpoint, fp = unpackMeta(m, rk)
if tonumber(expires) <= now then
  return 'missing'
end
local running = state == 'processing' and tonumber(leaseUntil) > now
if action == 'delete' then
  if running then return 'leased' end
  -- A tombstone from now: absent everywhere, its token the floor of the key's next one.
  redis.call('DEL', rk)
  redis.call('HSET', rk, 'm', tombstoneMeta(state, token, attempts, created, provider, endpoint, fp))
  redis.call('PEXPIREAT', rk, keyExpiry(now))
  reindex(2, ARGV[4], state, nil)
  return {'accept', nowText, endpoint, state, ''}
end
local to
if action == 'force-fail' then
  if state ~= 'processing' then return 'wrong-state' end
  to = 'failed'
else
  if not (state == 'failed' or (force and state ~= 'reset')) then return 'wrong-state' end
  to = 'reset'
end
if running then return 'leased' end
local event = 'reset'
if to == 'failed' then event = 'force-failed' end
redis.call('HSET', rk, 'm', packMeta(to, token, attempts, created, nowText, '0', expires, status, provider, endpoint,
                                     fp),
           'h', appendHistory(redis.call('HGET', rk, 'h'), historyEntry(nowText, event, token, detail)))
if to == 'failed' then
  redis.call('HSET', rk, 'e', detail)
end
reindex(2, ARGV[4], state, to, expires, false)
return {'accept', nowText, endpoint, state, to}
