"""``RedisState``: rollout state every worker and host shares, in one Redis (not Redis Cluster).

Each operation that must be atomic across replicas is one Lua script, and every time in it is
Redis's own clock (``TIME``), so replicas on hosts with skewed clocks still agree on when a lease
lapsed. Keys (``P`` is the prefix, ``osmosis`` by default)::

    P:init:<key>        hash rid, digest, status (0 = pending), body   the init record, with TTL
    P:rid:<rollout_id>  the key that runs this id                       one rollout per id
    P:leases            zset key -> lease expiry (ms)                    swept by every replica
    P:lease:<key>       what a peer needs to send the ERROR callback
    P:queued            hash replica -> rollouts waiting for a slot     max_queued, cluster-wide
    P:replica:<id>      heartbeat with the lease TTL                    a dead replica's queue
    P:outbox            stream of undeliverable callbacks
    P:outbox:due        zset entry id -> next attempt (ms)
    P:outbox:tries      hash entry id -> attempts;  P:outbox:errors: entry id -> last error

The store holds per-rollout API keys (to call TrainGate back for a dead replica and to redeliver
the outbox): protect it like the hosts themselves (no public bind, a password or ACL, TLS).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from ...errors import ConfigError
from .base import (
    BODY_CHANGED,
    ID_RUNNING,
    KEY_REUSED,
    Claim,
    ClaimOutcome,
    LeasedRollout,
    OutboxEntry,
    StateBackend,
    StateUnavailable,
)

try:
    import redis.asyncio as aioredis
    from redis import exceptions as redis_errors
except ModuleNotFoundError as exc:
    if (exc.name or "").partition(".")[0] != "redis":  # a dependency *of* redis: show it
        raise
    raise ConfigError(
        "a redis:// state URL needs the redis client package; install it with "
        "pip install 'osmosis-rollout[redis]'"
    ) from None

__all__ = ["RedisState", "redact_url"]

T = TypeVar("T")

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


#: Connections to Redis per server process (each call holds one for one round trip).
_MAX_CONNECTIONS = 64


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for banners, logs and /health)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    netloc = f"{user}:***@{host}{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisState(StateBackend):
    """Shared state in Redis at ``url`` (``redis://host:port/db``, ``rediss://`` for TLS)."""

    name = "redis"
    shared = True

    def __init__(self, url: str, *, prefix: str = "osmosis", first_retry_s: float = 5.0) -> None:
        self.url = url
        self.prefix = prefix
        self.first_retry_s = first_retry_s
        try:
            # A blocking pool: a burst of inits waits for a free connection (bounded, so Redis
            # is not flooded) instead of failing with "too many connections".
            pool = aioredis.BlockingConnectionPool.from_url(
                url,
                max_connections=_MAX_CONNECTIONS,
                timeout=10.0,
                socket_connect_timeout=2.0,
                socket_timeout=5.0,
            )
            self._redis = aioredis.Redis.from_pool(pool)
        except ValueError as exc:
            raise ConfigError(f"invalid state URL {redact_url(url)!r}: {exc}") from None
        register = self._redis.register_script
        self._claim = register(_CLAIM)
        self._release = register(_RELEASE)
        self._accept = register(_ACCEPT)
        self._unqueue = register(_UNQUEUE)
        self._queued = register(_QUEUED)
        self._renew = register(_RENEW)
        self._hold = register(_HOLD)
        self._finish = register(_FINISH)
        self._orphans = register(_ORPHANS)
        self._outbox_put = register(_OUTBOX_PUT)
        self._outbox_due = register(_OUTBOX_DUE)
        self._outbox_retry = register(_OUTBOX_RETRY)

    def describe(self) -> str:
        """The URL, password redacted."""
        return redact_url(self.url)

    async def close(self) -> None:
        """Close the connection pool."""
        await self._redis.aclose()

    def _k(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    async def _call(self, operation: Awaitable[T]) -> T:
        try:
            return await operation
        except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError) as exc:
            raise StateUnavailable(
                f"the rollout state store {self.describe()} is unreachable "
                f"({type(exc).__name__}); retry once it is back"
            ) from None
        except redis_errors.ResponseError as exc:
            raise StateUnavailable(
                f"the rollout state store {self.describe()} refused a command: {exc}"
            ) from None

    async def ping(self) -> bool:
        """Whether Redis answers ``PING`` now."""
        try:
            return bool(await self._call(self._redis.ping()))
        except StateUnavailable:
            return False

    # -- idempotency ----------------------------------------------------------------------------

    async def claim_init(
        self, key: str, rollout_id: str, digest: str, *, pending_ttl_s: float
    ) -> Claim:
        """See ``StateBackend.claim_init``."""
        found = await self._call(
            self._claim(
                keys=[self._k("init", key), self._k("rid", rollout_id)],
                args=[rollout_id, digest, _ms(pending_ttl_s), key],
            )
        )
        kind = _text(found[0])
        if kind == "claimed":
            return Claim(ClaimOutcome.CLAIMED)
        if kind == "pending":
            return Claim(ClaimOutcome.PENDING)
        if kind == "answered":
            return Claim(ClaimOutcome.ANSWERED, status=int(found[1]), body=bytes(found[2]))
        why = _text(found[1])
        detail = {"key": KEY_REUSED, "body": BODY_CHANGED}.get(why, ID_RUNNING)
        return Claim(ClaimOutcome.CONFLICT, detail=detail)

    async def release_init(self, key: str, rollout_id: str) -> None:
        """See ``StateBackend.release_init``."""
        await self._call(
            self._release(
                keys=[self._k("init", key), self._k("rid", rollout_id)], args=[rollout_id, key]
            )
        )

    async def accept(
        self,
        lease: LeasedRollout,
        *,
        digest: str,
        replica: str,
        status: int,
        body: bytes,
        lease_ttl_s: float,
        queue: bool,
        max_queued: int,
    ) -> bool:
        """See ``StateBackend.accept``."""
        key = lease.key
        done = await self._call(
            self._accept(
                keys=[
                    self._k("init", key),
                    self._k("rid", lease.rollout_id),
                    self._k("leases"),
                    self._k("lease", key),
                    self._k("queued"),
                ],
                args=[
                    replica,
                    status,
                    body,
                    _ms(lease_ttl_s),
                    int(queue),
                    max_queued,
                    lease.to_json(),
                    lease.rollout_id,
                    digest,
                    key,
                    self.prefix,
                ],
            )
        )
        return bool(done)

    async def unqueue(self, replica: str) -> None:
        """See ``StateBackend.unqueue``."""
        await self._call(self._unqueue(keys=[self._k("queued")], args=[replica]))

    async def queued(self) -> int:
        """Rollouts waiting for a slot on live replicas."""
        return int(await self._call(self._queued(keys=[self._k("queued")], args=[self.prefix])))

    # -- leases ---------------------------------------------------------------------------------

    async def renew(self, replica: str, keys: list[str], lease_ttl_s: float) -> None:
        """See ``StateBackend.renew``."""
        ttl = _ms(lease_ttl_s)
        heartbeat = self._k("replica", replica)
        for start in range(0, max(1, len(keys)), 1000):  # bounded script arguments
            chunk = keys[start : start + 1000]
            await self._call(self._renew(keys=[self._k("leases"), heartbeat], args=[ttl, *chunk]))

    async def hold(self, key: str, lease_ttl_s: float) -> bool:
        """See ``StateBackend.hold``."""
        held = await self._call(self._hold(keys=[self._k("leases")], args=[_ms(lease_ttl_s), key]))
        return bool(held)

    async def finish(self, key: str, rollout_id: str, record_ttl_s: float) -> None:
        """See ``StateBackend.finish``."""
        await self._call(
            self._finish(
                keys=[
                    self._k("leases"),
                    self._k("lease", key),
                    self._k("init", key),
                    self._k("rid", rollout_id),
                ],
                args=[key, rollout_id, _ms(record_ttl_s)],
            )
        )

    async def claim_orphans(self, limit: int, record_ttl_s: float) -> list[LeasedRollout]:
        """See ``StateBackend.claim_orphans``."""
        found = await self._call(
            self._orphans(keys=[self._k("leases")], args=[limit, self.prefix, _ms(record_ttl_s)])
        )
        return [LeasedRollout.from_json(data) for data in found]

    # -- outbox: a stream -----------------------------------------------------------------------

    def _outbox_keys(self) -> list[str]:
        return [
            self._k("outbox"),
            self._k("outbox", "due"),
            self._k("outbox", "tries"),
            self._k("outbox", "errors"),
        ]

    async def outbox_put(self, entry: OutboxEntry) -> str:
        """Append to the stream; peers try it after ``first_retry_s``."""
        record = {
            "rollout_id": entry.rollout_id,
            "server_url": entry.server_url,
            "error": entry.error,
            "written_at": entry.written_at,
            "response": entry.response,
            "api_key": entry.api_key,
        }
        stream, due, _, _ = self._outbox_keys()
        entry_id = await self._call(
            self._outbox_put(
                keys=[stream, due],
                args=[json.dumps(record, ensure_ascii=False), _ms(self.first_retry_s)],
            )
        )
        return f"{self.describe()} stream {stream} entry {_text(entry_id)}"

    def _entry(self, entry_id: Any, data: Any, tries: Any, error: Any) -> OutboxEntry:
        record = json.loads(data)
        ident = _text(entry_id)
        return OutboxEntry(
            id=ident,
            rollout_id=str(record["rollout_id"]),
            server_url=str(record["server_url"]),
            error=_text(error) if error else str(record.get("error", "")),
            written_at=float(record["written_at"]),
            response=dict(record["response"]),
            api_key=record.get("api_key"),
            attempts=int(tries or 0),
            location=f"{self._k('outbox')}#{ident}",
        )

    async def outbox_list(self) -> list[OutboxEntry]:
        """Every entry of the stream, oldest first, with its attempts and next retry."""
        stream, due, tries, errors = self._outbox_keys()
        redis: Any = self._redis  # redis-py's async stubs type replies too loosely to use
        rows = await self._call(redis.xrange(stream))
        attempts = await self._call(redis.hgetall(tries))
        last_errors = await self._call(redis.hgetall(errors))
        schedule = await self._call(redis.zrange(due, 0, -1, withscores=True))
        next_at = {_text(member): score / 1000 for member, score in schedule}
        entries = []
        for entry_id, fields in rows:
            entry = self._entry(
                entry_id,
                fields[b"entry"],
                attempts.get(entry_id),
                last_errors.get(entry_id),
            )
            entry.next_at = next_at.get(entry.id)
            entries.append(entry)
        return entries

    async def outbox_due(self, limit: int, visibility_s: float) -> list[OutboxEntry]:
        """Entries whose next attempt is due, hidden from peers for ``visibility_s``."""
        found = await self._call(
            self._outbox_due(keys=self._outbox_keys(), args=[limit, _ms(visibility_s)])
        )
        return [self._entry(*row) for row in found]

    async def outbox_done(self, entry: OutboxEntry) -> None:
        """Remove the entry and its bookkeeping."""
        stream, due, tries, errors = self._outbox_keys()
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.xdel(stream, entry.id)
            pipe.zrem(due, entry.id)
            pipe.hdel(tries, entry.id)
            pipe.hdel(errors, entry.id)
            await self._call(pipe.execute())

    async def outbox_retry(self, entry: OutboxEntry, delay_s: float | None, error: str) -> None:
        """Count the attempt and schedule the next (or none: then only a replay sends it)."""
        _, due, tries, errors = self._outbox_keys()
        delay = -1 if delay_s is None else _ms(delay_s)
        await self._call(
            self._outbox_retry(keys=[due, tries, errors], args=[entry.id, delay, error])
        )
