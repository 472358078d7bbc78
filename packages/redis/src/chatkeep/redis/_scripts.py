"""The Lua scripts that make each write one atomic server-side step.

A session's keys share one hash tag, so a script touching them runs on one cluster node. The keys:

* ``h``: a hash with ``next`` (the sequence number the next message gets), ``created`` and ``updated``
  (microseconds since the epoch), and the session document (``doc``, ``ver``, ``owner``);
* ``m``: a list of message records in append order; the head's sequence number is ``next - LLEN(m)``;
* ``i``: a sorted set of the stored message ids scored by sequence number, for idempotent appends and
  for removing the ids of trimmed and popped messages by rank.

Scripts are run with EVALSHA; when a server does not know a script (restarted, flushed, another cluster
node), the store falls back to EVAL, which also caches it there.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

__all__ = ["APPEND", "DELETE", "DROP_INDEX_ENTRY", "PAGE", "POP", "PRUNE", "SAVE_SESSION", "TRIM", "Script"]


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
  end
end
local function touch(now)
  redis.call('HSETNX', KEYS[1], 'created', now)
  local updated = tonumber(redis.call('HGET', KEYS[1], 'updated') or '0')
  if tonumber(now) > updated then redis.call('HSET', KEYS[1], 'updated', now) end
end
-- KEYS[at] is the tenant's index and KEYS[at + 1] the tenants' index, when the script was given them
-- (standalone only: a cluster keeps them on other nodes, and the store updates them apart).
local function reindex(at, now, tenant, session_id)
  if #KEYS > at then
    redis.call('ZADD', KEYS[at + 1], 'GT', now, tenant)
    redis.call('ZADD', KEYS[at], 'GT', now, session_id)
  end
end
-- unpack() is limited by Lua's C stack: push in chunks.
local function chunked(command, key, items, step)
  for start = 1, #items, step do
    redis.call(command, key, unpack(items, start, math.min(start + step - 1, #items)))
  end
end
"""

# KEYS: h, m, i [, tenant index, tenants index (standalone only: a cluster writes them first, apart)]
# ARGV: now_us, ttl_ms, max_messages (0: none), n, tenant, session_id, replicated (1: the store WAITs for replicas),
#       id_1..id_n, record_1..record_n
# Returns how many messages were new.
APPEND = Script(
    "append",
    _EXPIRE
    + """
local n = tonumber(ARGV[4])
local seen, ids, records = {}, {}, {}
for k = 1, n do
  local id = ARGV[7 + k]
  if not seen[id] then
    seen[id] = true
    if not redis.call('ZSCORE', KEYS[3], id) then
      ids[#ids + 1] = id
      records[#records + 1] = ARGV[7 + n + k]
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
reindex(4, ARGV[1], ARGV[5], ARGV[6])
local seq = tonumber(redis.call('HINCRBY', KEYS[1], 'next', added)) - added
local scored = {}
for k = 1, added do
  scored[2 * k - 1] = seq + k - 1
  scored[2 * k] = ids[k]
end
chunked('ZADD', KEYS[3], scored, 2000)
chunked('RPUSH', KEYS[2], records, 1000)
touch(ARGV[1])
local cap = tonumber(ARGV[3])
if cap > 0 then
  local over = redis.call('LLEN', KEYS[2]) - cap
  if over > 0 then
    redis.call('LTRIM', KEYS[2], over, -1)
    redis.call('ZREMRANGEBYRANK', KEYS[3], 0, over - 1)
  end
end
expire(tonumber(ARGV[2]))
return added
""",
)

# KEYS: h, m, i [, tenant index, tenants index (standalone only, as for APPEND)]
# ARGV: keep_last, ttl_ms, now_us, tenant, session_id
# Returns how many messages were removed. A trim that removes some is a write (stamp, indexes, TTL, as a pop);
# one that removes none changes nothing.
TRIM = Script(
    "trim",
    _EXPIRE
    + """
local over = redis.call('LLEN', KEYS[2]) - tonumber(ARGV[1])
if over <= 0 then return 0 end
redis.call('LTRIM', KEYS[2], over, -1)
redis.call('ZREMRANGEBYRANK', KEYS[3], 0, over - 1)
reindex(4, ARGV[3], ARGV[4], ARGV[5])
touch(ARGV[3])
expire(tonumber(ARGV[2]))
return over
""",
)

# KEYS: h, m, i, receipt [, tenant index, tenants index (standalone only, as for APPEND)]
# ARGV: now_us, ttl_ms, receipt_ms, tenant, session_id
# Removes the newest record and its id (the id of the highest sequence number) and returns the record, or
# false when there is none. The record stays in the receipt key for receipt_ms: the client retries a command
# whose connection dropped, and a retry of a pop that did run must return its record, not pop another.
POP = Script(
    "pop",
    _EXPIRE
    + """
local done = redis.call('GET', KEYS[4])
if done then return done end
local record = redis.call('RPOP', KEYS[2])
if not record then return false end
redis.call('ZREMRANGEBYRANK', KEYS[3], -1, -1)
redis.call('HINCRBY', KEYS[1], 'next', -1)
redis.call('SET', KEYS[4], record, 'PX', ARGV[3])
reindex(5, ARGV[1], ARGV[4], ARGV[5])
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

# KEYS: h, m, i   ARGV: document, version, expected ('' + flag), has_expected, owner, has_owner, now_us, ttl_ms
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

# KEYS: h, m, i   Returns the session's last update (microseconds) when it existed, else false.
DELETE = Script(
    "delete",
    """
local updated = redis.call('HGET', KEYS[1], 'updated')
local removed = redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
if removed == 0 then return false end
return updated or '0'
""",
)

# KEYS: h, m, i   ARGV: cutoff_us   Deletes the session when it was last updated before the cut-off.
# Returns 1 (deleted), 0 (updated since: kept) or -1 (already gone).
PRUNE = Script(
    "prune",
    """
local updated = redis.call('HGET', KEYS[1], 'updated')
if not updated then
  redis.call('DEL', KEYS[2], KEYS[3])
  return -1
end
if tonumber(updated) >= tonumber(ARGV[1]) then return 0 end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
return 1
""",
)

# KEYS: an index (sorted set)   ARGV: member, max_score
# Removes the member unless a writer raised its score past max_score since it was read (writers update the
# index before the session, so a newer score means a write is under way and the entry must stay).
DROP_INDEX_ENTRY = Script(
    "drop_index_entry",
    """
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) <= tonumber(ARGV[2]) then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 1
end
return 0
""",
)
