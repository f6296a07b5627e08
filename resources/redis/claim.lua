-- claim: read the record, decide (the Redis twin of decideClaim() in core/model/statemachine.cpp,
-- held to it by the store contract suite), apply; all atomic, on the record's bucket only. On
-- every delivery's path, so it does the least it can: TIME, one HMGET, and for a new claim one
-- HSET of three fields, PEXPIREAT and the index writes (two ZADDs and an SADD). No JSON decode; the request's bytes are
-- copied, never parsed.
-- KEYS: P{tag}:r:<key>, then its bucket's P{tag}:k:<ep>, P{tag}:s:<ep>:processing|failed|reset,
--       P{tag}:eps
-- ARGV: endpoint provider fingerprint lease_ms ttl_ms policy request key type
--   policy: two letters, on a failed key R(eprocess)|X (reject), on a changed payload M (mismatch)|I (ignore)
--   request: the q field (common.lua); type: the t field, '' when the delivery names none
-- Returns, by action (the caller builds the record from what it sent and this), each ending with
-- the store clock (ms) the decision was made at:
--   create:  {action, outcome, token, now}
--   reclaim: {action, outcome, token, attempts, created, history, now, state before}
--   replay, in-progress, mismatch: {action, outcome, SUMMARY after the step, now}, SUMMARY being
--     endpoint provider state fingerprint token attempts created updated lease_until expires_at
--     result(s) error(e) (the order redisprotocol.cpp reads; the result as stored, split there)
local rk = KEYS[1]
local fp, leaseMs, ttlMs, policy = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]
local now, nowUs = clock()
local nowText = fmt(now)
local cur = redis.call('HMGET', rk, 'm', 's', 'e')
local state, token, attempts, created, updated, leaseUntil, expires, status, provider, endpoint, curFp
if cur[1] then
  state, token, attempts, created, updated, leaseUntil, expires, status, provider, endpoint, curFp =
    unpackMeta(cur[1], rk)
end

local action, outcome
if not state or tonumber(expires) <= now then
  action, outcome = 'create', 'processed' -- none, or a tombstone: its token is the floor
elseif state == 'reset' then
  action, outcome = 'reclaim', 'reprocessed'
elseif string.sub(policy, 2, 2) == 'M' and curFp ~= fp then
  action, outcome = 'mismatch', 'mismatch'
elseif state == 'processing' then
  if tonumber(leaseUntil) > now then
    action, outcome = 'in-progress', 'in-progress'
  else
    action, outcome = 'reclaim', 'recovered'
  end
elseif state == 'completed' then
  action, outcome = 'replay', 'replayed'
elseif string.sub(policy, 1, 1) == 'R' then
  action, outcome = 'reclaim', 'reprocessed'
else
  action, outcome = 'replay', 'replayed'
end

if action == 'replay' or action == 'in-progress' or action == 'mismatch' then
  local uncounted -- nil: nothing after nowText in the answer
  if action ~= 'mismatch' then
    -- Counted where Redis lets it: a Redis out of memory (maxmemory, noeviction) refuses the
    -- write, and the duplicate still gets its answer (nothing is decided on the count).
    local seen = fmt(tonumber(attempts) + 1)
    local counted = redis.pcall('HSET', rk, 'm', packMeta(state, token, seen, created, nowText, leaseUntil, expires,
                                                          status, provider, endpoint, curFp))
    if type(counted) ~= 'table' or not counted.err then
      attempts, updated = seen, nowText
    else
      uncounted = counted.err -- told to the desk, last
    end
  end
  return {action, outcome, endpoint, provider, state, curFp, token, attempts, created, updated, leaseUntil, expires,
          cur[2] or '', cur[3] or '', nowText, uncounted}
end

local expiresAt = now + ttlMs
local newTok = newToken(tonumber(token or '0'), nowUs)
local tokenText = fmt(newTok)

local newAttempts, newCreated, history, before
if action == 'reclaim' then
  before = redis.call('HGET', rk, 'h')
  newAttempts, newCreated = fmt(tonumber(attempts) + 1), created
  local event = 'claimed'
  if outcome == 'recovered' or outcome == 'reprocessed' then
    event = outcome
  end
  history = appendHistory(before, historyEntry(nowText, event, tokenText))
else
  newAttempts, newCreated = '1', nowText
  history = '[' .. historyEntry(nowText, 'claimed', tokenText) .. ']'
end
-- HSET first: Redis refuses it when out of memory, and so nothing is taken (a DEL first is not
-- refused, and let the script write on: the key was taken and run, its finish refused, once a
-- lease).
local meta = packMeta('processing', tokenText, newAttempts, newCreated, nowText, fmt(now + leaseMs), fmt(expiresAt), '0',
                     ARGV[2], ARGV[1], fp)
if ARGV[9] == '' then
  redis.call('HSET', rk, 'm', meta, 'h', history, 'q', ARGV[7])
else
  redis.call('HSET', rk, 'm', meta, 'h', history, 'q', ARGV[7], 't', ARGV[9])
end
if state then
  -- a reclaim, or a tombstone: nothing of it is kept but its token, above
  if ARGV[9] == '' then
    redis.call('HDEL', rk, 's', 'e', 't')
  else
    redis.call('HDEL', rk, 's', 'e')
  end
end
redis.call('PEXPIREAT', rk, keyExpiry(expiresAt))
-- A tombstone (expires_at 0) is in no index any more; an expired record still is, under its state.
local from = state
if expires == '0' then
  from = nil
end
reindex(2, ARGV[8], from, 'processing', expiresAt, true)
-- Whatever was there: a tombstone or an expired record may have come from a migration or an
-- import that never listed its endpoint here, and listing reads the endpoints from this set.
redis.call('SADD', KEYS[6], ARGV[1])
if action == 'reclaim' then
  return {action, outcome, newTok, attempts, created, before or '[]', nowText, state}
end
return {action, outcome, newTok, nowText}
