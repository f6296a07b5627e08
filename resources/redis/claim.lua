-- claim: read the record, decide (the Redis twin of decideClaim() in core/model/statemachine.cpp,
-- held to it by the store contract suite), apply; all atomic, on the record's own keys only.
-- On every delivery's path, so it does the least it can: TIME, one HMGET, and for a new claim
-- one SET ... GET of the token counter and one HSET + PEXPIREAT of the record. No index, no JSON decode.
-- KEYS: P{key}:r (the record)  P{key}:t (its token counter)
-- ARGV: endpoint provider fingerprint lease_ms ttl_ms policy req_head req_body
--   policy: two letters, on a failed key R(eprocess)|X (reject), on a changed payload M (mismatch)|I (ignore)
-- Returns, by action (the caller builds the record from what it sent and this), each ending with
-- the store clock (ms) the decision was made at:
--   create:  {action, outcome, token, now}
--   reclaim: {action, outcome, token, attempts, created, history, now, state before}
--   replay, in-progress, mismatch: {action, outcome, SUMMARY fields after the step, now}
local rk, tk = KEYS[1], KEYS[2]
local fp, leaseMs, ttlMs, policy = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]
local now, nowUs = clock()
local nowText = fmt(now)
-- The SUMMARY (the order redisprotocol.cpp reads), then the history.
local FIELDS = {'endpoint', 'provider', 'state', 'fingerprint', 'token', 'attempts', 'created', 'updated',
                'lease_until', 'expires_at', 'res_status', 'res_headers', 'res_body', 'error', 'history'}
local cur = redis.call('HMGET', rk, unpack(FIELDS))
local state = cur[3]
local leaseUntil, expires = tonumber(cur[9] or '0'), tonumber(cur[10] or '0')

local action, outcome
if not state or expires <= now then
  action, outcome = 'create', 'processed'
elseif state == 'reset' then
  action, outcome = 'reclaim', 'reprocessed'
elseif string.sub(policy, 2, 2) == 'M' and cur[4] ~= fp then
  action, outcome = 'mismatch', 'mismatch'
elseif state == 'processing' then
  if leaseUntil > now then
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

local function summary()
  local answer = {action, outcome}
  for i = 1, #FIELDS - 1 do
    answer[i + 2] = cur[i] or ''
  end
  answer[#FIELDS + 2] = nowText
  return answer
end

if action == 'mismatch' then
  return summary()
end
if action == 'replay' or action == 'in-progress' then
  cur[6] = tostring(tonumber(cur[6]) + 1)
  cur[8] = nowText
  redis.call('HSET', rk, 'attempts', cur[6], 'updated', cur[8])
  return summary()
end

local expiresAt = now + ttlMs
local token = newToken(tk, tonumber(cur[5] or '0'), nowUs, expiresAt)
local tokenText, expiresText = fmt(token), fmt(expiresAt)

local attempts, created, history
if state then
  redis.call('DEL', rk) -- a reclaim, or an expired record not yet gone: nothing of it is kept
end
if action == 'reclaim' then
  attempts, created = tonumber(cur[6]) + 1, tonumber(cur[7])
  local event = 'claimed'
  if outcome == 'recovered' or outcome == 'reprocessed' then
    event = outcome
  end
  history = appendHistory(cur[15], historyEntry(now, event, tokenText))
else
  attempts, created = 1, now
  history = '[' .. historyEntry(now, 'claimed', tokenText) .. ']'
end
redis.call('HSET', rk, 'state', 'processing', 'fingerprint', fp, 'token', tokenText, 'attempts', attempts,
           'created', fmt(created), 'updated', nowText, 'lease_until', fmt(now + leaseMs),
           'expires_at', expiresText, 'endpoint', ARGV[1], 'provider', ARGV[2], 'req_head', ARGV[7],
           'req_body', ARGV[8], 'history', history)
redis.call('PEXPIREAT', rk, expiresText)
if action == 'reclaim' then
  return {action, outcome, token, cur[6], cur[7], cur[15] or '[]', nowText, state}
end
return {action, outcome, token, nowText}
