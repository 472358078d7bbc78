"""The Lua scripts that make each write one atomic server-side step.

A session's keys share one hash tag, so a script touching them runs on one cluster node. The keys:

* ``h``: a hash with ``next`` (the sequence number the next message gets), ``created`` and ``updated``
  (microseconds since the epoch), and the session document (``doc``, ``ver``, ``owner``);
* ``m``: a list of message records in append order; the head's sequence number is ``next - LLEN(m)``;
* ``i``: a sorted set of the stored message ids scored by sequence number, for idempotent appends and
  for removing the ids of trimmed and popped messages by rank;
* ``u``: a sorted set of the usage (``SessionUsage.to_dict`` as JSON, computed by core's ``usage_of``) of each
  stored message that carries some, as ``seq:json`` scored by sequence number; the hash's ``usage`` is their sum,
  kept by every script that adds or removes messages, so ``usage()`` reads one field.

A log that forks share (renamed ``m:NAME``, ``i:NAME``, ``u:NAME``) has a hold count beside it, ``r:NAME``: how
many sessions hold it, as their current log or as a segment. A session that stops holding it (a delete, a prune,
a trim or pop past it) drops its hold, and the last hold frees the log. A script frees the logs of its own slot
itself; it returns the records keys of logs in other slots (a fork's inherited segments), and the store runs
``RELEASE`` there. A fork takes its holds before the target exists (``ACQUIRE`` in other slots first, then
``FORK_SOURCE`` in the source's), so no log is freed while a session still reads it; a write cut short between
two of these steps leaves a hold too many (the log stays), never one too few.

The tenant's tags (``P:{T}:tags``, and one index per tag named after it) are in the tenant's slot: scripts given
the tenant's keys (standalone) update the tag indexes with the tenant's index.

Scripts are run with EVALSHA; when a server does not know a script (restarted, flushed, another cluster
node), the store falls back to EVAL, which also caches it there.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

__all__ = [
    "ACQUIRE",
    "APPEND",
    "DELETE",
    "DROP_INDEX_ENTRY",
    "FORK_SOURCE",
    "FORK_TARGET",
    "PAGE",
    "POP",
    "PRUNE",
    "RANGE",
    "RELEASE",
    "SAVE_SESSION",
    "SET_TAGS",
    "TOUCH_TENANT",
    "TRIM",
    "UPDATE_INFO",
    "VIEW",
    "Script",
]


@dataclass(frozen=True)
class Script:
    """A Lua script and its SHA1 (what EVALSHA takes)."""

    name: str
    source: str

    @functools.cached_property
    def sha(self) -> str:
        return hashlib.sha1(self.source.encode()).hexdigest()


# Where a session's messages are (every script on a session's keys starts with it). KEYS[2..4] are the session's
# first log (records, ids, usage); a log a fork shares is renamed KEYS[n] .. ':' .. name (same slot), and the
# hash names the current one (``log``) and says whether forks share it (``shared``: it never shrinks again).
# ``segs`` (JSON) lists the messages the session holds from earlier logs, oldest first, each
# {records key, ids key, usage key, head, lo, hi}: sequence numbers lo..hi, at index seq - head of the records.
_LOG = """
local M, I, U, SHARED, NAME = KEYS[2], KEYS[3], KEYS[4], false, false
local function locate()
  NAME = redis.call('HGET', KEYS[1], 'log')
  if NAME then
    M, I, U = KEYS[2] .. ':' .. NAME, KEYS[3] .. ':' .. NAME, KEYS[4] .. ':' .. NAME
    SHARED = redis.call('HGET', KEYS[1], 'shared') == '1'
  end
end
local function segments()
  local text = redis.call('HGET', KEYS[1], 'segs')
  if not text then return {}, '' end
  return cjson.decode(text), text
end
local function store_segments(segs)
  if #segs == 0 then
    redis.call('HDEL', KEYS[1], 'segs')
  else
    redis.call('HSET', KEYS[1], 'segs', cjson.encode(segs))
  end
end
local function held(segs)
  local n = 0
  for _, seg in ipairs(segs) do n = n + seg[6] - seg[5] + 1 end
  return n
