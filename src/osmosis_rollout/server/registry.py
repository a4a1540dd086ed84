"""The server's memory of rollouts: idempotency, admission, counts, TTL and drain.

All bookkeeping happens on the event loop without awaiting between a lookup and the matching
reservation, so concurrent duplicate inits see one consistent state.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum

import anyio

from ..protocol import RolloutRequest
from ..rollout import RolloutControl

__all__ = ["Conflict", "Phase", "RolloutEntry", "RolloutRegistry"]


class Phase(Enum):
    """Where one accepted (or about-to-be-accepted) rollout is in its life."""

    PENDING = "pending"  # init in progress (get_tools running)
    QUEUED = "queued"  # accepted, waiting for a concurrency slot
    RUNNING = "running"  # agent running
    DELIVERING = "delivering"  # sending the completion callback
    DONE = "done"


@dataclass
class RolloutEntry:
    """One rollout as the registry tracks it; ``init_*`` is the answer every duplicate gets."""

    request: RolloutRequest
    key: str
    phase: Phase = Phase.PENDING
    init_status: int = 0
    init_body: bytes = b""
    init_ready: anyio.Event = field(default_factory=anyio.Event)
    finished: anyio.Event = field(default_factory=anyio.Event)
    control: RolloutControl = field(default_factory=RolloutControl)
    delivery: anyio.CancelScope | None = None  # set while the callback is being sent
    accepted_at: float = field(default_factory=time.perf_counter)
    done_at: float | None = None

    @property
    def rollout_id(self) -> str:
        """The rollout's id."""
        return self.request.rollout_id


@dataclass(frozen=True)
class Conflict:
    """Why an init was refused with 409."""

    detail: str


