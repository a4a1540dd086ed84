"""The state a rollout server shares with its peers: init claims, admission, leases, outbox.

One ``StateBackend`` per server. ``memory`` keeps it in the process (one replica, today's
behaviour); ``redis`` keeps it where every worker and host sees it, so a retried init is claimed
once cluster-wide and a replica's death is noticed by the others. The server keeps its own
per-process bookkeeping (``registry``); the backend holds only what other replicas must see.

Every method is async and atomic with respect to every replica sharing the backend.
"""

from __future__ import annotations

import abc
import hashlib
import json
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from ...errors import OsmosisError
from ...protocol import RolloutRequest

if TYPE_CHECKING:
    from ..types import DeliveryTarget

__all__ = [
    "LEGACY_PROTOCOL",
    "Claim",
    "ClaimOutcome",
    "LeasedRollout",
    "OutboxEntry",
    "StateBackend",
    "StateUnavailable",
    "fingerprint",
]


class StateUnavailable(OsmosisError):
    """The shared state store cannot be reached; new work must be refused until it is back."""


class ClaimOutcome(Enum):
    """What ``claim_init`` found for an idempotency key."""

    CLAIMED = "claimed"  # first one: the caller owns the init and must answer or release it
    ANSWERED = "answered"  # a duplicate: ``status`` and ``body`` are the first init's answer
    PENDING = "pending"  # a duplicate whose first init is still being decided; ask again
    CONFLICT = "conflict"  # refuse with 409 and ``detail``


@dataclass(frozen=True)
class Claim:
    """The result of ``claim_init``."""

    outcome: ClaimOutcome
    status: int = 0
    body: bytes = b""
    detail: str = ""


KEY_REUSED = (
    "idempotency_key is already used by a different rollout_id; use a new idempotency_key for a "
    "new rollout"
)
BODY_CHANGED = (
    "idempotency_key is already used by a different request body for this rollout_id; a retry "
    "must resend the same body, a new rollout needs a new idempotency_key"
)
ID_RUNNING = (
    "rollout_id is already running under another idempotency_key; one rollout per id at a time"
)


def fingerprint(request: RolloutRequest) -> int:
    """A 64-bit digest of what makes two inits "the same": the body without the per-rollout
    key (a retry may carry a refreshed one) and without the idempotency key (it is the lookup),
    insensitive to key order and spacing, so every replica computes the same one."""
    body = request.model_dump(mode="json", exclude={"api_key", "idempotency_key"})
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return int.from_bytes(hashlib.blake2b(canonical.encode(), digest_size=8).digest(), "big")


#: The wire of an outbox entry or a lease that names none: v1, only because such an entry was
#: written before protocol v2 existed (since then every writer names its wire).
LEGACY_PROTOCOL = "v1"


