-- finish: complete or fail a claim; only the holder of the current fencing token may
-- (the twin of decideFinish()). Sent again after a lost answer, the same token and result find
-- the key already finished: 'repeated', not a refusal. TIME, one HMGET, one HSET, the index moves.
-- KEYS: P{tag}:r:<key>, then its bucket's P{tag}:k:<ep>, P{tag}:s:<ep>:processing|failed|reset
-- ARGV: token state(completed|failed|reset: a claim released unstarted) res_status res_headers res_body error key
-- Returns {'accept', now, endpoint}, or the verdict: repeated | stale-token | not-processing | missing.
local rk, token, newState = KEYS[1], ARGV[1], ARGV[2]
local now = clock()
local nowText = fmt(now)
local cur = redis.call('HMGET', rk, 'm', 'h', 'e')
if not cur[1] then
  return 'missing'
end
local state, curToken, attempts, created, _, _, expires, status, provider, endpoint, fp = unpackMeta(cur[1], rk)
if tonumber(expires) <= now then
  return 'missing'
end
if curToken ~= token then
  return 'stale-token'
end
if state ~= 'processing' then
  -- The same state, status and body (decideFinish's test; none stored reads as status 0 and
  -- an empty body): this finish, answered before.
  if state == newState and status == fmt(tonumber(ARGV[3])) then
    local stored, body = redis.call('HGET', rk, 's'), ''
    if stored then
      body = string.match(stored, '^[^\n]*\n[^\n]*\n(.*)$')
    end
    if body == ARGV[5] then
      return 'repeated'
    end
  end
  return 'not-processing'
end
local meta = packMeta(newState, curToken, attempts, created, nowText, '0', expires, fmt(tonumber(ARGV[3])), provider,
                      endpoint, fp)
local history = appendHistory(cur[2], historyEntry(nowText, newState, token, ARGV[6]))
local result = ARGV[3] .. '\n' .. ARGV[4] .. '\n' .. ARGV[5]
if ARGV[6] ~= '' then
  redis.call('HSET', rk, 'm', meta, 'h', history, 's', result, 'e', ARGV[6])
else
  redis.call('HSET', rk, 'm', meta, 'h', history, 's', result)
  if cur[3] then
    redis.call('HDEL', rk, 'e') -- an imported processing record may carry one
  end
end
reindex(2, ARGV[7], 'processing', newState, expires, false)
return {'accept', nowText, endpoint}
