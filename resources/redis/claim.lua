-- claim: read the key, decide (the Redis twin of decideClaim() in core/engine/statemachine.cpp,
-- held to it by the store contract suite), apply; all atomic. On every delivery's path, so it
-- does the least it can: a first claim writes the record and its indexes and answers the token.
-- ARGV: prefix key endpoint provider fingerprint lease_ms ttl_ms on_failed on_mismatch
--       req_method req_path req_headers req_body history_cap
-- Time is Redis's own (TIME). Returns, by action (the caller builds the record from what it
-- sent and this), each ending with the clock the decision was made at:
--   create:  {action, outcome, token, now}
--   reclaim: {action, outcome, token, attempts, created, history, now}   (as they were before)
--   replay, in-progress, mismatch: {action, outcome, SUMMARY fields of the record after the step, now}
local prefix, key, endpoint, provider, fp = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local leaseMs, ttlMs = tonumber(ARGV[6]), tonumber(ARGV[7])
local onFailed, onMismatch = ARGV[8], ARGV[9]
local cap = tonumber(ARGV[14])
local now = clockMs()
local rk = prefix .. 'k:' .. key
local SUMMARY = {'key', 'endpoint', 'provider', 'state', 'fingerprint', 'token', 'attempts', 'created',
                 'updated', 'lease_until', 'expires_at', 'res_status', 'res_headers', 'res_body', 'error'}

local cur = redis.call('HMGET', rk, 'state', 'fingerprint', 'lease_until', 'expires_at', 'attempts',
                       'created', 'history', 'token')
local state, oldFp = cur[1], cur[2]
local leaseUntil, expires = tonumber(cur[3] or '0'), tonumber(cur[4] or '0')

local action, outcome
if not state or expires <= now then
  action, outcome = 'create', 'processed'
elseif state == 'reset' then
  action, outcome = 'reclaim', 'reprocessed'
elseif onMismatch == 'reject' and oldFp ~= fp then
  action, outcome = 'mismatch', 'mismatch'
elseif state == 'processing' then
  if leaseUntil > now then
    action, outcome = 'in-progress', 'in-progress'
  else
    action, outcome = 'reclaim', 'recovered'
  end
elseif state == 'completed' then
  action, outcome = 'replay', 'replayed'
elseif onFailed == 'reprocess' then
  action, outcome = 'reclaim', 'reprocessed'
else
  action, outcome = 'replay', 'replayed'
end

local function summary()
  local answer = {action, outcome}
  local values = redis.call('HMGET', rk, unpack(SUMMARY))
  for i = 1, #SUMMARY do
    answer[i + 2] = values[i] or ''
  end
  answer[#SUMMARY + 3] = fmt(now)
  return answer
end

if action == 'mismatch' then
  return summary()
end
if action == 'replay' or action == 'in-progress' then
  redis.call('HINCRBY', rk, 'attempts', 1)
  redis.call('HSET', rk, 'updated', fmt(now))
  for _, k in ipairs(indexKeys(prefix, endpoint, state)) do
    redis.call('ZADD', k, 'XX', now, key)
  end
  return summary()
end

local token = redis.call('INCR', prefix .. 'tokens')
local before = tonumber(cur[8] or '0')
if token <= before then
  -- The counter was lost (evicted, a restart without persistence, a failover): never hand out
  -- a token at or below the one this key already had.
  token = before + 1
  redis.call('SET', prefix .. 'tokens', token)
end
local attempts, created, history
if state then
  unindex(prefix, key)
  redis.call('DEL', rk)
elseif redis.call('ZSCORE', prefix .. 'i:exp', key) then
  -- The record expired natively but its index entries are still there: they go with it, so the
  -- key is not listed (and counted) under its old state as well.
  unindex(prefix, key)
end
local expiresAt = now + ttlMs
if action == 'reclaim' then
  attempts = tonumber(cur[5]) + 1
  created = tonumber(cur[6])
  local event = 'claimed'
  if outcome == 'recovered' or outcome == 'reprocessed' then
    event = outcome
  end
  history = appendHistory(cur[7], {at = now, event = event, token = token}, cap)
else
  -- A first claim: its history is one entry, written without a JSON round trip.
  attempts, created = 1, now
  history = '[{"at":' .. fmt(now) .. ',"event":"claimed","token":' .. token .. '}]'
end
redis.call('HSET', rk, 'key', key, 'endpoint', endpoint, 'provider', provider, 'state', 'processing',
           'fingerprint', fp, 'token', token, 'attempts', attempts, 'created', fmt(created),
           'updated', fmt(now), 'lease_until', fmt(now + leaseMs), 'expires_at', fmt(expiresAt),
           'req_method', ARGV[10], 'req_path', ARGV[11], 'req_headers', ARGV[12], 'req_body', ARGV[13],
           'history', history)
redis.call('PEXPIREAT', rk, fmt(expiresAt))
index(prefix, key, endpoint, 'processing', now, expiresAt)
if action == 'reclaim' then
  return {action, outcome, token, cur[5], cur[6], cur[7] or '[]', fmt(now)}
end
return {action, outcome, token, fmt(now)}
