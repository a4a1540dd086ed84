"""The polling wire's results store: leases, parked result polls and finished results.

A live polling rollout's ``Lease`` is on its target (``polling_target.py``): the token's
SHA-256 digest and a deadline each authenticated poll pushes back. One timer per rollout (a loop
``TimerHandle``, no task) looks at the deadline when it falls due: a lease nobody renewed ends
the rollout at once with ``failure``/``lease_expired`` (what the SDK's controller expects) and
cancels its agent, which frees its slot. Delivery puts the settled result here ("delivered"
means stored); the first result put is the one kept, so every read gives the same answer. A
finished result is kept for the retention time, and once read for a minute at most (a
controller whose answer was lost reads it again; nothing else does).

A result poll is an ``asyncio.Event`` wait under ``asyncio.timeout``: no thread, no task of its
own, about 1 KB beside its connection (``benchmarks/bench_parked_polls.py``); polls of one
rollout share its event (kept while the rollout lives), woken ``STATUS_NEWS_S`` after the
status a poll reports changes (the registry tells: ``moved``), or at once when the result is
stored. At most ``max_parked`` polls wait at once; past that a poll is answered ``503`` with
``Retry-After``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, NamedTuple

from ...redaction import loggable
from ..registry import Phase, RolloutEntry, cancel_entry
from ..state import StateUnavailable
from ..types import Terminal, terminal

if TYPE_CHECKING:
    from ..registry import RolloutRegistry
    from ..state import StateBackend

__all__ = [
    "LEASE_EXPIRED",
    "MAX_PARKED_POLLS",
    "READ_GRACE_S",
    "STATUS_NEWS_S",
    "Lease",
    "PollAnswer",
    "PollingResults",
    "lease_digest",
]

logger = logging.getLogger("osmosis_rollout.server")

#: Result polls waiting at once, at most (the connection limit usually binds first).
MAX_PARKED_POLLS = 10_000
#: How long after a status change the polls waiting on it are answered (what a controller
#: loses by it: knowing a rollout runs 50 ms later).
STATUS_NEWS_S = 0.05
#: How long a result stays readable after its first read (a lost answer is read again).
READ_GRACE_S = 60.0
#: The error message of a rollout whose controller stopped polling.
LEASE_EXPIRED = "polling lease expired"
#: What a poll reports while the rollout is in flight, by phase.
_IN_FLIGHT = {
    Phase.PENDING: "queued",
    Phase.QUEUED: "queued",
    Phase.RUNNING: "running",
    Phase.GRADING: "grading",
    Phase.DELIVERING: "grading",
}
#: What a poll reports in flight.
_STATUSES = frozenset({"queued", "running", "grading"})
#: Phases whose move changes what a poll reports (a stored result wakes polls itself).
_REPORTED = frozenset({Phase.RUNNING, Phase.GRADING})


def lease_digest(token: str) -> bytes:
    """What the server keeps of a lease token (never the token)."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


class PollAnswer(NamedTuple):
    """A result poll's answer: a status code and a JSON body."""

    status: int
    body: bytes


class Lease:
    """One live polling rollout's lease (its target holds it): the token's digest (empty until
    the 202 issues it), its deadline on the loop's clock, and the timer that checks it."""

    __slots__ = ("deadline", "digest", "rollout_id", "timer", "token")

    def __init__(self, rollout_id: str, digest: bytes = b"") -> None:
        self.rollout_id = rollout_id
        self.digest = digest
        self.deadline = 0.0
        self.timer: asyncio.TimerHandle | None = None
        #: The token between its issue and the 202 that carries it (then forgotten).
        self.token: str | None = None


class _Finished:
    """A finished rollout's result while it is kept."""

    __slots__ = ("body", "digest", "expires_at", "handle", "read", "terminal")

    def __init__(self, digest: bytes, body: bytes, end: Terminal, expires_at: float) -> None:
        self.digest = digest
        self.body = body
        self.terminal = end
        self.expires_at = expires_at
        self.read = False
        self.handle: asyncio.TimerHandle | None = None


def _detail(status: int, detail: str) -> PollAnswer:
    return PollAnswer(status, json.dumps({"detail": detail}).encode())


