"""The Lua scripts behind ``RedisState``: one per operation that must be atomic across replicas.

Kept apart from the backend's Python so each atomic step reads as one piece (the keys they touch
are listed in ``redis.py``). Every time in them is Redis's own clock (``TIME``), so replicas on
hosts with skewed clocks still agree on when a lease lapsed. ``Scripts`` registers them on one
client; redis-py then runs each by its SHA and loads it again if Redis has forgotten it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import redis.asyncio as aioredis

__all__ = ["Scripts"]

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS: init, rid.  ARGV: rid, digest, pending_ms, key
_CLAIM = """
local r = redis.call('HMGET', KEYS[1], 'rid', 'digest', 'status', 'body')
if r[1] then
  if r[1] ~= ARGV[1] then return {'conflict', 'key'} end
  if r[2] ~= ARGV[2] then return {'conflict', 'body'} end
  if r[3] == '0' then return {'pending'} end
  return {'answered', r[3], r[4]}
end
local owner = redis.call('GET', KEYS[2])
if owner and owner ~= ARGV[4] then return {'conflict', 'running'} end
redis.call('HSET', KEYS[1], 'rid', ARGV[1], 'digest', ARGV[2], 'status', '0')
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('SET', KEYS[2], ARGV[4], 'PX', ARGV[3])
return {'claimed'}
"""

# KEYS: init, rid.  ARGV: rid, key
_RELEASE = """
if redis.call('HGET', KEYS[1], 'rid') == ARGV[1] then redis.call('DEL', KEYS[1]) end
if redis.call('GET', KEYS[2]) == ARGV[2] then redis.call('DEL', KEYS[2]) end
return 1
"""

# KEYS: init, rid, leases, lease, queued.
# ARGV: replica, status, body, lease_ms, queue, max_queued, lease_json, rid, digest, key, prefix
# The record, the id and the lease data live until finish (or an orphan sweep) sets their TTL.
_ACCEPT = (
    """
if ARGV[5] == '1' then
  local vals = redis.call('HGETALL', KEYS[5])
  local total = 0
  for i = 1, #vals, 2 do
    if vals[i] == ARGV[1] or redis.call('EXISTS', ARGV[11] .. ':replica:' .. vals[i]) == 1 then
      total = total + tonumber(vals[i + 1])
    else
      redis.call('HDEL', KEYS[5], vals[i])
    end
  end
  if total >= tonumber(ARGV[6]) then return 0 end
  redis.call('HINCRBY', KEYS[5], ARGV[1], 1)
end
"""
    + _NOW
    + """
redis.call('HSET', KEYS[1], 'rid', ARGV[8], 'digest', ARGV[9], 'status', ARGV[2],
           'body', ARGV[3])
redis.call('PERSIST', KEYS[1])
redis.call('SET', KEYS[2], ARGV[10])
redis.call('SET', KEYS[4], ARGV[7])
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[4]), ARGV[10])
return 1
"""
)

# KEYS: queued.  ARGV: replica
_UNQUEUE = """
local n = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
if n > 1 then redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
elseif n == 1 then redis.call('HDEL', KEYS[1], ARGV[1]) end
return 1
"""

# KEYS: queued.  ARGV: prefix.  Drops the counts of replicas whose heartbeat lapsed.
_QUEUED = """
local vals = redis.call('HGETALL', KEYS[1])
local total = 0
for i = 1, #vals, 2 do
  if redis.call('EXISTS', ARGV[1] .. ':replica:' .. vals[i]) == 1 then
    total = total + tonumber(vals[i + 1])
  else
    redis.call('HDEL', KEYS[1], vals[i])
  end
end
return total
"""

# KEYS: leases, heartbeat.  ARGV: lease_ms, key...
_RENEW = (
    _NOW
    + """
redis.call('SET', KEYS[2], '1', 'PX', ARGV[1])
local expiry = now + tonumber(ARGV[1])
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], 'XX', expiry, ARGV[i]) end
return 1
"""
)

# KEYS: leases.  ARGV: lease_ms, key
_HOLD = (
    _NOW
    + """
if not redis.call('ZSCORE', KEYS[1], ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[1]), ARGV[2])
return 1
"""
)

# KEYS: leases, lease, init, rid.  ARGV: key, rid, record_ms
_FINISH = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[2])
if redis.call('HGET', KEYS[3], 'rid') == ARGV[2] then redis.call('PEXPIRE', KEYS[3], ARGV[3]) end
if redis.call('GET', KEYS[4]) == ARGV[1] then redis.call('DEL', KEYS[4]) end
return 1
"""

# KEYS: leases.  ARGV: limit, prefix, record_ms.  Each lapsed lease goes to exactly one caller.
_ORPHANS = (
    _NOW
    + """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local out = {}
for _, key in ipairs(due) do
  redis.call('ZREM', KEYS[1], key)
  local lease = ARGV[2] .. ':lease:' .. key
  local data = redis.call('GET', lease)
  redis.call('DEL', lease)
  if data then
    local rid = cjson.decode(data)['rollout_id']
    local ridkey = ARGV[2] .. ':rid:' .. rid
    if redis.call('GET', ridkey) == key then redis.call('DEL', ridkey) end
    local init = ARGV[2] .. ':init:' .. key
    if redis.call('HGET', init, 'rid') == rid then redis.call('PEXPIRE', init, ARGV[3]) end
    table.insert(out, data)
  end
end
return out
"""
)

