-- Shared by every Idempotency Desk script (prepended when the scripts are loaded, after
-- `local CAP = <history cap>`).
--
-- Key layout v3 (cluster-ready). P is the store URL's prefix (default "idem:"); <key> is the
-- idempotency key ("<endpoint>:<id>", so it never starts with '}'). Every key a script touches is
-- in its KEYS and carries the record's hash tag {<key>}: one record is one cluster slot.
--
--   P{<key>}:r   hash    THE RECORD, the only truth. Written only by the scripts (atomic).
--                        Five fields at most, so that a record is a handful of allocations:
--                m  the meta, one line: "state token attempts created updated lease_until
--                   expires_at status provider endpoint fingerprint" (space-separated; the
--                   fingerprint last, it may hold anything; status: the stored result's, 0 if
--                   none). Every transition reads and writes only this line (and h), never the
--                   payloads; listing reads only m and e.
--                h  the history: a JSON array of {"at","event","token"[,"detail"]}, appended as
--                   text, first entry kept, CAP
--                q  the request: "METHOD path\n" + headers JSON + "\n" + body (claim.lua)
--                s  the result: status + "\n" + headers JSON + "\n" + body (finish.lua)
--                e  the error (failed, force-failed), absent when there is none
--                        A record is live until expires_at (store clock); Redis keeps its key
--                        TOKEN_GRACE_MS longer (PEXPIREAT expires_at + grace) as a TOMBSTONE: it
--                        counts as absent everywhere, but its token stays the floor of the next
--                        one for the key, so a key that expired, or was deleted (operator.lua
--                        makes it a tombstone at once), and is claimed again gets a higher token
--                        whatever Redis's clock did meanwhile. Purge (tombstone.lua) drops a
--                        tombstone's payloads (q s h e) as soon as it finds it and sets its
--                        expires_at to 0, as a delete does: absent even if the clock steps back.
--   No other per-record key. A token is max(Redis TIME in µs, the record's or tombstone's + 1).
--
-- Derived views, written by the desk OUTSIDE the scripts (they span records, so, on a cluster,
-- other slots): one ZADD/ZREM per index with all the members of a short window, pipelined
-- (RedisLane, RedisStore). Briefly stale by design: listing re-reads the records and skips and
-- repairs entries whose record is gone or in another state; purge repairs them too. One entry
-- per live key, plus one while it is in a state other than completed:
--   P i:k:<ep>             zset  every live key of an endpoint, score = expires_at ms: the
--                                listing of all / completed keys, and purge (entries past
--                                their score whose record is gone go)
--   P i:es:<ep>:<state>    zset  keys of an endpoint in processing, failed or reset, score =
--                                updated ms (completed, nearly every key, has none: it is i:k
--                                minus these)
--   P i:eps                set   the endpoints that have keys
--   P log                  stream the delivery log (XADD MAXLEN ~), written by the desk
--   P layout               string "3": written when a migration to layout v3 finished
--                                (`idemdesk migrate`, or any command at start)
--
-- Layout v2 (before; converted by migrate3.lua, and by any script that meets one: convertV2
-- below): P{<key>}:r a hash of a field per column (state fingerprint token attempts created
-- updated lease_until expires_at endpoint provider req_head req_body res_status res_headers
-- res_body error history), a token counter P{<key>}:t written by every claim, and indexes
-- P i:s:<state>, P i:es:<ep>:<state> (all four), P i:exp.
-- Layout v1 (before that; migrate.lua makes it v2): P k:<key> hash (with key, req_method,
-- req_path, req_headers), P i:all, P i:e:<ep>, P tokens (one counter for all keys).
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
-- token of the record or tombstone it replaces (before) is not below it: then one above.
local function newToken(before, nowUs)
  if before >= nowUs then return before + 1 end
  return nowUs
end

-- The key's Redis expiry for a record live until expiresAt: a tombstone's grace later.
local function keyExpiry(expiresAt)
  return fmt(expiresAt + TOKEN_GRACE_MS)
end

-- The meta line (field m) and back. Numbers as text throughout: they are only compared and
-- copied; tonumber where arithmetic needs it.
-- A meta line that does not read (written by hand, or by something else) stops the script with
-- an error: the desk answers 503, it never takes the record for an absent one.
local function unpackMeta(m, rk)
  local state, token, attempts, created, updated, leaseUntil, expiresAt, status, provider, endpoint, fingerprint =
    string.match(m, '^(%S+) (%d+) (%d+) (%d+) (%d+) (%d+) (%d+) (%-?%d+) (%S*) (%S*) (.*)$')
  if not state then
    error('IDEMMETA the record ' .. rk .. ' has an unreadable meta line')
  end
  return state, token, attempts, created, updated, leaseUntil, expiresAt, status, provider, endpoint, fingerprint