@dataclass(frozen=True, slots=True)
class LeasedRollout:
    """What a peer needs to end a rollout whose replica died: where and how to call back
    (``protocol`` and ``route`` rebuild its wire's target, see ``DeliveryTarget.record``)."""

    key: str
    rollout_id: str
    server_url: str
    api_key: str | None
    messages: list[dict[str, Any]]
    protocol: str = LEGACY_PROTOCOL
    route: dict[str, Any] | None = None

    @classmethod
    def of(cls, request: RolloutRequest, target: DeliveryTarget | None = None) -> LeasedRollout:
        """The lease data of ``request``, delivered to ``target`` (v1's when None)."""
        if target is None:
            return cls(
                key=request.dedup_key,
                rollout_id=request.rollout_id,
                server_url=request.server_url,
                api_key=request.api_key_value,
                messages=list(request.messages),
            )
        return cls(
            key=request.dedup_key,
            rollout_id=request.rollout_id,
            server_url=target.server_url,
            api_key=target.api_key,
            messages=list(request.messages),
            protocol=target.protocol,
            route=target.record(),
        )

    def to_json(self) -> str:
        """Serialised for the store (the api_key included: the store is trusted like the host)."""
        data = {name: getattr(self, name) for name in self.__slots__}
        return json.dumps(data, ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> LeasedRollout:
        """Read back what ``to_json`` wrote."""
        data = json.loads(text)
        return cls(**data)


@dataclass
class OutboxEntry:
    """One result that could not be delivered (yet); ``protocol`` and ``route`` rebuild its
    wire's target, ``route`` also saying which parts are still to deliver (v2)."""

    id: str
    rollout_id: str
    server_url: str
    error: str
    written_at: float
    response: dict[str, Any]
    api_key: str | None = field(default=None, repr=False)
    attempts: int = 0
    next_at: float | None = None  # when a replica retries it; None = only on replay
    location: str = ""  # a file path or ``redis://.../stream#id``, for people
    #: The wire that rebuilds its target (``Wire.protocol``); every writer names it.
    protocol: str = LEGACY_PROTOCOL
    route: dict[str, Any] | None = None

    def public(self) -> dict[str, Any]:
        """What ``osmosis outbox list`` may show: everything except the per-rollout key."""
        return {
            "id": self.id,
            "rollout_id": self.rollout_id,
            "server_url": self.server_url,
            "protocol": self.protocol,
            "pending": (self.route or {}).get("pending", ["completion"]),
            "status": self.response.get("status"),
            "finish_reason": self.response.get("finish_reason"),
            "error": self.error,
            "written_at": self.written_at,
            "attempts": self.attempts,
            "next_at": self.next_at,
            "location": self.location,
        }


class StateBackend(abc.ABC):
    """Shared rollout state. Subclasses: ``MemoryState`` and ``RedisState``."""

    #: "memory" or "redis", as ``/health`` reports it.
    name: str = ""
    #: Whether other processes see this state (then leases are swept and the outbox redelivered).
    shared: bool = False

    async def open(self) -> None:  # noqa: B027 - optional hook
        """Connect (the server's lifespan calls it once)."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Disconnect."""

    def describe(self) -> str:
        """Where the state lives, without credentials."""
        return self.name

    @abc.abstractmethod
    async def ping(self) -> bool:
        """Whether the store answers now."""

    # -- idempotency ----------------------------------------------------------------------------

    # -- the polling wire's results (a shared state only) ----------------------------------------

    async def poll_result(self, rollout_id: str) -> tuple[str, bytes] | None:
        """A polling rollout's stored result and its lease digest (hex), or None."""
        raise NotImplementedError("one process keeps its polling results in memory")

    async def poll_put(
        self, rollout_id: str, digest: str, body: bytes, *, retention_s: float
    ) -> bool:
        """Store a polling result for ``retention_s``; the first put wins (False for later
        ones), and the lease others renewed ends."""
        raise NotImplementedError("one process keeps its polling results in memory")

    async def poll_lease_route(self, key: str) -> dict[str, Any] | None:
        """The lease data (``LeasedRollout`` fields) of a rollout in flight on any replica."""
        raise NotImplementedError("one process keeps its polling results in memory")

    async def poll_renew(self, rollout_id: str, lease_s: float) -> None:
        """A poll reached this replica: the controller's lease runs ``lease_s`` from now."""
        raise NotImplementedError("one process keeps its polling results in memory")

    async def poll_lease_left(self, rollout_id: str) -> float:
        """How long the lease renewed on other replicas still runs (0: lapsed, or never)."""
        raise NotImplementedError("one process keeps its polling results in memory")

    @abc.abstractmethod
    async def claim_init(
        self, key: str, rollout_id: str, digest: str, *, pending_ttl_s: float
    ) -> Claim:
        """Claim ``key`` for a new init, or say what the earlier init with that key became.

        A claim not answered or released within ``pending_ttl_s`` lapses (its replica died).
        """

    @abc.abstractmethod
    async def release_init(self, key: str, rollout_id: str) -> None:
        """Forget a claimed init that was refused, so that a retry starts anew."""

    @abc.abstractmethod
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
        """Publish the 202 for duplicates and take the rollout's lease.

        With ``queue`` the rollout also takes a place in the cluster-wide queue; returns False
        (and changes nothing) when ``max_queued`` places are taken. The record then lives until
        ``finish`` (or a peer's ``claim_orphans``) starts its TTL.
        """

    @abc.abstractmethod
    async def unqueue(self, replica: str) -> None:
        """A queued rollout of ``replica`` got its concurrency slot."""

    @abc.abstractmethod
    async def queued(self) -> int:
        """Rollouts waiting for a slot, cluster-wide."""

    def expire(self) -> int:
        """Drop lapsed records the store does not expire by itself; returns how many."""
        return 0

    # -- leases ---------------------------------------------------------------------------------

    @abc.abstractmethod
    async def renew(self, replica: str, keys: list[str], lease_ttl_s: float) -> None:
        """Extend the leases of ``keys`` (those still held) and the replica's heartbeat."""

    @abc.abstractmethod
    async def hold(self, key: str, lease_ttl_s: float) -> bool:
        """Renew one lease; False if it lapsed and a peer took the rollout as an orphan."""

    async def update_lease(self, lease: LeasedRollout) -> None:  # noqa: B027 - optional hook
        """Replace a held lease's data (a v2 rollout's settled callbacks, then what is still due),
        so a peer ending it as an orphan sends those, not a contradicting ERROR; nothing if the
        lease is gone."""

    @abc.abstractmethod
    async def finish(self, key: str, rollout_id: str, record_ttl_s: float) -> None:
        """The rollout's callback was handled: drop the lease, keep the record for the TTL."""

    @abc.abstractmethod
    async def claim_orphans(self, limit: int, record_ttl_s: float) -> list[LeasedRollout]:
        """Take rollouts whose lease lapsed; each is returned to exactly one caller. Their
        records stay ``record_ttl_s`` for duplicates; their ids are free to run again."""

    # -- status and cancel across replicas (only a shared state has any) -------------------------

    async def publish_status(  # noqa: B027 - optional hook
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
        """Publish a rollout's status for its peers (``ttl_s``: kept that long, once terminal)."""

    async def rollout_status(self, rollout_id: str, protocol: str) -> dict[str, Any] | None:
        """A status a peer published for ``rollout_id`` (a status route's body), or None."""
        return None

    async def request_cancel(self, rollout_id: str, protocol: str) -> str:
        """Pass a cancel on to the replica running ``rollout_id``; its disposition."""
        return "not_found"

    async def request_cancel_matching(
        self, prefix: str, protocol: str, replica: str
    ) -> dict[str, str]:
        """``request_cancel`` for every in-flight rollout of other replicas matching ``prefix``."""
        return {}

    async def take_cancels(self, replica: str) -> list[str]:
        """The rollout ids peers asked ``replica`` to cancel since the last call."""
        return []

    # -- outbox ---------------------------------------------------------------------------------

    @abc.abstractmethod
    async def outbox_put(self, entry: OutboxEntry) -> str:
        """Keep an undeliverable callback; returns where it went."""

    @abc.abstractmethod
    async def outbox_list(self) -> list[OutboxEntry]:
        """Every kept callback, oldest first."""

    @abc.abstractmethod
    async def outbox_due(self, limit: int, visibility_s: float) -> list[OutboxEntry]:
        """Entries due for redelivery, hidden from peers for ``visibility_s`` while tried."""

    @abc.abstractmethod
    async def outbox_done(self, entry: OutboxEntry) -> None:
        """The entry was delivered: remove it."""

    @abc.abstractmethod
    async def outbox_retry(self, entry: OutboxEntry, delay_s: float | None, error: str) -> None:
        """Delivery failed again: try again after ``delay_s`` (None: only on replay)."""
