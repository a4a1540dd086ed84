"""The server's memory of rollouts: idempotency, admission, counts, TTL and drain.

All bookkeeping happens on the event loop without awaiting between a lookup and the matching
reservation, so concurrent duplicate inits see one consistent state. A finished rollout shrinks
to a ``FinishedRecord`` (id, request fingerprint, outcome, time, and how it ended for status
requests; the tools' JSON and common endings shared between records): what idempotency and
status need for the record TTL, at most ``max_records`` of them.
"""

from __future__ import annotations

import collections
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

import anyio

from ..protocol import RolloutRequest
from ..rollout import RolloutControl
from .types import Answer, DeliveryTarget, Terminal

__all__ = [
    "CANCELLED_BY_TRAINER",
    "DEFAULT_MAX_RECORDS",
    "AcceptedBody",
    "Conflict",
    "FinishedRecord",
    "Phase",
    "RolloutEntry",
    "RolloutRegistry",
    "cancel_entry",
]

#: Finished records kept at most (oldest dropped first, even inside the TTL): about 220 bytes
#: each (see docs/security.md), so the cap bounds them near 220 MB.
DEFAULT_MAX_RECORDS = 1_000_000
#: The reason a trainer's cancel gives (its callback's error message says so).
CANCELLED_BY_TRAINER = "cancelled by the trainer"
#: Builds the 202 body of an accepted rollout from its id and its tools' JSON (the wire's).
AcceptedBody = Callable[[str, bytes], bytes]


class _Tools:
    """One tools JSON, shared by every record whose 202 listed the same tools."""

    __slots__ = ("__weakref__", "json")

    def __init__(self, json: bytes) -> None:
        self.json = json


class Phase(Enum):
    """Where one accepted (or about-to-be-accepted) rollout is in its life."""

    PENDING = "pending"  # init in progress (get_tools running)
    QUEUED = "queued"  # accepted, waiting for a concurrency slot
    RUNNING = "running"  # agent running
    GRADING = "grading"  # the agent's grade() running
    DELIVERING = "delivering"  # sending the completion callback
    DONE = "done"


@dataclass(slots=True)
class RolloutEntry:
    """One rollout as the registry tracks it; ``init_*`` is the answer every duplicate gets.

    Slotted, and its two events are made only when someone waits (a duplicate init during
    get_tools, a drain, a test): most rollouts never need them, and each costs ~760 bytes.
    An accepted entry rebuilds its 202 from the shared tools JSON rather than keeping a copy.
    """

    request: RolloutRequest
    key: str
    fingerprint: int = 0
    phase: Phase = Phase.PENDING
    init_status: int = 0  # 0 until the first init is answered
    init_body: bytes = b""  # a refusal's body (an accepted one is rebuilt from ``tools``)
    control: RolloutControl = field(default_factory=RolloutControl)
    delivery: anyio.CancelScope | None = None  # set while the callback is being sent
    waiting: anyio.CancelScope | None = None  # set while it waits for a slot (a cancel ends it)
    accepted_at: float = field(default_factory=time.perf_counter)
    outcome: str = "done"  # set by the server before finish(): the callback's status or "outbox"
    tools: _Tools | None = None
    target: DeliveryTarget | None = None  # where its traffic goes (set by the scheduler)
    #: How it ended, once known (set before its callbacks are sent): status, reward, message.
    terminal: Terminal | None = None
    #: Its init body's size: counted in ``RolloutRegistry.queued_bytes`` while it waits.
    size: int = 0
    _init_ready: anyio.Event | None = None
    _finished: anyio.Event | None = None

    @property
    def rollout_id(self) -> str:
        """The rollout's id."""
        return self.request.rollout_id

    @property
    def finished(self) -> anyio.Event:
        """Set once the rollout's callback was handled (``RolloutRegistry.finish``)."""
        if self._finished is None:
            self._finished = anyio.Event()
            if self.phase is Phase.DONE:
                self._finished.set()
        return self._finished

    def answered(self, status: int, body: bytes = b"") -> None:
        """The first init's answer is known: wake the duplicates waiting for it."""
        self.init_status, self.init_body = status, body
        if self._init_ready is not None:
            self._init_ready.set()

    def done(self) -> None:
        """The rollout is over: wake whoever waits on ``finished``."""
        if self._finished is not None:
            self._finished.set()

    async def init_answer(self, accepted: AcceptedBody) -> Answer:
        """What every duplicate init gets (once the first init is answered); an accepted one's
        body is rebuilt by ``accepted``."""
        if not self.init_status:
            if self._init_ready is None:
                self._init_ready = anyio.Event()
            await self._init_ready.wait()
        if self.init_status == 202 and self.tools is not None:
            return Answer(202, accepted(self.rollout_id, self.tools.json))
        return Answer(self.init_status, self.init_body)