end

-- Every argument text (numbers formatted by the caller).
local function packMeta(state, token, attempts, created, updated, leaseUntil, expiresAt, status, provider, endpoint,
                        fingerprint)
  return state .. ' ' .. token .. ' ' .. attempts .. ' ' .. created .. ' ' .. updated .. ' ' .. leaseUntil .. ' '
         .. expiresAt .. ' ' .. status .. ' ' .. provider .. ' ' .. endpoint .. ' ' .. fingerprint
end

-- A record of layout v2 (a field per column) rewritten as v3, in place, its expiry given a
-- tombstone's grace: migrate3.lua for every record, and any script that meets one left over (a
-- desk of the previous version that wrote it after the migration). Returns the new meta line,
-- or nil when rk holds no v2 record.
local function convertV2(rk)
  local old = redis.call('HGETALL', rk)
  local r = {}
  for i = 1, #old, 2 do
    r[old[i]] = old[i + 1]
  end
  if r.m or not r.state then
    return nil
  end
  local function n(v) return fmt(tonumber(v or '0') or 0) end
  local status = n(r.res_status)
  local meta = packMeta(r.state, n(r.token), n(r.attempts), n(r.created), n(r.updated), n(r.lease_until),
                        n(r.expires_at), status, r.provider or '', r.endpoint or '', r.fingerprint or '')
  local fields = {'m', meta, 'h', r.history or '[]', 'q', (r.req_head or ' \n[]') .. '\n' .. (r.req_body or '')}
  if r.res_status and r.res_status ~= '' then
    table.insert(fields, 's')
    table.insert(fields, r.res_status .. '\n' .. (r.res_headers or '[]') .. '\n' .. (r.res_body or ''))
  end
  if r.error and r.error ~= '' then
    table.insert(fields, 'e')
    table.insert(fields, r.error)
  end
  redis.call('DEL', rk)
  redis.call('HSET', rk, unpack(fields))
  redis.call('PEXPIREAT', rk, keyExpiry(tonumber(n(r.expires_at))))
  return meta
end

-- A hash holding both a meta line and v2's fields: a desk of the previous version wrote into a
-- v3 record (it takes every v3 key for a new one). Refused loudly, never decided on.
local function refuseMixed(rk)
  error('IDEMMIXED ' .. rk .. ' was written by a desk of the previous version (layout v2) after the migration: stop it')
end

-- The record's meta line (converting a v2 record first), or nil when there is none.
local function readMeta(rk)
  local cur = redis.call('HMGET', rk, 'm', 'state')
  if cur[1] and cur[2] then
    refuseMixed(rk)
  end
  if not cur[1] and cur[2] then
    return convertV2(rk)
  end
  return cur[1]
end

-- A tombstone's meta: the record's, absent whatever the clock does (expires_at 0), its token kept.
local function tombstoneMeta(state, token, attempts, created, provider, endpoint, fingerprint)
  return packMeta(state, token, attempts, created, '0', '0', '0', '0', provider, endpoint, fingerprint)
end

-- One history entry, as JSON text; at (ms) and token as text; the detail is the only free text.
local function historyEntry(at, event, token, detail)
  local entry = '{"at":' .. at .. ',"event":"' .. event .. '","token":' .. token
  if detail and detail ~= '' then
    entry = entry .. ',"detail":' .. cjson.encode(detail)
  end
  return entry .. '}'
end

-- Appends an entry to a history (a JSON array as text) without decoding it; past CAP entries
-- the second goes (the first, how it started, is kept). Entries are counted only when there can
-- be more than CAP: each starts with the 6 characters {"at": (counting copied the whole history,
-- measured 7% of a claim + finish).
local function appendHistory(history, entry)
  if not history or history == '' or history == '[]' or string.sub(history, -1) ~= ']' then
    return '[' .. entry .. ']'
  end
  history = string.sub(history, 1, -2) .. ',' .. entry .. ']'
  if #history <= 6 * CAP then
    return history
  end
  local _, count = string.gsub(history, '{"at":', '')
  if count > CAP then
    local second = string.find(history, '{"at":', 3, true)
    local third = string.find(history, '{"at":', second + 1, true)
    history = string.sub(history, 1, second - 1) .. string.sub(history, third)
  end
  return history
end
