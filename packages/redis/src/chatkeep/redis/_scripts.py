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
    "APPEND",
    "DELETE",
    "DROP_INDEX_ENTRY",
    "PAGE",
    "POP",
    "PRUNE",
    "SAVE_SESSION",
    "SET_TAGS",
    "TOUCH_TENANT",
    "TRIM",
    "UPDATE_INFO",
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


# Shared by every write: restart the TTL of the session's keys, stamp the session, update the indexes.
_EXPIRE = """
local function expire(ttl)
  if ttl > 0 then
    redis.call('PEXPIRE', KEYS[1], ttl)
    redis.call('PEXPIRE', KEYS[2], ttl)
    redis.call('PEXPIRE', KEYS[3], ttl)
    redis.call('PEXPIRE', KEYS[4], ttl)
  end
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
-- Add (sign 1) or take off (sign -1) usages (SessionUsage.to_dict as JSON) to the session's usage (KEYS[1]).
local function add_usage(parts, sign)
  if #parts == 0 then return end
  local stored = redis.call('HGET', KEYS[1], 'usage')
  local total = {input_tokens = 0, output_tokens = 0, total_tokens = 0, calls = 0, models = {}}
  if stored then total = cjson.decode(stored) end
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
  if total.calls == 0 then
    redis.call('HDEL', KEYS[1], 'usage')
  else
    redis.call('HSET', KEYS[1], 'usage', cjson.encode(total))
  end
end
-- Take the usage of the messages numbered first..last (KEYS[4]) off the session's.
local function drop_usage(first, last)
  if last < first then return end
  local rows = redis.call('ZRANGEBYSCORE', KEYS[4], first, last)
  if #rows == 0 then return end
  local parts = {}
  for k, row in ipairs(rows) do parts[k] = string.sub(row, string.find(row, ':', 1, true) + 1) end
  add_usage(parts, -1)
  redis.call('ZREMRANGEBYSCORE', KEYS[4], first, last)
end
-- unpack() is limited by Lua's C stack: push in chunks.
local function chunked(command, key, items, step)
  for start = 1, #items, step do
    redis.call(command, key, unpack(items, start, math.min(start + step - 1, #items)))
  end
end
"""

# KEYS: h, m, i, u [, tenant index, tenants index, tenant's tags (standalone only: a cluster writes them first, apart)]
# ARGV: now_us, ttl_ms, max_messages (0: none), n, tenant, session_id, replicated (1: the store WAITs for replicas),
#       id_1..id_n, record_1..record_n, usage_1..usage_n ('': the message carries none)
# Returns how many messages were new.
APPEND = Script(
    "append",
    _EXPIRE
    + """
local n = tonumber(ARGV[4])
local seen, ids, records, usages = {}, {}, {}, {}
for k = 1, n do
  local id = ARGV[7 + k]
  if not seen[id] then
    seen[id] = true
    if not redis.call('ZSCORE', KEYS[3], id) then
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
chunked('ZADD', KEYS[3], scored, 2000)
chunked('RPUSH', KEYS[2], records, 1000)
chunked('ZADD', KEYS[4], used, 2000)
add_usage(parts, 1)
touch(ARGV[1])
local cap = tonumber(ARGV[3])
if cap > 0 then
  local length = redis.call('LLEN', KEYS[2])
  local over = length - cap
  if over > 0 then
    local head = seq + added - length
    drop_usage(head, head + over - 1)
    redis.call('LTRIM', KEYS[2], over, -1)
    redis.call('ZREMRANGEBYRANK', KEYS[3], 0, over - 1)
  end
end
expire(tonumber(ARGV[2]))
return added
""",
)

# KEYS: h, m, i, u [, tenant index, tenants index, tenant's tags (standalone only, as for APPEND)]
# ARGV: keep_last, ttl_ms, now_us, tenant, session_id
# Returns how many messages were removed. A trim that removes some is a write (stamp, indexes, TTL, as a pop);
# one that removes none changes nothing.
TRIM = Script(
    "trim",
    _EXPIRE
    + """
local length = redis.call('LLEN', KEYS[2])
local over = length - tonumber(ARGV[1])
if over <= 0 then return 0 end
local head = tonumber(redis.call('HGET', KEYS[1], 'next') or '0') - length
drop_usage(head, head + over - 1)
redis.call('LTRIM', KEYS[2], over, -1)
redis.call('ZREMRANGEBYRANK', KEYS[3], 0, over - 1)
reindex(5, ARGV[3], ARGV[4], ARGV[5])
touch(ARGV[3])
expire(tonumber(ARGV[2]))
return over
""",
)