# KEYS: outbox, due.  ARGV: entry_json, first_delay_ms (-1: never automatically)
_OUTBOX_PUT = (
    _NOW
    + """
local id = redis.call('XADD', KEYS[1], '*', 'entry', ARGV[1])
if tonumber(ARGV[2]) >= 0 then redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), id) end
return id
"""
)

# KEYS: outbox, due, tries, errors.  ARGV: limit, visibility_ms
_OUTBOX_DUE = (
    _NOW
    + """
local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local out = {}
for _, id in ipairs(ids) do
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), id)
  local found = redis.call('XRANGE', KEYS[1], id, id)
  if #found == 0 then
    redis.call('ZREM', KEYS[2], id)
  else
    local tries = redis.call('HGET', KEYS[3], id) or '0'
    local err = redis.call('HGET', KEYS[4], id) or ''
    table.insert(out, {id, found[1][2][2], tries, err})
  end
end
return out
"""
)

# KEYS: due, tries, errors.  ARGV: id, delay_ms (-1: only on replay), error
_OUTBOX_RETRY = (
    _NOW
    + """
redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
if tonumber(ARGV[2]) >= 0 then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
else
  redis.call('ZREM', KEYS[1], ARGV[1])
end
return 1
"""
)


# KEYS: status, inflight.  ARGV: rid, protocol, replica, status, reward, err, ttl_ms, terminal
# A cancel already asked for stays asked for (a later phase must not clear it).
_STATUS_SET = """
redis.call('HSET', KEYS[1], 'protocol', ARGV[2], 'replica', ARGV[3], 'status', ARGV[4],
           'reward', ARGV[5], 'err', ARGV[6])
redis.call('PEXPIRE', KEYS[1], ARGV[7])
if ARGV[8] == '1' then redis.call('SREM', KEYS[2], ARGV[1])
else redis.call('SADD', KEYS[2], ARGV[1]) end
return 1
"""

# The disposition of one rollout's cancel, passed on to its replica's cancel list.
_CANCEL_ONE = """
local function cancel_one(status_key, rid, protocol, prefix, skip)
  local s = redis.call('HMGET', status_key, 'protocol', 'replica', 'status', 'cancel')
  if not s[1] or s[1] ~= protocol or s[4] or s[2] == skip then return 'not_found' end
  local d
  if s[3] == 'queued' then d = 'cancelled_queued'
  elseif s[3] == 'running' or s[3] == 'grading' then d = 'cancelled_running'
  else return 'not_found' end
  redis.call('HSET', status_key, 'cancel', '1')
  local list = prefix .. ':cancels:' .. s[2]
  redis.call('RPUSH', list, rid)
  redis.call('PEXPIRE', list, 600000)
  return d
end
"""

# KEYS: status.  ARGV: rid, protocol, prefix
_CANCEL = (
    _CANCEL_ONE
    + """
return cancel_one(KEYS[1], ARGV[1], ARGV[2], ARGV[3], '')
"""
)

# KEYS: inflight.  ARGV: id prefix, protocol, key prefix, this replica (its own are skipped)
_CANCEL_MATCHING = (
    _CANCEL_ONE
    + """
local out = {}
for _, rid in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if string.sub(rid, 1, string.len(ARGV[1])) == ARGV[1] then
    local key = ARGV[3] .. ':status:' .. rid
    if redis.call('EXISTS', key) == 0 then redis.call('SREM', KEYS[1], rid)
    else
      local d = cancel_one(key, rid, ARGV[2], ARGV[3], ARGV[4])
      if d ~= 'not_found' then table.insert(out, rid); table.insert(out, d) end
    end
  end
end
return out
"""
)

# KEYS: cancels.  Takes the whole list.
_TAKE_CANCELS = """
local ids = redis.call('LRANGE', KEYS[1], 0, -1)
redis.call('DEL', KEYS[1])
return ids
"""


# KEYS: poll, poll-lease.  ARGV: digest, body, retention_ms
_POLL_PUT = """
if redis.call('HSETNX', KEYS[1], 'result', ARGV[2]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'digest', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('DEL', KEYS[2])
return 1
"""


class Scripts:
    """The scripts registered on one client, one attribute per operation."""

    def __init__(self, client: aioredis.Redis) -> None:
        register = client.register_script
        self.claim = register(_CLAIM)
        self.release = register(_RELEASE)
        self.accept = register(_ACCEPT)
        self.unqueue = register(_UNQUEUE)
        self.queued = register(_QUEUED)
        self.renew = register(_RENEW)
        self.hold = register(_HOLD)
        self.finish = register(_FINISH)
        self.orphans = register(_ORPHANS)
        self.outbox_put = register(_OUTBOX_PUT)
        self.outbox_due = register(_OUTBOX_DUE)
        self.outbox_retry = register(_OUTBOX_RETRY)
        self.status_set = register(_STATUS_SET)
        self.cancel = register(_CANCEL)
        self.cancel_matching = register(_CANCEL_MATCHING)
        self.take_cancels = register(_TAKE_CANCELS)
        self.poll_put = register(_POLL_PUT)
