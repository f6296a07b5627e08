-- finish: complete or fail a claim; only the holder of the current fencing token may
-- (the twin of decideFinish()). Sent again after a lost answer, the same token and result find
-- the key already finished: 'repeated', not a refusal. TIME, one HMGET, one HSET.
-- KEYS: P{key}:r
-- ARGV: token state(completed|failed|reset: a claim released unstarted) res_status res_headers res_body error
-- Returns {'accept', now, endpoint} (the desk moves the key in the indexes), or the verdict:
-- repeated | stale-token | not-processing | missing.
local rk, token, newState = KEYS[1], ARGV[1], ARGV[2]
local now = clock()
local nowText = fmt(now)
local cur = redis.call('HMGET', rk, 'm', 'h', 'e', 'state')
if cur[1] and cur[4] then
  refuseMixed(rk)
end
if not cur[1] then
  cur[1] = convertV2(rk) -- a v2 record left over, or nothing
  if not cur[1] then
    return 'missing'
  end
  cur[2], cur[3] = redis.call('HGET', rk, 'h'), redis.call('HGET', rk, 'e')
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
return {'accept', nowText, endpoint}
