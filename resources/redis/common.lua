-- Shared by every Idempotency Desk script (prepended when the scripts are loaded, after
-- `local CAP = <history cap>`).
--
-- Key layout v2 (cluster-ready). P is the store URL's prefix (default "idem:"); <key> is the
-- idempotency key ("<endpoint>:<id>", so it never starts with '}'). Every key a script touches is
-- in its KEYS and carries the record's hash tag {<key>}: one record is one cluster slot.
--
--   P{<key>}:r   hash    THE RECORD, the only truth. Written only by claim.lua, finish.lua,
--                        operator.lua (atomic). Native expiry: PEXPIREAT expires_at. Fields:
--                        state fingerprint token attempts created updated lease_until expires_at
--                        endpoint provider req_head ("METHOD path\n" + headers JSON) req_body
--                        res_status res_headers res_body error history (a JSON array of
--                        {"at","event","token"[,"detail"]}, appended as text, first entry kept, CAP)
--   P{<key>}:t   string  the key's fencing-token counter: the last token handed out for it.
--                        Written only by claim.lua; outlives the record (expires TOKEN_GRACE_MS
--                        after it), so a key deleted or expired and claimed again never gets a
--                        token at or below an earlier one. A token is max(last + 1, Redis TIME
--                        in µs): after the counter too is gone, the clock still moves it up.
--
-- Derived views, written by the desk OUTSIDE the scripts (they span records, so, on a cluster,
-- other slots): one ZADD/ZREM per index with all the members of an event-loop turn, pipelined
-- (RedisLane, RedisStore). Briefly stale by design: listing re-reads the records and skips and
-- repairs entries whose record is gone or in another state; purge repairs them too.
--   P i:s:<state>          zset  keys in a state, score = updated ms (store clock)
--   P i:es:<ep>:<state>    zset  keys of an endpoint in a state, score = updated ms
--   P i:exp                zset  score = expires_at ms: purge drops the index entries of
--                                expired records (their hashes expire natively)
--   P log                  stream the delivery log (XADD MAXLEN ~), written by the desk
--   P layout               string "2": written when a migration from layout v1 finished
--                                (`idemdesk migrate`, or any command at start)
--
-- Layout v1 (before; `idemdesk migrate` and a desk at start convert it, see redismigrate.cpp):
-- P k:<key> hash (with key, req_method, req_path, req_headers), P i:all, P i:e:<ep>, P tokens
-- (one counter for all keys), and the same P i:s:*, P i:es:*, P i:exp.
local STATES = {'processing', 'completed', 'failed', 'reset'}
local TOKEN_GRACE_MS = 86400000

-- An integer as text (ms, µs, tokens: all below 2^53). '%d' formats it as an integer; '%.0f'
-- went through the floating-point printer, measured a few µs of Redis CPU per delivery.
local function fmt(n)
  return string.format('%d', n)
end

-- The store's clock: leases and expiry are decided here, never on a desk's clock. In ms and µs.
local function clock()
  local t = redis.call('TIME')
  local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  return math.floor(us / 1000), us
end

-- A new fencing token for a record (claim.lua, import.lua): the store clock in µs, unless the
-- last one handed out for this key (its counter tk outlives the record) or the record's own
-- (before) is not below it: then one above those. So it climbs after the counter too has expired
-- or was lost in a failover. One SET ... GET; the counter lives until the record's expiry plus
-- TOKEN_GRACE_MS.
local function newToken(tk, before, nowUs, expiresAt)
  local token = nowUs
  local counterUntil = fmt(expiresAt + TOKEN_GRACE_MS)
  local last = tonumber(redis.call('SET', tk, fmt(token), 'GET', 'PXAT', counterUntil) or '0')
  if before > last then last = before end
  if last >= token then
    token = last + 1
    redis.call('SET', tk, fmt(token), 'PXAT', counterUntil)
  end
  return token
end

-- One history entry, as JSON text; the detail is the only free text.
local function historyEntry(at, event, token, detail)
  local entry = '{"at":' .. fmt(at) .. ',"event":"' .. event .. '","token":' .. token
  if detail and detail ~= '' then
    entry = entry .. ',"detail":' .. cjson.encode(detail)
  end
  return entry .. '}'
end

-- Appends an entry to a history (a JSON array as text) without decoding it; past CAP entries
-- the second goes (the first, how it started, is kept).
local function appendHistory(history, entry)
  if not history or history == '' or history == '[]' or string.sub(history, -1) ~= ']' then
    return '[' .. entry .. ']'
  end
  history = string.sub(history, 1, -2) .. ',' .. entry .. ']'
  local _, count = string.gsub(history, '{"at":', '')
  if count > CAP then
    local second = string.find(history, '{"at":', 3, true)
    local third = string.find(history, '{"at":', second + 1, true)
    history = string.sub(history, 1, second - 1) .. string.sub(history, third)
  end
  return history
end