class RolloutRegistry:
    """Tracks rollouts by idempotency key and by rollout id; counts what ``/health`` shows."""

    def __init__(self, *, max_concurrent: int, max_queued: int, record_ttl_s: float) -> None:
        self.max_concurrent = max_concurrent
        self.max_queued = max_queued
        self.record_ttl_s = record_ttl_s
        self.by_key: dict[str, RolloutEntry] = {}
        self.by_id: dict[str, RolloutEntry] = {}  # rollouts not yet done, by rollout_id
        self.completed_total = 0
        self.draining = False
        self._drained: anyio.Event | None = None
        self._counts = dict.fromkeys(Phase, 0)

    # -- idempotency ----------------------------------------------------------------------------

    def lookup(self, request: RolloutRequest) -> RolloutEntry | Conflict | None:
        """The entry a duplicate should reuse, a conflict, or None for a new rollout."""
        entry = self.by_key.get(request.dedup_key)
        if entry is not None and self._stale(entry, time.perf_counter()):
            del self.by_key[entry.key]
            entry = None
        if entry is not None:
            if entry.rollout_id != request.rollout_id:
                return Conflict(
                    "idempotency_key is already used by a different rollout_id; use a new "
                    "idempotency_key for a new rollout"
                )
            return entry
        running = self.by_id.get(request.rollout_id)
        if running is not None:
            return Conflict(
                "rollout_id is already running under another idempotency_key; one rollout per "
                "id at a time"
            )
        return None

    def reserve(self, request: RolloutRequest) -> RolloutEntry:
        """Register a new rollout as pending (call right after a ``lookup`` returned None)."""
        entry = RolloutEntry(request=request, key=request.dedup_key)
        self._counts[Phase.PENDING] += 1
        self.by_key[entry.key] = entry
        self.by_id[entry.rollout_id] = entry
        return entry

    def release(self, entry: RolloutEntry, status: int, body: bytes) -> None:
        """Refuse a pending rollout: waiting duplicates get the same answer, retries start anew."""
        entry.init_status, entry.init_body = status, body
        entry.init_ready.set()
        self._counts[entry.phase] -= 1  # a refused init is counted nowhere
        self._forget(entry)

    # -- admission ------------------------------------------------------------------------------

    def has_capacity(self) -> bool:
        """Whether one more rollout may be accepted (a free slot, or room in the queue).

        Accepted rollouts count as queued until their task takes a slot, so a burst of inits
        that arrives before any task has started is still bounded by slots + queue.
        """
        return self.active + self.queued < self.max_concurrent + self.max_queued

    def accept(self, entry: RolloutEntry, status: int, body: bytes) -> None:
        """Mark a pending rollout accepted and queued; duplicates now get ``body``."""
        self._move(entry, Phase.QUEUED)
        entry.accepted_at = time.perf_counter()
        entry.init_status, entry.init_body = status, body
        entry.init_ready.set()

    def finish(self, entry: RolloutEntry) -> None:
        """The callback was handled: free the rollout id, keep a slim record for the TTL.

        The record keeps what a duplicate init needs (ids and the 202 body), not the
        conversation: thousands of finished rollouts stay cheap for the whole TTL.
        """
        entry.control.context = None
        entry.control.scope = None
        entry.request = entry.request.model_copy(
            update={"messages": [], "metadata": {}, "completion_params": {}}
        )
        self._move(entry, Phase.DONE)
        entry.done_at = time.perf_counter()
        if self.by_id.get(entry.rollout_id) is entry:
            del self.by_id[entry.rollout_id]
        self.completed_total += 1
        entry.finished.set()

    def start(self, entry: RolloutEntry) -> None:
        """The rollout got a concurrency slot; its agent starts now."""
        self._move(entry, Phase.RUNNING)

    def delivering(self, entry: RolloutEntry) -> None:
        """The agent is done; the completion callback is being sent."""
        self._move(entry, Phase.DELIVERING)

    def _move(self, entry: RolloutEntry, phase: Phase) -> None:
        self._counts[entry.phase] -= 1
        self._counts[phase] += 1
        entry.phase = phase

    # -- counts, TTL, drain ---------------------------------------------------------------------

    @property
    def active(self) -> int:
        """Rollouts whose agent is running or whose callback is being sent."""
        return self._counts[Phase.RUNNING] + self._counts[Phase.DELIVERING]

    @property
    def queued(self) -> int:
        """Accepted rollouts waiting for a concurrency slot."""
        return self._counts[Phase.QUEUED]

    def unfinished(self) -> list[RolloutEntry]:
        """Accepted rollouts that have not sent their callback yet."""
        return [e for e in self.by_id.values() if e.phase is not Phase.PENDING]

    def expire(self) -> int:
        """Drop finished records older than the TTL; returns how many were dropped."""
        return self._expire(time.perf_counter())

    def _expire(self, now: float) -> int:
        stale = [key for key, e in self.by_key.items() if self._stale(e, now)]
        for key in stale:
            del self.by_key[key]
        return len(stale)

    def _stale(self, entry: RolloutEntry, now: float) -> bool:
        return entry.done_at is not None and now - entry.done_at > self.record_ttl_s

    def _forget(self, entry: RolloutEntry) -> None:
        if self.by_key.get(entry.key) is entry:
            del self.by_key[entry.key]
        if self.by_id.get(entry.rollout_id) is entry:
            del self.by_id[entry.rollout_id]

    async def drain(self, grace_s: float, delivery_s: float) -> None:
        """Stop accepting, let rollouts finish for ``grace_s``, then cancel the rest and wait
        up to ``delivery_s`` for their ``ERROR``/``cancelled`` callbacks; deliveries still
        pending then are stopped, which writes their results to the outbox right away.

        Runs once: a second call (the lifespan's, after ``serve`` drained on SIGTERM) only waits
        for the first, so the worst case stays ``grace_s + delivery_s`` plus the outbox writes.
        """
        if self._drained is not None:
            await self._drained.wait()
            return
        self._drained = anyio.Event()
        self.draining = True
        try:
            with anyio.move_on_after(grace_s):
                for entry in self.unfinished():
                    await entry.finished.wait()
            for entry in self.unfinished():
                entry.control.cancel()
            with anyio.move_on_after(delivery_s):
                for entry in self.unfinished():
                    await entry.finished.wait()
            for entry in self.unfinished():
                if entry.delivery is not None:
                    entry.delivery.cancel()
            # Cancelled deliveries write their outbox file and finish without awaiting again;
            # give them a moment to run (an agent that ignores cancellation is not waited for).
            with anyio.move_on_after(1.0):
                for entry in self.unfinished():
                    if entry.phase is Phase.DELIVERING:
                        await entry.finished.wait()
        finally:
            self._drained.set()