end
-- A reply: its first fields, then the records.
local function with_records(reply, records)
  for _, record in ipairs(records) do reply[#reply + 1] = record end
  return reply
end
-- A log of this session (same slot): the script may read it.
local function local_key(key)
  local own = string.sub(KEYS[1], 1, #KEYS[1] - 1)
  return string.sub(key, 1, #own) == own
end
-- The hold count of the log whose records are at ``records`` (P:{T.S}:m:NAME gives P:{T.S}:r:NAME).
local function refs_of(records)
  return (string.gsub(records, ':m:([^:]*)$', ':r:%1'))
end
-- Drop one hold on a log of this slot: the last hold frees it. A log without a count was shared before logs
-- counted their holders: nobody knows who holds it, so it stays.
local function release_local(records, ids, usage)
  local refs = refs_of(records)
  if redis.call('EXISTS', refs) == 1 and redis.call('DECR', refs) <= 0 then
    redis.call('DEL', refs, records, ids, usage)
  end
end
-- Drop the session's hold on each of ``segs``: a log of this slot at once; the records key of a log in another
-- slot is added to ``foreign``, for the store to release there.
local function release(segs, foreign)
  for _, seg in ipairs(segs) do
    if local_key(seg[1]) then release_local(seg[1], seg[2], seg[3]) else foreign[#foreign + 1] = seg[1] end
  end
  return foreign
end
"""

# Shared by every write: restart the TTL of the session's keys, stamp the session, update the indexes.
# The logs the session holds segments of live at least as long as it: ``expire`` lengthens those of its own slot,
# and lists the records keys of the others in FAR, which the scripts that write return (``far``) for the store to
# lengthen there (``APPEND`` and ``FORK_TARGET`` need not: the store lengthens a fork's logs before those run).
_EXPIRE = (
    _LOG
    + """
local FAR = {}
local function expire(ttl)
  if ttl > 0 then
    redis.call('PEXPIRE', KEYS[1], ttl)
    if SHARED then
      -- forks may need it longer (or forever): only ever lengthen
      redis.call('PEXPIRE', M, ttl, 'GT')
      redis.call('PEXPIRE', I, ttl, 'GT')
      redis.call('PEXPIRE', U, ttl, 'GT')
      redis.call('PEXPIRE', refs_of(M), ttl, 'GT')
    else
      redis.call('PEXPIRE', M, ttl)
      redis.call('PEXPIRE', I, ttl)
      redis.call('PEXPIRE', U, ttl)
    end
    for _, seg in ipairs((segments())) do
      if local_key(seg[1]) then
        for _, key in ipairs({seg[1], seg[2], seg[3], refs_of(seg[1])}) do redis.call('PEXPIRE', key, ttl, 'GT') end
      else
        FAR[#FAR + 1] = seg[1]
      end
    end
  end
end
-- A reply, then the records keys of FAR.
local function far(reply)
  for _, key in ipairs(FAR) do reply[#reply + 1] = key end
  return reply
end
local function touch(now)
  redis.call('HSETNX', KEYS[1], 'created', now)
  local updated = tonumber(redis.call('HGET', KEYS[1], 'updated') or '0')
  if tonumber(now) > updated then redis.call('HSET', KEYS[1], 'updated', now) end
end
-- KEYS[at] is the tenant's index, KEYS[at + 1] the tenants' index and KEYS[at + 2] the tenant's tags, when the
-- script was given them (standalone only: a cluster keeps them on other nodes, and the store updates them apart).
local function reindex(at, now, tenant, session_id)
  if #KEYS > at then
    redis.call('ZADD', KEYS[at + 1], 'GT', now, tenant)
    redis.call('ZADD', KEYS[at], 'GT', now, session_id)
    local tags = redis.call('HGET', KEYS[at + 2], session_id)
    if tags then
      for _, tag in ipairs(cjson.decode(tags)) do
        redis.call('ZADD', KEYS[at + 2] .. ':' .. tag, 'GT', now, session_id)
      end
    end
  end
end
-- Usages (SessionUsage.to_dict as JSON) added to (sign 1) or taken off (sign -1) a usage table.
local function summed(total, parts, sign)
  for _, text in ipairs(parts) do
    local part = cjson.decode(text)
    for _, field in ipairs({'input_tokens', 'output_tokens', 'total_tokens', 'calls'}) do
      total[field] = total[field] + sign * part[field]
    end
    for name, counts in pairs(part.models) do
      local model = total.models[name] or {0, 0, 0, 0}
      for n = 1, 4 do model[n] = model[n] + sign * counts[n] end
      if model[1] == 0 then total.models[name] = nil else total.models[name] = model end
    end
  end
  return total
end
local function stored_usage()
  local stored = redis.call('HGET', KEYS[1], 'usage')
  if stored then return cjson.decode(stored) end
  return {input_tokens = 0, output_tokens = 0, total_tokens = 0, calls = 0, models = {}}
end
local function usage_text(total)
  if total.calls == 0 then return '' end
  return cjson.encode(total)
end
local function add_usage(parts, sign)
  if #parts == 0 then return end
  local text = usage_text(summed(stored_usage(), parts, sign))
  if text == '' then redis.call('HDEL', KEYS[1], 'usage') else redis.call('HSET', KEYS[1], 'usage', text) end
end
-- The usages kept in ``key`` (a usage sorted set) for the messages numbered first..last.
local function usages_in(key, first, last)
  local parts = {}
  if last < first then return parts end
  for k, row in ipairs(redis.call('ZRANGEBYSCORE', key, first, last)) do
    parts[k] = string.sub(row, string.find(row, ':', 1, true) + 1)
  end
  return parts
end
-- Take the usage of the current log's messages numbered first..last off the session's (and out of U).
local function drop_usage(first, last)
  local parts = usages_in(U, first, last)
  if #parts == 0 then return end
  add_usage(parts, -1)
  redis.call('ZREMRANGEBYSCORE', U, first, last)
end
-- The current log is shared with forks, so it must not shrink: it becomes the session's newest segment (its
-- hold goes with it), and the session goes on in a new, empty log of its own (its messages stay the same).
local function leave_shared_log()
  local length = redis.call('LLEN', M)
  local segs = segments()
  local next = tonumber(redis.call('HGET', KEYS[1], 'next') or '0')
  if length > 0 then
    segs[#segs + 1] = {M, I, U, next - length, next - length, next - 1}
  else
    release_local(M, I, U)
  end
  store_segments(segs)
  local name = redis.call('HGET', KEYS[1], 'created') .. '.' .. redis.call('HINCRBY', KEYS[1], 'logs', 1)
  redis.call('HSET', KEYS[1], 'log', name)
  redis.call('HDEL', KEYS[1], 'shared')
  M, I, U, SHARED, NAME = KEYS[2] .. ':' .. name, KEYS[3] .. ':' .. name, KEYS[4] .. ':' .. name, false, name
end
-- unpack() is limited by Lua's C stack: push in chunks.
local function chunked(command, key, items, step)
  for start = 1, #items, step do
    redis.call(command, key, unpack(items, start, math.min(start + step - 1, #items)))
  end
end
"""
)

# KEYS: h, m, i, u [, tenant index, tenants index, tenant's tags (standalone only: a cluster writes them first, apart)]
# ARGV: now_us, ttl_ms, max_messages (0: none), n, tenant, session_id, replicated (1: the store WAITs for replicas),
#       id_1..id_n, record_1..record_n, usage_1..usage_n ('': the message carries none),
#       checked (the segments the store checked the ids against, '' for none), held ids (of those segments)...
# Returns how many messages were new; {'check', segments} when the session holds messages of earlier logs and
# the store has not checked the ids against those (the store reads them and runs it again); {'trim', added}
# when max_messages would cut into messages a fork shares (the store trims after).
APPEND = Script(
    "append",
    _EXPIRE
    + """
locate()
local n = tonumber(ARGV[4])
local segs, segs_text = segments()
if segs_text ~= '' and segs_text ~= ARGV[8 + 3 * n] then return {'check', segs_text} end
local seen, ids, records, usages = {}, {}, {}, {}
for k = 9 + 3 * n, #ARGV do seen[ARGV[k]] = true end
for k = 1, n do
  local id = ARGV[7 + k]
  if not seen[id] then
    seen[id] = true
    if not redis.call('ZSCORE', I, id) then
      ids[#ids + 1] = id
      records[#records + 1] = ARGV[7 + n + k]
      usages[#usages + 1] = ARGV[7 + 2 * n + k]
    end
  end
end
local added = #ids
if added == 0 then
  -- A retry of an append already stored: WAIT counts replicas of this connection's writes, so write something
  -- (a no-op increment, which Redis still replicates) for it to cover the stored messages, whoever stored them.
  if ARGV[7] == '1' and redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HINCRBY', KEYS[1], 'next', 0) end
  return 0
end
reindex(5, ARGV[1], ARGV[5], ARGV[6])
local seq = tonumber(redis.call('HINCRBY', KEYS[1], 'next', added)) - added
local scored, used, parts = {}, {}, {}
for k = 1, added do
  scored[2 * k - 1] = seq + k - 1
  scored[2 * k] = ids[k]
  if usages[k] ~= '' then
    used[#used + 1] = seq + k - 1
    used[#used + 1] = (seq + k - 1) .. ':' .. usages[k]
    parts[#parts + 1] = usages[k]
  end
end
chunked('ZADD', I, scored, 2000)
chunked('RPUSH', M, records, 1000)
chunked('ZADD', U, used, 2000)
add_usage(parts, 1)
touch(ARGV[1])
expire(tonumber(ARGV[2]))
local cap = tonumber(ARGV[3])
if cap > 0 then
  local length = redis.call('LLEN', M)
  local over = length + held(segs) - cap
  if over > 0 then
    if SHARED or #segs > 0 then return {'trim', added} end
    local head = seq + added - length
    drop_usage(head, head + over - 1)
    redis.call('LTRIM', M, over, -1)
    redis.call('ZREMRANGEBYRANK', I, 0, over - 1)
  end
end
return added
""",
)

# KEYS: h, m, i, u [, tenant index, tenants index, tenant's tags (standalone only, as for APPEND)]
# ARGV: keep_last, ttl_ms, now_us, tenant, session_id, checked (segments), over (what the store planned to
#       remove), usage_1..usage_k (of the messages it removes from segments of other sessions' logs)
# Removes the oldest messages beyond keep_last: whole segments or their heads first (a segment's log is
# shared: only the session's bounds move, and a segment it no longer holds any of drops its hold), then the head
# of its own log. Returns {how many, k, records key of each of the k logs of another slot to release..., far...},
# or {'need', segments, over} when it removes messages of another session's log, whose usage the store reads first.
# A trim that removes some is a write (stamp, indexes, TTL, as a pop); one that removes none changes nothing.
TRIM = Script(
    "trim",
    _EXPIRE
    + """
locate()
local length = redis.call('LLEN', M)
local segs, segs_text = segments()
local over = length + held(segs) - tonumber(ARGV[1])
if over <= 0 then return {0} end
if SHARED then
  leave_shared_log()
  length = 0
  segs, segs_text = segments()
end
local left, kept, dropped, parts, foreign = over, {}, {}, {}, false
for _, seg in ipairs(segs) do
  local take = math.min(left, seg[6] - seg[5] + 1)
  if take > 0 then
    if local_key(seg[3]) then
      for _, part in ipairs(usages_in(seg[3], seg[5], seg[5] + take - 1)) do parts[#parts + 1] = part end
    else
      foreign = true
    end
    seg[5] = seg[5] + take
    left = left - take
  end
  if seg[5] <= seg[6] then kept[#kept + 1] = seg else dropped[#dropped + 1] = seg end
end
if foreign then
  if segs_text ~= ARGV[6] or tostring(over) ~= ARGV[7] then return {'need', segs_text, over} end
  for k = 8, #ARGV do parts[#parts + 1] = ARGV[k] end
end
local released = release(dropped, {})
store_segments(kept)
add_usage(parts, -1)
if left > 0 then
  local head = tonumber(redis.call('HGET', KEYS[1], 'next') or '0') - length
  drop_usage(head, head + left - 1)
  redis.call('LTRIM', M, left, -1)
  redis.call('ZREMRANGEBYRANK', I, 0, left - 1)
end
reindex(5, ARGV[3], ARGV[4], ARGV[5])
touch(ARGV[3])
expire(tonumber(ARGV[2]))
return far(with_records({over, #released}, released))
""",
)

# KEYS: h, m, i, u, receipt [, tenant index, tenants index, tenant's tags (standalone only, as for APPEND)]
# ARGV: now_us, ttl_ms, receipt_ms, tenant, session_id, records key, seq, record, usage (the newest message of
#       a segment of another session's log, as the store read it; '' when it has not)
# Removes the newest message and returns its record, or false when there is none. From the session's own
# log: the record and its id (the id of the highest sequence number); from a segment (a fork's inherited
# messages, or a shared log): only the session's bound moves, and a segment left empty drops its hold. With work
# for the store in other slots it returns {'after', record, the records key of that segment's log when it is in
# another slot ('' else), far...}. Returns {'need', records key, usage key, seq, head} when that message is in
# another session's log (the store reads it and runs it again). The record
# stays in the receipt key for receipt_ms: the client retries a command whose connection dropped, and a retry
# of a pop that did run must return its record, not pop another.
POP = Script(
    "pop",
    _EXPIRE
    + """
local done = redis.call('GET', KEYS[5])
if done then return done end
locate()
if SHARED and redis.call('LLEN', M) > 0 then leave_shared_log() end
local record = redis.call('RPOP', M)
local parts = {}
local seq, foreign
if record then
  redis.call('ZREMRANGEBYRANK', I, -1, -1)
  seq = redis.call('HINCRBY', KEYS[1], 'next', -1)
  drop_usage(seq, seq)
else
  local segs = segments()
  local seg = segs[#segs]
  if not seg then return false end
  seq = seg[6]
  if local_key(seg[1]) then
    record = redis.call('LINDEX', seg[1], seq - seg[4])
    parts = usages_in(seg[3], seq, seq)
  elseif ARGV[6] == seg[1] and tonumber(ARGV[7]) == seq then
    record = ARGV[8]
    if ARGV[9] ~= '' then parts = {ARGV[9]} end
  else
    return {'need', seg[1], seg[3], seq, seg[4]}
  end
  seg[6] = seq - 1
  if seg[6] < seg[5] then
    segs[#segs] = nil
    foreign = release({seg}, {})[1]
  end
  store_segments(segs)
  redis.call('HINCRBY', KEYS[1], 'next', -1)
  add_usage(parts, -1)
end
redis.call('SET', KEYS[5], record, 'PX', ARGV[3])
reindex(6, ARGV[1], ARGV[4], ARGV[5])
touch(ARGV[1])
expire(tonumber(ARGV[2]))
if foreign or #FAR > 0 then return far({'after', record, foreign or ''}) end
return record
""",
)

# KEYS: h, m, i, u   ARGV: from_seq (-1: the head), batch, created (the session's creation stamp, '' on the first page)
# Returns {created, next_seq, segments, record...}: the records of the session's own log from from_seq on, and
# its segments ('' for none: the store reads those itself); created is false when the session is gone, or was
# re-created since the first page (the iteration stops instead of mixing two lives of one key).
PAGE = Script(
    "page",
    _LOG
    + """
local created = redis.call('HGET', KEYS[1], 'created')
if not created or (ARGV[3] ~= '' and created ~= ARGV[3]) then return {false, 0, ''} end
locate()
local _, segs_text = segments()
local len = redis.call('LLEN', M)
local first = tonumber(redis.call('HGET', KEYS[1], 'next') or '0') - len
local from = math.max(tonumber(ARGV[1]), first)
local start = from - first
local records = redis.call('LRANGE', M, start, start + tonumber(ARGV[2]) - 1)
return with_records({created, from + #records, segs_text}, records)
""",
)

# KEYS: h, m, i, u   ARGV: last (-1: every record of the session's own log, 0: none)
# Returns {segments ('' for none), length of the session's own log, record...}: the newest records of its own log.
VIEW = Script(
    "view",
    _LOG
    + """
locate()
local _, segs_text = segments()
local length = redis.call('LLEN', M)
local last = tonumber(ARGV[1])
local records = {}
if last ~= 0 then records = redis.call('LRANGE', M, last < 0 and 0 or -last, -1) end
return with_records({segs_text, length}, records)
""",
)

# KEYS: h, m, i, u   ARGV: before, last (-1: no bound)
# Returns {segments ('' for none), start, stop, record...}: the range's positions start..stop (stop clamped to the
# count; segments first, then the session's own log) and the records of it that the session's own log holds (one
# LRANGE); the store reads the rest from the segments' logs, which may be in other slots.
RANGE = Script(
    "range",
    _LOG
    + """
locate()
local segs, segs_text = segments()
local inherited = held(segs)
local stop = math.min(tonumber(ARGV[1]), inherited + redis.call('LLEN', M))
local last = tonumber(ARGV[2])
local start = last < 0 and 0 or math.max(0, stop - last)
local from = math.max(start, inherited)
local records = {}
if stop > from then records = redis.call('LRANGE', M, from - inherited, stop - inherited - 1) end
return with_records({segs_text, start, stop}, records)
""",
)

# KEYS: h, m, i, u (the source)   ARGV: through ('': the newest message), ttl_ms (of the forking store; 0: none),
#       acquired (the segments for whose logs in other slots the store holds a hold for the target: ACQUIRE),
#       checked (segments), through_seq (where the store found ``through`` in them), usage_1..usage_k (of the
#       messages after through_seq in segments of other sessions' logs)
# The source's half of a fork: finds the cut, shares the log it is in (renamed once, so that the session can go
# on in another log when it is deleted, popped or trimmed), takes the target's hold on each log of this slot it
# takes, and returns what the target takes: {'ok', segments, cut, usage, title, metadata, through}; {'empty'};
# {'missing'}; {'acquire', segments} when the source holds logs of other slots and the store has not taken the
# target's holds on them for these segments; or {'find', segments} when the cut is in a segment (the store finds
# ``through`` and the usage after it there, and runs it again).
FORK_SOURCE = Script(
    "fork_source",
    _EXPIRE
    + """
locate()
local length = redis.call('LLEN', M)
local segs, segs_text = segments()
if length + held(segs) == 0 then return {'empty'} end
if segs_text ~= ARGV[3] then
  for _, seg in ipairs(segs) do
    if not local_key(seg[1]) then return {'acquire', segs_text} end
  end
end
local next = tonumber(redis.call('HGET', KEYS[1], 'next') or '0')
local head = next - length
local cut, through
if ARGV[1] == '' then
  if length > 0 then cut = next - 1 end
else
  local score = redis.call('ZSCORE', I, ARGV[1])
  if score and tonumber(score) >= head then cut = tonumber(score) end
  through = ARGV[1]
end
local total = stored_usage()
local taken = {}
local was_shared = SHARED
if cut then
  if not through then through = redis.call('ZRANGEBYSCORE', I, cut, cut)[1] end
  if not NAME then
    local name = redis.call('HGET', KEYS[1], 'created') .. '.' .. redis.call('HINCRBY', KEYS[1], 'logs', 1)
    for n = 2, 4 do
      if redis.call('EXISTS', KEYS[n]) == 1 then redis.call('RENAME', KEYS[n], KEYS[n] .. ':' .. name) end
    end
    redis.call('HSET', KEYS[1], 'log', name)
    M, I, U, NAME = KEYS[2] .. ':' .. name, KEYS[3] .. ':' .. name, KEYS[4] .. ':' .. name, name
  end
  redis.call('HSET', KEYS[1], 'shared', '1')
  SHARED = true
  for _, seg in ipairs(segs) do taken[#taken + 1] = seg end
  taken[#taken + 1] = {M, I, U, head, head, cut}
  summed(total, usages_in(U, cut + 1, next - 1), -1)
else
  if #segs == 0 then return {'missing'} end
  if segs_text ~= ARGV[4] or ARGV[5] == '' then return {'find', segs_text} end
  cut = tonumber(ARGV[5])
  for _, seg in ipairs(segs) do
    if seg[5] <= cut then
      local part = {seg[1], seg[2], seg[3], seg[4], seg[5], math.min(seg[6], cut)}
      taken[#taken + 1] = part
      if local_key(seg[3]) then summed(total, usages_in(seg[3], cut + 1, seg[6]), -1) end
    elseif local_key(seg[3]) then
      summed(total, usages_in(seg[3], seg[5], seg[6]), -1)
    end
  end
  local after = {}
  for k = 6, #ARGV do after[#after + 1] = ARGV[k] end
  summed(total, after, -1)
  summed(total, usages_in(U, head, next - 1), -1)
end
-- The target's holds on the logs of this slot it takes (the current log's first share counts the source's too;
-- a log shared before logs counted their holders has no count, and is never freed).
for _, seg in ipairs(taken) do
  if local_key(seg[1]) then
    local refs = refs_of(seg[1])
    if seg[1] == M and not was_shared and redis.call('EXISTS', refs) == 0 then redis.call('SET', refs, 1) end
    if redis.call('EXISTS', refs) == 1 then redis.call('INCR', refs) end
  end
end
local ttl = tonumber(ARGV[2])
if SHARED then
  for _, key in ipairs({M, I, U, refs_of(M)}) do
    if ttl == 0 then redis.call('PERSIST', key) else redis.call('PEXPIRE', key, ttl, 'GT') end
  end
end
local info = redis.call('HMGET', KEYS[1], 'title', 'meta')
return {'ok', cjson.encode(taken), cut, usage_text(total), info[1] or '', info[2] or '', through}
""",
)

# KEYS: h, m, i, u (the target) [, tenant index, tenants index, tenant's tags (standalone only, as for APPEND)]
# ARGV: now_us, ttl_ms, tenant, session_id, segments, next, usage, title, metadata, source id, through id
# The target's half of a fork: creates the session holding the segments, unless it exists (returns 0).
FORK_TARGET = Script(
    "fork_target",
    _EXPIRE
    + """
if redis.call('EXISTS', KEYS[1]) == 1 or redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
reindex(5, ARGV[1], ARGV[3], ARGV[4])
redis.call('HSET', KEYS[1], 'segs', ARGV[5], 'next', ARGV[6], 'src', ARGV[10], 'thru', ARGV[11])
for field, n in pairs({usage = 7, title = 8, meta = 9}) do
  if ARGV[n] ~= '' then redis.call('HSET', KEYS[1], field, ARGV[n]) end
end
touch(ARGV[1])
expire(tonumber(ARGV[2]))
return 1
""",
)

# KEYS: h, m, i, u   ARGV: document, version, expected ('' + flag), has_expected ('2': ABSENT), owner, has_owner,
# now_us, ttl_ms   Returns {'ok', far...}, {'owner'} (bound to another owner) or {'conflict'} (the stored version is
# not the expected one; with ABSENT, there is a document: unless it is this very write's, retried).
SAVE_SESSION = Script(
    "save_session",
    _EXPIRE
    + """
locate()
local stored = redis.call('HMGET', KEYS[1], 'ver', 'owner')
if ARGV[6] == '1' and stored[2] and stored[2] ~= ARGV[5] then return {'owner'} end
if ARGV[4] == '1' and stored[1] ~= ARGV[3] then return {'conflict'} end
if ARGV[4] == '2' and stored[1] and stored[1] ~= ARGV[2] then return {'conflict'} end
redis.call('HSET', KEYS[1], 'doc', ARGV[1], 'ver', ARGV[2])
if ARGV[6] == '1' then redis.call('HSET', KEYS[1], 'owner', ARGV[5]) end
touch(ARGV[7])
expire(tonumber(ARGV[8]))
return far({'ok'})
""",
)

# KEYS: h, m, i, u   Returns {the session's last update (microseconds), records key of each log of another slot
# to release...} when it existed, else false. The session's own unshared log goes; it drops its hold on a log
# forks share and on each segment (the last hold frees a log).
DELETE = Script(
    "delete",
    _LOG
    + """
locate()
local updated = redis.call('HGET', KEYS[1], 'updated')
if NAME and not SHARED then redis.call('DEL', M, I, U) elseif NAME then release_local(M, I, U) end
local released = release((segments()), {updated or '0'})
local removed = redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
if removed == 0 then return false end
return released
""",
)

# KEYS: h, m, i, u   ARGV: cutoff_us   Deletes the session when it was last updated before the cut-off, as DELETE.
# Returns {1, records key of each log of another slot to release...} (deleted), 0 (updated since: kept) or -1
# (already gone).
PRUNE = Script(
    "prune",
    _LOG
    + """
locate()
local updated = redis.call('HGET', KEYS[1], 'updated')
if not updated then
  redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
  return -1
end
if tonumber(updated) >= tonumber(ARGV[1]) then return 0 end
if NAME and not SHARED then redis.call('DEL', M, I, U) elseif NAME then release_local(M, I, U) end
local released = release((segments()), {1})
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
return released
""",
)

# KEYS: the hold count, records, ids and usage of one log (``_layout.log_keys``)   Returns 1 when it took the hold,
# 0 when the log is gone (its last holder dropped it: the fork reads its source's segments again).
ACQUIRE = Script(
    "acquire",
    """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('INCR', KEYS[1])
return 1
""",
)

# KEYS: as for ACQUIRE   Drops one hold on the log; the last frees it (returns 1 then, else 0). A log without a
# count (shared before logs counted their holders) is never freed.
RELEASE = Script(
    "release",
    """
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('DECR', KEYS[1]) > 0 then return 0 end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
return 1
""",
)

# KEYS: an index (sorted set) [, the tenant's tags, for a tenant's index or tag index]   ARGV: member, max_score
# Removes the member unless a writer raised its score past max_score since it was read (writers update the
# index before the session, so a newer score means a write is under way and the entry must stay); with the
# tenant's tags, the session's tags go too (from the tags hash and every tag index).
DROP_INDEX_ENTRY = Script(
    "drop_index_entry",
    """
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) <= tonumber(ARGV[2]) then
  redis.call('ZREM', KEYS[1], ARGV[1])
  if KEYS[2] then
    local tags = redis.call('HGET', KEYS[2], ARGV[1])
    if tags then
      for _, tag in ipairs(cjson.decode(tags)) do redis.call('ZREM', KEYS[2] .. ':' .. tag, ARGV[1]) end
      redis.call('HDEL', KEYS[2], ARGV[1])
    end
  end
  return 1
end
return 0
""",
)

# KEYS: h, m, i, u   ARGV: now_us, ttl_ms, has_title, title ('': clear), has_metadata, metadata JSON ('': clear)
# Sets the session's title and metadata if it exists (a write: stamp and TTL); returns {1, far...}, or 0 when it
# does not.
UPDATE_INFO = Script(
    "update_info",
    _EXPIRE
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
locate()
local fields = {{'title', ARGV[3], ARGV[4]}, {'meta', ARGV[5], ARGV[6]}}
for _, field in ipairs(fields) do
  if field[2] == '1' then
    if field[3] == '' then
      redis.call('HDEL', KEYS[1], field[1])
    else
      redis.call('HSET', KEYS[1], field[1], field[3])
    end
  end
end
touch(ARGV[1])
expire(tonumber(ARGV[2]))
return far({1})
""",
)

# Shared by the scripts on a tenant's slot: KEYS[1] is the tenant's index, KEYS[2] the tenant's tags.
_TENANT = """
local function tag_all(tags, session_id, score)
  for _, tag in ipairs(tags) do redis.call('ZADD', KEYS[2] .. ':' .. tag, 'GT', score, session_id) end
end
"""

# KEYS: tenant index, tenant's tags   ARGV: now_us, session_id
# A write of the session, on a cluster (standalone, the session's script does it: reindex): the tenant's index
# and the session's tag indexes move it up to now.
TOUCH_TENANT = Script(
    "touch_tenant",
    _TENANT
    + """
redis.call('ZADD', KEYS[1], 'GT', ARGV[1], ARGV[2])
local tags = redis.call('HGET', KEYS[2], ARGV[2])
if tags then tag_all(cjson.decode(tags), ARGV[2], ARGV[1]) end
return 1
""",
)

# KEYS: tenant index, tenant's tags   ARGV: now_us, session_id, tags (a JSON array; [] clears them)
# Replaces the session's tags: it leaves the old tags' indexes and joins the new ones at its place in the
# tenant's index (which moves up to now, as any write does).
SET_TAGS = Script(
    "set_tags",
    _TENANT
    + """
local old = redis.call('HGET', KEYS[2], ARGV[2])
if old then
  for _, tag in ipairs(cjson.decode(old)) do redis.call('ZREM', KEYS[2] .. ':' .. tag, ARGV[2]) end
end
local tags = cjson.decode(ARGV[3])
if #tags == 0 then redis.call('HDEL', KEYS[2], ARGV[2]) else redis.call('HSET', KEYS[2], ARGV[2], ARGV[3]) end
redis.call('ZADD', KEYS[1], 'GT', ARGV[1], ARGV[2])
tag_all(tags, ARGV[2], redis.call('ZSCORE', KEYS[1], ARGV[2]))
return 1
""",
)