_NOT_FOUND = _detail(404, "unknown rollout_id")
_WRONG_LEASE = _detail(403, "invalid polling lease")
_TOO_MANY = _detail(503, "too many result polls waiting; retry shortly")
_SETTLING = _detail(503, "the rollout is being ended by another replica; retry shortly")
_STATE_DOWN = _detail(503, "the shared state does not answer; retry shortly")
#: How often a poll for another replica's rollout looks at the shared state.
SHARED_POLL_S = 0.25


#: Result bodies are compact JSON, as the finished ones (``pydantic_core.to_json``).
_COMPACT = (",", ":")


def in_flight_body(rollout_id: str, status: str) -> bytes:
    """A poll's answer while the rollout runs: its status, nothing else."""
    return json.dumps(
        {
            "rollout_id": rollout_id,
            "status": status,
            "sample": None,
            "err_message": None,
            "err_category": None,
        },
        separators=_COMPACT,
    ).encode()


def terminal_of_body(body: bytes) -> Terminal:
    """The terminal status a stored result body stands for."""
    data = json.loads(body)
    status = str(data.get("status") or "failure")
    if status == "success":
        return terminal("success", (data.get("sample") or {}).get("reward"))
    return terminal(status, None, data.get("err_message"))


def lease_expired_body(rollout_id: str) -> bytes:
    """The result of a rollout whose lease ran out."""
    return json.dumps(
        {
            "rollout_id": rollout_id,
            "status": "failure",
            "sample": None,
            "err_message": LEASE_EXPIRED,
            "err_category": "lease_expired",
        },
        separators=_COMPACT,
    ).encode()


