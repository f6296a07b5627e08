-- Shared by every Idempotency Desk script of the current layout (prepended when the scripts are
-- loaded, after `local CAP = <history cap>`).
--
-- Key layout v4. P is the store URL's prefix (default "idem:"); <key> is the idempotency key
-- ("<ep>:<id>", <ep> its endpoint). Keys live in BUCKETS: every key of a bucket carries the
-- bucket's hash tag {<tag>}, so a record and its index entries are in one cluster slot and every
-- transition writes both in one script, atomically: no crash, failover or lost connection can
-- leave a record that the listings, counts, export and purge do not find. A single Redis has one
-- bucket; a Redis Cluster 64, spread evenly over the slots (the desk picks a key's bucket and
-- the tags: redis::Layout, core/store/redisprotocol.h).
--
--   P{<tag>}:r:<key>         hash    THE RECORD. Six fields at most, so that a record is a
--                                    handful of allocations:
--                m  the meta, one line: "state token attempts created updated lease_until
--                   expires_at status provider endpoint fingerprint" (space-separated; the
--                   fingerprint last, it may hold anything; status: the stored result's, 0 if
--                   none). Transitions read and write this line (and h), never the payloads.
--                h  the history: a JSON array of {"at","event","token"[,"detail"]}, appended as
--                   text, first entry kept, CAP
--                q  the request: "METHOD path\n" + headers JSON + "\n" + body (claim.lua)
--                s  the result: status + "\n" + headers JSON + "\n" + body (finish.lua)
--                e  the error (failed, force-failed), absent when there is none
--                t  the event type (claim.lua, import.lua: Provider::eventType), absent when the
--                   delivery named none; a record written before the desk kept types has none
--                   and reads as typeless (no layout change: an optional field)
--                        A record is live until expires_at (store clock); Redis keeps its key
--                        TOKEN_GRACE_MS longer (PEXPIREAT expires_at + grace) as a TOMBSTONE: it
--                        counts as absent everywhere, but its token stays the floor of the next
--                        one for the key, so a key that expired, or was deleted (operator.lua
--                        makes it a tombstone at once), and is claimed again gets a higher token
--                        whatever Redis's clock did meanwhile. Purge (tombstone.lua) drops a
--                        tombstone's payloads (q s h e) and sets its expires_at to 0, as a delete
--                        does: absent even if the clock steps back (and t with them).
--   P{<tag>}:k:<ep>          zset    the bucket's keys of endpoint <ep> that are live or expired
--                                    but not yet purged, score = expires_at (ms)
--   P{<tag>}:s:<ep>:<state>  zset    of those, the ones in processing, failed or reset (completed,
--                                    nearly every key, has none: it is k minus these), score =
--                                    expires_at too, so that ZCOUNT (now, +inf] counts live keys
--   P{<tag>}:eps             set     the endpoints that have had keys in the bucket
--   P log                    stream  the delivery log (XADD MAXLEN ~), written by the desk
--   P layout                 string  "4" once the records of an earlier layout were moved
--   P migrating              string  held (SET NX PX) by the desk moving them
--   P shared:<sha256>        string  what the events of one batch delivery share (its request's
--                                    headers, the app's answer), named by the records instead of
--                                    held; in no bucket, written first (shared.lua)
-- No other per-record key. A token is max(Redis TIME in µs, the record's or tombstone's + 1).
-- Every script's KEYS are the record's and its bucket's indexes: all in the record's slot.
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

-- The indexes of a record's bucket, as every script of a transition takes them: KEYS[first] is
-- k, then the state indexes of processing, failed and reset (their order in STATES).
local STATES = {processing = 1, failed = 2, reset = 3}

-- Moves `key` in its bucket's indexes: into `to` (nil: out of them all, a delete or purge) with
-- score expiresAt, out of `from` (a state, or nil when it was in none). k is written only when
-- the expiry is new (newExpiry).
local function reindex(first, key, from, to, expiresAt, newExpiry)
  if not to then
    redis.call('ZREM', KEYS[first], key)
  elseif newExpiry then
    redis.call('ZADD', KEYS[first], expiresAt, key)
  end
  if from and from ~= to and STATES[from] then
    redis.call('ZREM', KEYS[first + STATES[from]], key)
  end
  if to and STATES[to] and (from ~= to or newExpiry) then
    redis.call('ZADD', KEYS[first + STATES[to]], expiresAt, key)
  end
end
