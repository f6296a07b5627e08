-- Layout v3's helpers, prepended to the migrations that still read older layouts (migrate.lua:
-- v1 to v2; migrate3.lua: v2 to v3, in place). The desk then moves each v3 record to the current
-- layout (resources/redis/common.lua describes both). Not used on any delivery's path.
--
-- Layout v3: P{<key>}:r a hash (m h q s e, as the current layout's record), indexes written by the
-- desk outside the scripts (P i:k:<ep>, P i:es:<ep>:<state>, P i:eps), P layout "3".
-- Layout v2: P{<key>}:r a hash of a field per column (state fingerprint token attempts created
-- updated lease_until expires_at endpoint provider req_head req_body res_status res_headers
-- res_body error history), a token counter P{<key>}:t, indexes P i:s:<state>, P i:es:<ep>:<state>,
-- P i:exp. Layout v1: P k:<key> hash, P i:all, P i:e:<ep>, P tokens.
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


-- A tombstone's meta: the record's, absent whatever the clock does (expires_at 0), its token kept.
local function tombstoneMeta(state, token, attempts, created, provider, endpoint, fingerprint)
  return packMeta(state, token, attempts, created, '0', '0', '0', '0', provider, endpoint, fingerprint)
end