class PollingResults:
    """One server's polling leases, parked polls and kept results (see the module docstring)."""

    def __init__(
        self,
        *,
        wait_s: float,
        lease_s: float,
        retention_s: float,
        max_parked: int = MAX_PARKED_POLLS,
    ) -> None:
        self.wait_s = wait_s
        self.lease_s = lease_s
        self.retention_s = retention_s
        self.max_parked = max_parked
        self.registry: RolloutRegistry | None = None  # bound by the wire's routes
        #: With replicas: where results and remote renewals are shared (``bind``).
        self.state: StateBackend | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.finished: dict[str, _Finished] = {}
        self._waiters: dict[str, asyncio.Event] = {}
        #: Result polls waiting now.
        self.parked = 0

    def bind(self, registry: RolloutRegistry, state: StateBackend | None = None) -> None:
        """Serve ``registry``'s rollouts (its phase moves wake the polls waiting on them), and
        with replicas share the results and renewals through ``state``."""
        self.registry = registry
        registry.on_move = self.moved
        self.state = state if state is not None and state.shared else None

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` beside the timer that found it due (a timer cannot await)."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- leases ---------------------------------------------------------------------------------

    def issue(self, lease: Lease, token: str) -> None:
        """Start ``lease`` (its 202 carries ``token``)."""
        loop = asyncio.get_running_loop()
        lease.digest = lease_digest(token)
        lease.token = token
        lease.deadline = loop.time() + self.lease_s
        lease.timer = loop.call_at(lease.deadline, self._lease_due, lease)

    def live(self, rollout_id: str) -> tuple[RolloutEntry, Lease] | None:
        """The live polling rollout with this id whose lease was issued, and its lease."""
        entry = self.registry.by_id.get(rollout_id) if self.registry is not None else None
        if entry is None:
            return None
        lease = getattr(entry.target, "lease", None)  # a polling target's
        if not isinstance(lease, Lease) or not lease.digest:
            return None
        return entry, lease

    def _lease_due(self, lease: Lease) -> None:
        lease.timer = None
        found = self.live(lease.rollout_id)
        if found is None or found[1] is not lease or self.stored(lease) is not None:
            return  # refused at admission, or already ended
        entry = found[0]
        loop = asyncio.get_running_loop()
        if loop.time() < lease.deadline:
            lease.timer = loop.call_at(lease.deadline, self._lease_due, lease)
        elif entry.terminal is None:  # a result already settled is stored in a moment
            if self.state is None:
                self.expire(entry, lease)
            else:  # polls reaching other replicas renew it in the shared state
                self._spawn(self._shared_lease_due(entry, lease))

    async def _shared_lease_due(self, entry: RolloutEntry, lease: Lease) -> None:
        assert self.state is not None
        try:
            left = await self.state.poll_lease_left(lease.rollout_id)
        except StateUnavailable:
            left = self.lease_s  # nobody can tell: look again later
        loop = asyncio.get_running_loop()
        lease.deadline = max(lease.deadline, loop.time() + left)
        if left > 0 or loop.time() < lease.deadline:
            lease.timer = loop.call_at(lease.deadline, self._lease_due, lease)
        elif entry.terminal is None and self.stored(lease) is None:
            await self.expire_shared(entry, lease)

    def expire(self, entry: RolloutEntry, lease: Lease) -> None:
        """End a rollout nobody polls: its result is ``lease_expired`` from now on, and its
        agent is cancelled (the scheduler's result for it is then not kept)."""
        end = terminal("failure", None, LEASE_EXPIRED)
        self.put(lease, lease_expired_body(lease.rollout_id), end)
        cancel_entry(entry, LEASE_EXPIRED)

    async def expire_shared(self, entry: RolloutEntry, lease: Lease) -> None:
        """``expire`` with replicas: the result is stored in the shared state first."""
        end = terminal("failure", None, LEASE_EXPIRED)
        await self.keep(lease, lease_expired_body(lease.rollout_id), end)
        cancel_entry(entry, LEASE_EXPIRED)

    # -- results --------------------------------------------------------------------------------

    def put(self, lease: Lease, body: bytes, end: Terminal) -> None:
        """Keep the result of ``lease``'s rollout (the first one put: later ones are dropped)
        and wake the polls waiting for it."""
        rollout_id = lease.rollout_id
        kept = self.finished.get(rollout_id)
        if kept is not None and kept.digest == lease.digest:
            return
        if kept is not None and kept.handle is not None:
            kept.handle.cancel()
        if lease.timer is not None:
            lease.timer.cancel()
            lease.timer = None
        loop = asyncio.get_running_loop()
        done = _Finished(lease.digest, body, end, loop.time() + self.retention_s)
        done.handle = loop.call_at(done.expires_at, self._retention_due, rollout_id, done)
        self.finished[rollout_id] = done
        self._wake(rollout_id)

    async def keep(self, lease: Lease, body: bytes, end: Terminal) -> None:
        """Store a result (what delivery does). With replicas it goes to the shared state
        first, and what is kept here is what the shared state kept (the first result stored
        there: a peer may have ended the rollout already), so no replica ever answers a result
        another could contradict, even if this one dies the moment after."""
        if self.state is not None:
            rollout_id = lease.rollout_id
            try:
                await self.state.poll_put(
                    rollout_id, lease.digest.hex(), body, retention_s=self.retention_s
                )
                won = await self.state.poll_result(rollout_id)
                if won is not None and won[0] == lease.digest.hex() and won[1] != body:
                    body, end = won[1], terminal_of_body(won[1])
            except StateUnavailable as exc:  # this replica still answers it
                logger.warning("rollout %s: result not shared: %s", loggable(rollout_id), exc)
        self.put(lease, body, end)

    def stored(self, lease: Lease) -> Terminal | None:
        """How ``lease``'s rollout ended, if its result is already kept (lease expiry)."""
        kept = self.finished.get(lease.rollout_id)
        return kept.terminal if kept is not None and kept.digest == lease.digest else None

    def _retention_due(self, rollout_id: str, done: _Finished) -> None:
        if self.finished.get(rollout_id) is not done:
            return
        loop = asyncio.get_running_loop()
        if loop.time() < done.expires_at:
            done.handle = loop.call_at(done.expires_at, self._retention_due, rollout_id, done)
            return
        del self.finished[rollout_id]

    def _read(self, done: _Finished) -> bytes:
        if not done.read:
            done.read = True
            loop = asyncio.get_running_loop()
            done.expires_at = min(done.expires_at, loop.time() + READ_GRACE_S)
        return done.body

    # -- polls ----------------------------------------------------------------------------------

    def moved(self, entry: RolloutEntry) -> None:
        """The registry moved ``entry``: wake its polls, ``STATUS_NEWS_S`` later, if what they
        report changed (a result stored meanwhile wakes them at once, with the result: a fast
        rollout is then one poll, not one per status)."""
        if not self._waiters or entry.phase not in _REPORTED:  # no poll waits: v1 and v2 alone
            return
        event = self._waiters.get(entry.rollout_id)
        if event is not None:
            loop = asyncio.get_running_loop()
            loop.call_later(STATUS_NEWS_S, self._wake, entry.rollout_id, event)

    def _wake(self, rollout_id: str, only: asyncio.Event | None = None) -> None:
        event = self._waiters.get(rollout_id)
        if event is not None and (only is None or event is only):
            del self._waiters[rollout_id]
            event.set()

    async def poll(self, rollout_id: str, token: str) -> PollAnswer:
        """``GET /rollout/{id}/result``: the result, or the status after up to ``wait_s``.

        Renews the lease of a live rollout (one whose lease already ran out ends now); 404 for
        an id with no rollout and no kept result, 403 for a token that is not its lease's
        (compared in constant time, by digest)."""
        digest = lease_digest(token)
        done = self.finished.get(rollout_id)
        if done is not None and hmac.compare_digest(done.digest, digest):
            return PollAnswer(200, self._read(done))
        found = self.live(rollout_id)
        if found is None and self.state is not None:
            return await self._poll_shared(rollout_id, digest)
        if found is None:
            return _WRONG_LEASE if done is not None else _NOT_FOUND
        entry, lease = found
        if not hmac.compare_digest(lease.digest, digest):
            return _WRONG_LEASE
        now = asyncio.get_running_loop().time()
        if now >= lease.deadline and entry.terminal is None:
            if self.state is None:
                self.expire(entry, lease)
            else:
                await self.expire_shared(entry, lease)
            done = self.finished.get(rollout_id)
            if done is not None and done.digest == digest:
                return PollAnswer(200, self._read(done))
        lease.deadline = now + self.lease_s
        if self.parked >= self.max_parked:
            return _TOO_MANY
        event = self._waiters.get(rollout_id)
        if event is None:
            event = self._waiters[rollout_id] = asyncio.Event()
        self.parked += 1
        try:
            async with asyncio.timeout(self.wait_s):
                await event.wait()
        except TimeoutError:
            pass
        finally:
            self.parked -= 1
        done = self.finished.get(rollout_id)
        if done is not None and done.digest == digest:
            return PollAnswer(200, self._read(done))
        return PollAnswer(200, in_flight_body(rollout_id, _IN_FLIGHT.get(entry.phase, "grading")))

    async def _poll_shared(self, rollout_id: str, digest: bytes) -> PollAnswer:
        """A poll for a rollout another replica runs or ran: its result and lease are read
        from the shared state, the lease renewed there, and the result looked for every
        ``SHARED_POLL_S`` during the wait."""
        assert self.state is not None
        state = self.state
        try:
            kept = await state.poll_result(rollout_id)
            if kept is not None and hmac.compare_digest(bytes.fromhex(kept[0]), digest):
                return PollAnswer(200, kept[1])
            lease = await state.poll_lease_route(rollout_id)
            route = (lease or {}).get("route") or {}
            if not lease or lease.get("protocol") != "polling" or not route.get("digest"):
                if kept is not None:
                    return _WRONG_LEASE
                shared = await state.rollout_status(rollout_id, "polling")
                # A peer ending a dead replica's rollout: its result is a moment away.
                return _SETTLING if shared is not None else _NOT_FOUND
            if not hmac.compare_digest(bytes.fromhex(str(route["digest"])), digest):
                return _WRONG_LEASE
            await state.poll_renew(rollout_id, self.lease_s)
            if self.parked >= self.max_parked:
                return _TOO_MANY
            self.parked += 1
            try:
                return await self._wait_shared(rollout_id, digest)
            finally:
                self.parked -= 1
        except StateUnavailable:
            return _STATE_DOWN

    async def _wait_shared(self, rollout_id: str, digest: bytes) -> PollAnswer:
        assert self.state is not None
        loop = asyncio.get_running_loop()
        until = loop.time() + self.wait_s
        first = await self.state.rollout_status(rollout_id, "polling")
        status = str((first or {}).get("status") or "queued")
        while (left := until - loop.time()) > 0:
            await asyncio.sleep(min(SHARED_POLL_S, left))
            kept = await self.state.poll_result(rollout_id)
            if kept is not None and hmac.compare_digest(bytes.fromhex(kept[0]), digest):
                return PollAnswer(200, kept[1])
            now = await self.state.rollout_status(rollout_id, "polling")
            seen = str((now or {}).get("status") or status)
            if seen != status and seen in ("queued", "running", "grading"):
                status = seen
                break
        return PollAnswer(
            200, in_flight_body(rollout_id, status if status in _STATUSES else "grading")
        )