class FinishedRecord:
    """What remains of a finished rollout for the record TTL: enough to answer a duplicate and
    a status request (the terminal status, reward and message: about 60 bytes more)."""

    __slots__ = (
        "done_at",
        "fingerprint",
        "key",
        "outcome",
        "protocol",
        "rollout_id",
        "terminal",
        "tools",
    )
    phase = Phase.DONE

    def __init__(self, entry: RolloutEntry, tools: _Tools, done_at: float) -> None:
        self.key = entry.key
        self.rollout_id = entry.rollout_id
        self.fingerprint = entry.fingerprint
        self.outcome = entry.outcome
        self.tools = tools
        self.done_at = done_at
        self.terminal = entry.terminal
        self.protocol = entry.target.protocol if entry.target is not None else ""

    async def init_answer(self, accepted: AcceptedBody) -> Answer:
        """The first init's 202, rebuilt by ``accepted``."""
        return Answer(202, accepted(self.rollout_id, self.tools.json))


def cancel_entry(entry: RolloutEntry, reason: str) -> str:
    """Cancel a live rollout for its trainer; the disposition (spec 14.5): ``cancelled_queued``
    before its agent runs, ``cancelled_running`` while it (or its grade) runs, ``not_found``
    once its result is known or it was cancelled already."""
    control = entry.control
    if control.cancelled or entry.terminal is not None:
        return "not_found"
    if entry.phase in (Phase.PENDING, Phase.QUEUED):
        control.cancel(reason)
        if entry.waiting is not None:
            entry.waiting.cancel()
        return "cancelled_queued"
    if entry.phase in (Phase.RUNNING, Phase.GRADING):
        control.cancel(reason)
        return "cancelled_running"
    return "not_found"


@dataclass(frozen=True)
class Conflict:
    """Why an init was refused with 409."""

    detail: str


