"""``RedisState``: rollout state every worker and host shares, in one Redis (not Redis Cluster).

Each operation that must be atomic across replicas is one Lua script (``redis_scripts.py``, on
Redis's own clock); reaching Redis and turning its failures into ours is ``redis_connection.py``.
This module maps ``StateBackend`` onto them. Keys (``P`` is the prefix, ``osmosis`` by default)::

    P:init:<key>        hash rid, digest, status (0 = pending), body   the init record, with TTL
    P:rid:<rollout_id>  the key that runs this id                       one rollout per id
    P:leases            zset key -> lease expiry (ms)                    swept by every replica
    P:lease:<key>       what a peer needs to send the ERROR callback
    P:queued            hash replica -> rollouts waiting for a slot     max_queued, cluster-wide
    P:replica:<id>      heartbeat with the lease TTL                    a dead replica's queue
    P:outbox            stream of undeliverable callbacks
    P:outbox:due        zset entry id -> next attempt (ms)
    P:outbox:tries      hash entry id -> attempts;  P:outbox:errors: entry id -> last error
    P:status:<rid>      hash protocol, replica, status, reward, err     status from any replica
    P:inflight          set of rollout ids not yet terminal             cancel by prefix / all
    P:cancels:<replica> list of rollout ids a peer asked it to cancel   polled by the owner

The store holds per-rollout API keys (to call TrainGate back for a dead replica and to redeliver
the outbox): protect it like the hosts themselves (no public bind, a password or ACL, TLS).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable
from typing import Any, TypeVar

from .base import (
    BODY_CHANGED,
    ID_RUNNING,
    KEY_REUSED,
    LEGACY_PROTOCOL,
    Claim,
    ClaimOutcome,
    LeasedRollout,
    OutboxEntry,
    StateBackend,
    StateUnavailable,
)
from .redis_connection import call, connect, redact_url
from .redis_scripts import Scripts

__all__ = ["RedisState"]

T = TypeVar("T")


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
        self._redis = connect(url)
        self._scripts = Scripts(self._redis)

    def describe(self) -> str:
        """The URL, password redacted."""
        return redact_url(self.url)

    async def close(self) -> None:
        """Close the connection pool."""
        await self._redis.aclose()

    def _k(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    async def _call(self, operation: Awaitable[T]) -> T:
        return await call(operation, self.describe)

    async def ping(self) -> bool:
        """Whether Redis answers ``PING`` now."""
        try:
            return bool(await self._call(self._redis.ping()))
        except StateUnavailable:
            return False

    # -- the polling wire's results -------------------------------------------------------------

    async def poll_result(self, rollout_id: str) -> tuple[str, bytes] | None:
        """See ``StateBackend.poll_result``."""
        redis: Any = self._redis
        digest, body = await self._call(
            redis.hmget(self._k("poll", rollout_id), "digest", "result")
        )
        if digest is None or body is None:
            return None
        return _text(digest), bytes(body)

    async def poll_put(
        self, rollout_id: str, digest: str, body: bytes, *, retention_s: float
    ) -> bool:
        """See ``StateBackend.poll_put``."""
        keys = [self._k("poll", rollout_id), self._k("poll-lease", rollout_id)]
        done = await self._call(
            self._scripts.poll_put(keys=keys, args=[digest, body, _ms(retention_s)])
        )
        return bool(done)

    async def poll_lease_route(self, key: str) -> dict[str, Any] | None:
        """See ``StateBackend.poll_lease_route``."""
        redis: Any = self._redis
        text = await self._call(redis.get(self._k("lease", key)))
        if text is None:
            return None
        data: dict[str, Any] = json.loads(text)
        return data

    async def poll_renew(self, rollout_id: str, lease_s: float) -> None:
        """See ``StateBackend.poll_renew``."""
        redis: Any = self._redis
        await self._call(redis.set(self._k("poll-lease", rollout_id), b"1", px=_ms(lease_s)))

    async def poll_lease_left(self, rollout_id: str) -> float:
        """See ``StateBackend.poll_lease_left``."""
        redis: Any = self._redis
        left = await self._call(redis.pttl(self._k("poll-lease", rollout_id)))
        return max(0, int(left)) / 1000

    # -- idempotency ----------------------------------------------------------------------------

    async def claim_init(
        self, key: str, rollout_id: str, digest: str, *, pending_ttl_s: float
    ) -> Claim:
        """See ``StateBackend.claim_init``."""
        found = await self._call(
            self._scripts.claim(
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
            self._scripts.release(
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
            self._scripts.accept(
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
        await self._call(self._scripts.unqueue(keys=[self._k("queued")], args=[replica]))

    async def queued(self) -> int:
        """Rollouts waiting for a slot on live replicas."""
        return int(
            await self._call(self._scripts.queued(keys=[self._k("queued")], args=[self.prefix]))
        )

    # -- leases ---------------------------------------------------------------------------------

    async def renew(self, replica: str, keys: list[str], lease_ttl_s: float) -> None:
        """See ``StateBackend.renew``."""
        ttl = _ms(lease_ttl_s)
        heartbeat = self._k("replica", replica)
        for start in range(0, max(1, len(keys)), 1000):  # bounded script arguments
            chunk = keys[start : start + 1000]
            await self._call(
                self._scripts.renew(keys=[self._k("leases"), heartbeat], args=[ttl, *chunk])
            )

    async def hold(self, key: str, lease_ttl_s: float) -> bool:
        """See ``StateBackend.hold``."""
        held = await self._call(
            self._scripts.hold(keys=[self._k("leases")], args=[_ms(lease_ttl_s), key])
        )
        return bool(held)

    async def update_lease(self, lease: LeasedRollout) -> None:
        """See ``StateBackend.update_lease``: only while the lease's data is still there."""
        redis: Any = self._redis
        await self._call(redis.set(self._k("lease", lease.key), lease.to_json(), xx=True))

    async def finish(self, key: str, rollout_id: str, record_ttl_s: float) -> None:
        """See ``StateBackend.finish``."""
        await self._call(
            self._scripts.finish(
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
            self._scripts.orphans(
                keys=[self._k("leases")], args=[limit, self.prefix, _ms(record_ttl_s)]
            )
        )
        return [LeasedRollout.from_json(data) for data in found]

    # -- status and cancel across replicas -------------------------------------------------------

    async def publish_status(
        self,
        rollout_id: str,
        protocol: str,
        replica: str,
        status: str,
        *,
        reward: float | None = None,
        err_message: str | None = None,
        ttl_s: float | None = None,
    ) -> None:
        """See ``StateBackend.publish_status``; in flight it lives a day at most (an orphan
        sweep publishes the end of a dead replica's rollouts)."""
        terminal = ttl_s is not None
        await self._call(
            self._scripts.status_set(
                keys=[self._k("status", rollout_id), self._k("inflight")],
                args=[
                    rollout_id,
                    protocol,
                    replica,
                    status,
                    "" if reward is None else repr(reward),
                    err_message or "",
                    _ms(ttl_s if ttl_s is not None else 86_400.0),
                    int(terminal),
                ],
            )
        )

    async def rollout_status(self, rollout_id: str, protocol: str) -> dict[str, Any] | None:
        """See ``StateBackend.rollout_status``."""
        redis: Any = self._redis
        found = await self._call(redis.hgetall(self._k("status", rollout_id)))
        if not found or _text(found.get(b"protocol", b"")) != protocol:
            return None
        status = _text(found[b"status"])
        reward = _text(found.get(b"reward", b""))
        err = _text(found.get(b"err", b""))
        success = status == "success"
        return {
            "rollout_id": rollout_id,
            "status": status,
            "reward": float(reward) if reward and success else None,
            "err_message": err if err and status in ("failure", "cancelled") else None,
        }

    async def request_cancel(self, rollout_id: str, protocol: str) -> str:
        """See ``StateBackend.request_cancel``."""
        done = await self._call(
            self._scripts.cancel(
                keys=[self._k("status", rollout_id)], args=[rollout_id, protocol, self.prefix]
            )
        )
        return _text(done)

    async def request_cancel_matching(
        self, prefix: str, protocol: str, replica: str
    ) -> dict[str, str]:
        """See ``StateBackend.request_cancel_matching``."""
        found = await self._call(
            self._scripts.cancel_matching(
                keys=[self._k("inflight")], args=[prefix, protocol, self.prefix, replica]
            )
        )
        return {_text(found[i]): _text(found[i + 1]) for i in range(0, len(found), 2)}

    async def take_cancels(self, replica: str) -> list[str]:
        """See ``StateBackend.take_cancels``."""
        found = await self._call(self._scripts.take_cancels(keys=[self._k("cancels", replica)]))
        return [_text(rid) for rid in found]

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
            "protocol": entry.protocol,
            "route": entry.route,
        }
        stream, due, _, _ = self._outbox_keys()
        entry_id = await self._call(
            self._scripts.outbox_put(
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
            protocol=str(record.get("protocol") or LEGACY_PROTOCOL),
            route=record.get("route"),
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
            self._scripts.outbox_due(keys=self._outbox_keys(), args=[limit, _ms(visibility_s)])
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
            self._scripts.outbox_retry(keys=[due, tries, errors], args=[entry.id, delay, error])
        )
