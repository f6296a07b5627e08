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
local cur = redis.call('HMGET', rk, 'm', 'h')
if not cur[1] then
  return 'missing'
end
local state, curToken, attempts, created, _, _, expires, provider, endpoint, fp = unpackMeta(cur[1], rk)
if tonumber(expires) <= now then
  return 'missing'
end
if curToken ~= token then
  return 'stale-token'
end
local result = ARGV[3] .. '\n' .. ARGV[4] .. '\n' .. ARGV[5]
if state ~= 'processing' then
  if state == newState and redis.call('HGET', rk, 's') == result then
    return 'repeated'
  end
  return 'not-processing'
end
local meta = packMeta(newState, curToken, attempts, created, nowText, '0', expires, provider, endpoint, fp)
local history = appendHistory(cur[2], historyEntry(now, newState, token, ARGV[6]))
-- A record in processing has no e: a claim writes the record whole.
if ARGV[6] ~= '' then
  redis.call('HSET', rk, 'm', meta, 'h', history, 's', result, 'e', ARGV[6])
else
  redis.call('HSET', rk, 'm', meta, 'h', history, 's', result)
end
return {'accept', nowText, endpoint}