class RolloutRegistry:
    """Tracks rollouts by idempotency key and by rollout id; counts what ``/health`` shows."""

    def __init__(
        self,
        *,
        max_concurrent: int,
        max_queued: int,
        record_ttl_s: float,
        max_records: int = DEFAULT_MAX_RECORDS,
    ) -> None:
        self.max_concurrent = max_concurrent
        self.max_queued = max_queued
        self.record_ttl_s = record_ttl_s
        self.max_records = max_records
        #: Rollouts by idempotency key: live entries, then finished records for the TTL.
        self.by_key: dict[str, RolloutEntry | FinishedRecord] = {}
        self._records: collections.deque[FinishedRecord] = collections.deque()  # oldest first
        self._tool_sets: weakref.WeakValueDictionary[bytes, _Tools] = weakref.WeakValueDictionary()
        self.by_id: dict[str, RolloutEntry] = {}  # rollouts not yet done, by rollout_id
        #: Finished records by rollout_id, for status requests, of those whose idempotency key is
        #: not their id (the others are found in ``by_key``: no second entry per record).
        self.finished_ids: dict[str, FinishedRecord] = {}
        self.completed_total = 0
        self.draining = False
        self._drained: anyio.Event | None = None
        self._counts = dict.fromkeys(Phase, 0)
        #: The init bodies of the queued rollouts, summed (``max_queued_bytes``).
        self.queued_bytes = 0
        #: Told of every phase move (the polling wire wakes the polls waiting on the rollout).
        self.on_move: Callable[[RolloutEntry], None] | None = None

    # -- idempotency ----------------------------------------------------------------------------

    def lookup(self, request: RolloutRequest) -> RolloutEntry | FinishedRecord | Conflict | None:
        """The entry or record a duplicate should reuse, a conflict, or None for a new one."""
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

    def reserve(self, request: RolloutRequest, body_fingerprint: int = 0) -> RolloutEntry:
        """Register a new rollout as pending (call right after a ``lookup`` returned None)."""
        entry = RolloutEntry(request=request, key=request.dedup_key, fingerprint=body_fingerprint)
        self._counts[Phase.PENDING] += 1
        self.by_key[entry.key] = entry
        self.by_id[entry.rollout_id] = entry
        return entry

    def release(self, entry: RolloutEntry, status: int, body: bytes) -> None:
        """Refuse a pending rollout: waiting duplicates get the same answer, retries start anew."""
        entry.answered(status, body)
        self._counts[entry.phase] -= 1  # a refused init is counted nowhere
        self._forget(entry)

    # -- admission ------------------------------------------------------------------------------

    def has_capacity(self) -> bool:
        """Whether one more rollout may be accepted (a free slot, or room in the queue).

        Accepted rollouts count as queued until their task takes a slot, so a burst of inits
        that arrives before any task has started is still bounded by slots + queue.
        """
        return self.active + self.queued < self.max_concurrent + self.max_queued

    def accept(self, entry: RolloutEntry, tools_json: bytes) -> None:
        """Mark a pending rollout accepted and queued; duplicates get its 202 from now on."""
        self._move(entry, Phase.QUEUED)
        entry.accepted_at = time.perf_counter()
        tools = self._tool_sets.get(tools_json)
        if tools is None:
            tools = self._tool_sets[tools_json] = _Tools(tools_json)
        entry.tools = tools
        entry.answered(202)

    def finish(self, entry: RolloutEntry) -> None:
        """The callback was handled: free the rollout id, keep a compact record for the TTL.

        The record keeps what a duplicate init needs (id, fingerprint, outcome, and the tools
        JSON, shared with every record that has the same tools), not the request or the
        conversation; past ``max_records`` the oldest records go first.
        """
        self._move(entry, Phase.DONE)
        if self.by_id.get(entry.rollout_id) is entry:
            del self.by_id[entry.rollout_id]
        if self.by_key.get(entry.key) is entry:
            if entry.tools is None:  # never accepted: nothing for a duplicate to reuse
                del self.by_key[entry.key]
            else:
                record = FinishedRecord(entry, entry.tools, time.perf_counter())
                self.by_key[entry.key] = record
                if entry.key != entry.rollout_id:
                    self.finished_ids[entry.rollout_id] = record
                else:
                    self.finished_ids.pop(entry.rollout_id, None)
                self._records.append(record)
                while len(self._records) > self.max_records:
                    self._drop(self._records.popleft())
        self.completed_total += 1
        entry.done()

    def finished(self, rollout_id: str) -> FinishedRecord | None:
        """The record of the last finished rollout with this id, while it is kept."""
        record = self.finished_ids.get(rollout_id)
        if record is None:
            found = self.by_key.get(rollout_id)
            if isinstance(found, FinishedRecord) and found.rollout_id == rollout_id:
                record = found
        if record is None or self._stale(record, time.perf_counter()):
            return None
        return record

    def start(self, entry: RolloutEntry) -> None:
        """The rollout got a concurrency slot; its agent starts now."""
        self._move(entry, Phase.RUNNING)

    def grading(self, entry: RolloutEntry) -> None:
        """The agent is done; its ``grade()`` runs now."""
        self._move(entry, Phase.GRADING)

    def delivering(self, entry: RolloutEntry) -> None:
        """The agent is done; the completion callback is being sent."""
        self._move(entry, Phase.DELIVERING)

    def _move(self, entry: RolloutEntry, phase: Phase) -> None:
        self._counts[entry.phase] -= 1
        self._counts[phase] += 1
        if entry.phase is Phase.QUEUED:
            self.queued_bytes -= entry.size
        if phase is Phase.QUEUED:
            self.queued_bytes += entry.size
        entry.phase = phase
        if self.on_move is not None:
            self.on_move(entry)

    # -- counts, TTL, drain ---------------------------------------------------------------------

    @property
    def active(self) -> int:
        """Rollouts whose agent (or grade) is running or whose callback is being sent."""
        counts = self._counts
        return counts[Phase.RUNNING] + counts[Phase.GRADING] + counts[Phase.DELIVERING]

    @property
    def queued(self) -> int:
        """Accepted rollouts waiting for a concurrency slot."""
        return self._counts[Phase.QUEUED]

    @property
    def records(self) -> int:
        """Finished records held for the TTL."""
        return len(self._records)

    def unfinished(self) -> list[RolloutEntry]:
        """Accepted rollouts that have not sent their callback yet."""
        return [e for e in self.by_id.values() if e.phase is not Phase.PENDING]

    def expire(self) -> int:
        """Drop finished records older than the TTL; returns how many were dropped."""
        return self._expire(time.perf_counter())

    def _expire(self, now: float) -> int:
        dropped = 0
        while self._records and self._stale(self._records[0], now):
            self._drop(self._records.popleft())
            dropped += 1
        return dropped

    def _drop(self, record: FinishedRecord) -> None:
        if self.by_key.get(record.key) is record:
            del self.by_key[record.key]
        if self.finished_ids.get(record.rollout_id) is record:
            del self.finished_ids[record.rollout_id]

    def _stale(self, entry: RolloutEntry | FinishedRecord, now: float) -> bool:
        return isinstance(entry, FinishedRecord) and now - entry.done_at > self.record_ttl_s

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