# KEYS: h, m, i, u, receipt [, tenant index, tenants index, tenant's tags (standalone only, as for APPEND)]
# ARGV: now_us, ttl_ms, receipt_ms, tenant, session_id
# Removes the newest record and its id (the id of the highest sequence number) and returns the record, or
# false when there is none. The record stays in the receipt key for receipt_ms: the client retries a command
# whose connection dropped, and a retry of a pop that did run must return its record, not pop another.
POP = Script(
    "pop",
    _EXPIRE
    + """
local done = redis.call('GET', KEYS[5])
if done then return done end
local record = redis.call('RPOP', KEYS[2])
if not record then return false end
redis.call('ZREMRANGEBYRANK', KEYS[3], -1, -1)
local seq = redis.call('HINCRBY', KEYS[1], 'next', -1)
drop_usage(seq, seq)
redis.call('SET', KEYS[5], record, 'PX', ARGV[3])
reindex(6, ARGV[1], ARGV[4], ARGV[5])
touch(ARGV[1])
expire(tonumber(ARGV[2]))
return record
""",
)

# KEYS: h, m   ARGV: from_seq (-1: the head), batch, created (the session's creation stamp, '' on the first page)
# Returns {created, next_seq, record...}; created is false when the session is gone, or was re-created
# since the first page (the iteration stops instead of mixing two lives of one key).
PAGE = Script(
    "page",
    """
local created = redis.call('HGET', KEYS[1], 'created')
if not created or (ARGV[3] ~= '' and created ~= ARGV[3]) then return {false, 0} end
local len = redis.call('LLEN', KEYS[2])
local first = tonumber(redis.call('HGET', KEYS[1], 'next') or '0') - len
local from = math.max(tonumber(ARGV[1]), first)
local start = from - first
local records = redis.call('LRANGE', KEYS[2], start, start + tonumber(ARGV[2]) - 1)
local reply = {created, from + #records}
for k = 1, #records do reply[k + 2] = records[k] end
return reply
""",
)

# KEYS: h, m, i, u   ARGV: document, version, expected ('' + flag), has_expected, owner, has_owner, now_us, ttl_ms
# Returns 'ok', 'owner' (bound to another owner) or 'conflict' (the stored version is not the expected one).
SAVE_SESSION = Script(
    "save_session",
    _EXPIRE
    + """
local stored = redis.call('HMGET', KEYS[1], 'ver', 'owner')
if ARGV[6] == '1' and stored[2] and stored[2] ~= ARGV[5] then return 'owner' end
if ARGV[4] == '1' and stored[1] ~= ARGV[3] then return 'conflict' end
redis.call('HSET', KEYS[1], 'doc', ARGV[1], 'ver', ARGV[2])
if ARGV[6] == '1' then redis.call('HSET', KEYS[1], 'owner', ARGV[5]) end
touch(ARGV[7])
expire(tonumber(ARGV[8]))
return 'ok'
""",
)

# KEYS: h, m, i, u   Returns the session's last update (microseconds) when it existed, else false.
DELETE = Script(
    "delete",
    """
local updated = redis.call('HGET', KEYS[1], 'updated')
local removed = redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
if removed == 0 then return false end
return updated or '0'
""",
)

# KEYS: h, m, i, u   ARGV: cutoff_us   Deletes the session when it was last updated before the cut-off.
# Returns 1 (deleted), 0 (updated since: kept) or -1 (already gone).
PRUNE = Script(
    "prune",
    """
local updated = redis.call('HGET', KEYS[1], 'updated')
if not updated then
  redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
  return -1
end
if tonumber(updated) >= tonumber(ARGV[1]) then return 0 end
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
# Sets the session's title and metadata if it exists (a write: stamp and TTL); returns 1, or 0 when it does not.
UPDATE_INFO = Script(
    "update_info",
    _EXPIRE
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
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
return 1
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
