-- Shared by every Idempotency Desk script (prepended when the scripts are loaded).
-- Keys, under the configurable prefix P:
--   P k:<key>            hash: the record (native expiry: PEXPIREAT expires)
--   P i:all              zset: every key, score = updated ms
--   P i:s:<state>        zset: keys in a state
--   P i:e:<endpoint>     zset: keys of an endpoint
--   P i:es:<ep>:<state>  zset: keys of an endpoint in a state
--   P i:exp              zset: score = expires ms, so index entries leave with their record
--   P tokens             counter: fencing tokens, unique across keys and expiries
local STATES = {'processing', 'completed', 'failed', 'reset'}

local function fmt(n)
  return string.format('%.0f', n)
end

-- The store's clock in ms: leases and expiry are decided here, never on a desk's clock.
local function clockMs()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function endpointOf(key)
  return string.match(key, '^([^:]*):')
end

local function indexKeys(prefix, endpoint, state)
  return {prefix .. 'i:all', prefix .. 'i:s:' .. state, prefix .. 'i:e:' .. endpoint,
          prefix .. 'i:es:' .. endpoint .. ':' .. state}
end

local function unindex(prefix, key)
  local endpoint = endpointOf(key) or ''
  redis.call('ZREM', prefix .. 'i:all', key)
  redis.call('ZREM', prefix .. 'i:e:' .. endpoint, key)
  redis.call('ZREM', prefix .. 'i:exp', key)
  for _, s in ipairs(STATES) do
    redis.call('ZREM', prefix .. 'i:s:' .. s, key)
    redis.call('ZREM', prefix .. 'i:es:' .. endpoint .. ':' .. s, key)
  end
end

local function index(prefix, key, endpoint, state, updated, expires)
  for _, k in ipairs(indexKeys(prefix, endpoint, state)) do
    redis.call('ZADD', k, updated, key)
  end
  redis.call('ZADD', prefix .. 'i:exp', expires, key)
end

local function moveState(prefix, key, endpoint, from, to, updated)
  if from ~= to then
    redis.call('ZREM', prefix .. 'i:s:' .. from, key)
    redis.call('ZREM', prefix .. 'i:es:' .. endpoint .. ':' .. from, key)
  end
  for _, k in ipairs(indexKeys(prefix, endpoint, to)) do
    redis.call('ZADD', k, updated, key)
  end
end

local function appendHistory(json, entry, cap)
  local history = {}
  if json and json ~= '' and json ~= '[]' and json ~= '{}' then
    -- A malformed history must not make a transition fail half-way (scripts do not roll back).
    local ok, decoded = pcall(cjson.decode, json)
    if ok and type(decoded) == 'table' then
      history = decoded
    end
  end
  table.insert(history, entry)
  while #history > cap do
    table.remove(history, 2) -- the first entry (how it started) is kept
  end
  return cjson.encode(history)
end
