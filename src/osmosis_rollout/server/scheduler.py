"""The scheduler: admission, concurrency slots, and each rollout's run-then-deliver, once.

``admit`` takes a rollout a wire adapter parsed, with its ``DeliveryTarget``: it deduplicates
(here, then across replicas), runs ``get_tools``, takes a place in the shared admission count,
and starts the rollout; the ``Answer`` it returns is the wire's to send. ``_run`` waits for a
slot (a trainer's cancel ends the wait), runs the agent and its ``grade``, has the target
settle what is sent and the terminal status (known before any callback), and hands the result
to ``Delivery`` exactly once; one stopped before it ran still reaches the outbox. The rules of
those phases are here too (one concept: a rollout's life in this server): ``claim_init`` (the
first init of a key across replicas decides it), the agent's deadline, the result of a rollout
cancelled before it ran, and the grade.

A v2 rollout's ``agent_timeout_sec`` counts from acceptance, queue time included, as the
controller's own deadline does (docs/protocol-v2.md, U13); the server's ``--rollout-timeout``
counts from the agent's start, as in v1; the earlier of the two applies.

Spawning: on asyncio each rollout is a plain task with its own cancel scope, cancelled at
shutdown as the task group would (``stop``). It is the only path on asyncio because it is
cheaper: ``benchmarks/bench_concurrency.py --sizes 3000`` measured 22.1 KB per in-flight
rollout with it against 24.5 KB with anyio task-group tasks (+11%: a handle, an event and a
wrapper coroutine each). Other anyio backends (no such loop) use the lifespan's task group.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import anyio
import anyio.abc

from .. import telemetry
from ..agent import ChatBackend, RolloutAgentLoop
from ..config import ServerSettings
from ..grading import Grade, has_grade, run_grade
from ..protocol import (
    OpenAIFunctionToolSchema,
    RolloutRequest,
    RolloutResponse,
    RolloutStatus,
)
from ..redaction import loggable, scrub
from ..rollout import run_rollout
from ..tools.tool_set import resolve_tool_set
from .delivery import Delivery, log_exception
from .registry import (
    AcceptedBody,
    Conflict,
    RolloutEntry,
    RolloutRegistry,
)
from .state import (
    BODY_CHANGED,
    ClaimOutcome,
    LeasedRollout,
    StateBackend,
    StateUnavailable,
    fingerprint,
)
from .status import publish_status
from .trajectories import TrajectorySaver, TurnLog
from .types import Answer, DeliveryTarget, Terminal, refusal

if TYPE_CHECKING:
    from ..client import TrainGateClient
    from ..tracing import Tracer
    from .metrics import ServerMetrics

__all__ = ["Scheduler", "claim_init"]

logger = logging.getLogger("osmosis_rollout.server")

#: How long a duplicate init waits for another replica to decide the first one, beyond the
#: get_tools timeout.
_PEER_DECISION_MARGIN_S = 5.0
#: The context rollout tasks' done-callbacks run in (they read no context variable).
_CALLBACK_CONTEXT = contextvars.Context()


class Scheduler:
    """Admits rollouts and runs each one to its single delivery; one per server."""

    def __init__(
        self,
        agent: RolloutAgentLoop,
        settings: ServerSettings,
        registry: RolloutRegistry,
        state: StateBackend,
        delivery: Delivery,
        *,
        replica: str,
        tracer: Tracer | None,
        metrics: ServerMetrics | None,
        client: TrainGateClient | None = None,
        trajectories: TrajectorySaver | None = None,
    ) -> None:
        self.agent = agent
        self.settings = settings
        self.registry = registry
        self.state = state
        self.delivery = delivery
        self.replica = replica
        self.tracer = tracer
        self.metrics = metrics
        #: Writes each settled rollout's ATIF trajectory (an artifact root only).
        self.trajectories = trajectories
        #: The pooled client: the one given, else the lifespan's while it runs.
        self.client = client
        self._admitting = 0  # inits between the admission check and registry.accept
        self._admitting_bytes = 0  # their queued init bodies, summed
        self._counted: set[str] = set()  # keys holding a place in the shared queue
        #: When each lease held here was last extended (monotonic, taken before the call): a
        #: lease extended less than half a TTL ago cannot have lapsed, so no check is needed.
        self.leased_at: dict[str, float] = {}
        # ``lease_ttl_s`` is the promise: a dead replica's rollouts get their ERROR within it.
        # So a lease runs for 70% of it (renewed every fifth), and sweeps come every tenth (at
        # most a second apart): death -> lapse -> sweep takes at most about 0.7 + 0.125 of it.
        self.lease_s = 0.7 * settings.lease_ttl_s
        self._slots = anyio.Semaphore(settings.max_concurrent)
        self.tasks: anyio.abc.TaskGroup | None = None  # the lifespan's, while it runs
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Rollout tasks on the asyncio loop, each with the cancel scope that stands in for the
        #: task group's.
        self._rollouts: dict[asyncio.Task[None], anyio.CancelScope] = {}
        self._on_rollout_end = self._rollout_ended

    # -- the lifespan's side --------------------------------------------------------------------

    def open(self, tasks: anyio.abc.TaskGroup, loop: asyncio.AbstractEventLoop | None) -> None:
        """Start admitting: rollouts run as plain tasks on ``loop``, or in ``tasks``."""
        self.tasks, self._loop = tasks, loop

    def close(self) -> None:
        """Admit no more (the lifespan is over)."""
        self.tasks, self._loop = None, None

    async def stop(self) -> None:
        """After the drain, what the task group's exit does: cancel the rollouts still running
        (their shielded outbox writes still finish) and wait for every one to end."""
        while self._rollouts:
            for scope in self._rollouts.values():
                scope.cancel()
            await asyncio.wait(list(self._rollouts))

    def unavailable(self) -> Answer | None:
        """The 503 to answer when no rollout can start now, or None."""
        if self.registry.draining:
            detail = "server is shutting down; retry on another server"
        elif self.tasks is None:
            detail = (
                "server is not running: its lifespan has not started (when mounting the app, "
                "run its lifespan too, or use osmosis_rollout.server.serve)"
            )
        else:
            full = self.delivery.guard.refusal()  # results not lost: no new work first
            if full is None:
                return None
            detail = full
        return refusal(503, detail, retry_after=True)

    # -- admission ------------------------------------------------------------------------------

    async def admit(
        self,
        rollout: RolloutRequest,
        target: DeliveryTarget,
        accepted: AcceptedBody,
        *,
        size: int = 0,
    ) -> Answer:
        """Deduplicate, get tools, admit and start ``rollout``; see protocol.md section 1.

        ``target`` is where its traffic goes; ``accepted`` builds the 202 body (the wire's);
        ``size`` is the init body's, counted against ``max_queued_bytes`` while it waits."""
        digest = fingerprint(rollout)
        found = self.registry.lookup(rollout)  # this process first: no round trip
        if isinstance(found, Conflict):
            return refusal(409, found.detail)
        if found is not None:
            if found.fingerprint != digest:
                return refusal(409, BODY_CHANGED)
            return await found.init_answer(accepted)
        if self.state.shared:
            try:
                limit = self.settings.get_tools_timeout_s + _PEER_DECISION_MARGIN_S
                earlier = await claim_init(
                    self.state, self.registry, rollout, digest, limit, accepted
                )
            except StateUnavailable as exc:
                return self._state_down(rollout, exc)
            if earlier is not None:
                return earlier
        entry = self.registry.reserve(rollout, digest)
        entry.target = target
        entry.size = size
        try:
            tool_set = await resolve_tool_set(
                self.agent, rollout, timeout_s=self.settings.get_tools_timeout_s
            )
        except TimeoutError:
            detail = f"get_tools did not return within {self.settings.get_tools_timeout_s:g} s"
            logger.error("rollout %s refused: %s", loggable(rollout.rollout_id), detail)
            return await self._refuse(entry, refusal(500, detail))
        except Exception as exc:
            detail = scrub(f"get_tools failed: {type(exc).__name__}: {exc}", rollout.api_key_value)
            logger.error("rollout %s refused: %s", loggable(rollout.rollout_id), detail)
            return await self._refuse(entry, refusal(500, detail))
        except BaseException:  # the request was cancelled: free the key so retries can start
            with anyio.CancelScope(shield=True):
                await self._refuse(entry, refusal(503, "init interrupted; retry"))
            raise
        # Re-checked: draining may have begun while get_tools ran.
        unavailable = self.unavailable()
        if unavailable is not None:
            return await self._refuse(entry, unavailable)
        tools_json = tool_set.json
        payload = accepted(rollout.rollout_id, tools_json)
        # A free slot here needs no place in the shared queue (counted before any await, so a
        # burst of inits cannot all see the same free slot).
        registry = self.registry
        queue = registry.active + registry.queued + self._admitting >= self.settings.max_concurrent
        waiting = registry.queued_bytes + self._admitting_bytes
        if queue and waiting + size > self.settings.max_queued_bytes:
            busy = refusal(
                503,
                "too many bytes of rollouts queued; retry later",
                retry_after=True,
                reason="busy",
            )
            return await self._refuse(entry, busy)
        self._admitting += 1
        queued_size = size if queue else 0
        self._admitting_bytes += queued_size
        leased_at = time.monotonic()
        try:
            admitted = await self.state.accept(
                LeasedRollout.of(rollout, target),
                digest=str(digest),
                replica=self.replica,
                status=202,
                body=payload,
                lease_ttl_s=self.lease_s,
                queue=queue,
                max_queued=self.settings.max_queued,
            )
        except StateUnavailable as exc:
            return await self._refuse(entry, self._state_down(rollout, exc))
        finally:
            self._admitting -= 1
            self._admitting_bytes -= queued_size
        if not admitted:
            busy = refusal(
                503, "too many rollouts queued; retry later", retry_after=True, reason="busy"
            )
            return await self._refuse(entry, busy)
        registry.accept(entry, tools_json)
        if self.state.shared:
            self.leased_at[entry.key] = leased_at
            await self._publish(entry, "queued")
        if queue:
            self._counted.add(entry.key)
        self._start(entry, tool_set.tools)
        return Answer(202, payload)

    def _state_down(self, rollout: RolloutRequest, exc: StateUnavailable) -> Answer:
        logger.error("rollout %s refused: %s", loggable(rollout.rollout_id), exc)
        return refusal(503, str(exc), retry_after=True)

    async def _refuse(self, entry: RolloutEntry, answer: Answer) -> Answer:
        """Answer ``answer`` and forget the init here and in the shared state."""
        self.registry.release(entry, answer.status, answer.body)
        try:
            await self.state.release_init(entry.key, entry.rollout_id)
        except StateUnavailable as exc:  # the claim lapses by itself after its pending TTL
            logger.warning("rollout %s: claim not released: %s", loggable(entry.rollout_id), exc)
        return answer

    # -- one rollout's background life ----------------------------------------------------------

    def _start(self, entry: RolloutEntry, tools: Sequence[OpenAIFunctionToolSchema]) -> None:
        """Start the rollout's task (see the module docstring for why a plain asyncio task)."""
        scope = anyio.CancelScope()
        if self._loop is None:  # another backend: the task group's task
            assert self.tasks is not None  # unavailable() checked it; the lifespan outlives us
            self.tasks.start_soon(self._run, entry, tools, scope)
            return
        task = self._loop.create_task(self._run(entry, tools, scope))
        self._rollouts[task] = scope
        # Bound once, and run in one shared empty context: by default each callback would hold
        # its own bound method and a copy of the init's context for the rollout's whole life.
        task.add_done_callback(self._on_rollout_end, context=_CALLBACK_CONTEXT)

    def _rollout_ended(self, task: asyncio.Task[None]) -> None:
        self._rollouts.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            # _run ends every rollout itself; this is a toolkit bug, not to pass silently.
            logger.error("a rollout task failed", exc_info=task.exception())

    async def _run(
        self,
        entry: RolloutEntry,
        tools: Sequence[OpenAIFunctionToolSchema],
        scope: anyio.CancelScope,
    ) -> None:
        """Run the agent when a slot frees up, grade it, then deliver exactly once; all of it in
        ``scope`` (cancelled at shutdown) and the rollout's OpenTelemetry span, so the callback
        joins its trace. A cancel while queued ends it at once, without a slot."""
        request = entry.request
        target = entry.target
        assert self.client is not None  # the lifespan opened it
        assert target is not None  # admit set it
        run = RunState()
        with scope:
            try:
                # Opened inside the try: at the file limit even opening a span can fail (the
                # first one imports OpenTelemetry), and the rollout must still end once.
                with telemetry.rollout_span(entry.rollout_id, self.agent.name):
                    await self._live(entry, tools, run)
            except Exception:  # a toolkit bug, or the process out of files or sockets
                log_exception(request.rollout_id, request.api_key_value, "internal error")
                if not run.handed:
                    await self.delivery.deliver(
                        self.client, entry, settled_result(entry, run, "internal error")
                    )
            except BaseException:
                if not run.handed:  # stopped before delivery: the result is still kept
                    why = "server stopped before the rollout was delivered"
                    if run.response is None:
                        why = "server stopped before the rollout ran"
                        run.response = cancelled_response(request, "server stopped before it ran")
                        if self.metrics is not None:
                            self.metrics.rollout_ended(
                                run.response.status.value, run.response.finish_reason
                            )
                    await self.delivery.to_outbox(target, settled_result(entry, run, why), why)
                raise
            finally:
                self._counted.discard(entry.key)
                self.leased_at.pop(entry.key, None)
                self.registry.finish(entry)
                if self.state.shared:  # a round trip: shielded from shutdown, and bounded
                    with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                        await self._release_lease(entry)
                else:  # this process's memory: nothing to wait for, nothing to interrupt
                    await self._release_lease(entry)

    async def _live(
        self, entry: RolloutEntry, tools: Sequence[OpenAIFunctionToolSchema], run: RunState
    ) -> None:
        """The rollout's life: a slot, the agent, the grade, then one delivery (``run`` says how
        far it got, for ``_run``'s error paths)."""
        request = entry.request
        target = entry.target
        assert self.client is not None
        assert target is not None
        if await self._take_slot(entry):
            try:
                run.response = await self._run_agent(entry, tools, run)
            finally:
                self._slots.release()
        else:  # cancelled while it waited for a slot: its queue place is given back too
            if entry.key in self._counted:
                self._counted.discard(entry.key)
                await self._unqueue(entry)
            run.response = cancelled_response(request, entry.control.reason, "before it ran")
            if self.metrics is not None:
                self.metrics.rollout_ended(run.response.status.value, run.response.finish_reason)
        run.settled, entry.terminal = target.settle(
            run.response, await self._grade(entry, run.response), entry.control.category
        )
        if self.trajectories is not None:  # queued before delivery: usually on disk first
            self.trajectories.save(request, run.settled, run.turns, tools)
        self.registry.delivering(entry)
        await self._publish(entry, "", entry.terminal)
        await self.delivery.save_lease(entry)  # a peer ending it sends these bodies
        run.handed = True  # from here on delivery (or the peer that ended it) owns the result
        if await self._still_ours(entry):
            # A drain that gives up on this delivery cancels this scope: the result goes to
            # the outbox at once, not when the process exits.
            with anyio.CancelScope() as entry.delivery:
                await self.delivery.deliver(self.client, entry, run.settled)

    async def _take_slot(self, entry: RolloutEntry) -> bool:
        """Wait for a concurrency slot; False (no slot held) if the trainer cancels it first (a
        drain does not: what it leaves queued is stopped and kept in the outbox)."""
        control = entry.control
        with anyio.CancelScope() as waiting:
            entry.waiting = waiting
            if control.cancelled:
                waiting.cancel()
            await self._slots.acquire()
        entry.waiting = None
        if waiting.cancelled_caught:
            return False
        if control.cancelled:  # the slot came with the cancel: give it back
            self._slots.release()
            return False
        return True

    async def _run_agent(
        self, entry: RolloutEntry, tools: Sequence[OpenAIFunctionToolSchema], run: RunState
    ) -> RolloutResponse:
        """The agent phase, with a slot held: ``run_rollout`` under the rollout's deadline
        (its turns kept in ``run.turns`` when trajectories are written)."""
        request = entry.request
        assert entry.target is not None
        assert self.client is not None
        if entry.key in self._counted:
            self._counted.discard(entry.key)
            await self._unqueue(entry)
        self.registry.start(entry)
        if self.metrics is not None:
            self.metrics.started.inc()
        await self._publish(entry, "running")
        queued_s = time.perf_counter() - entry.accepted_at
        timeout_s = self.settings.rollout_timeout_s
        deadline_s, agent_limit = agent_deadline(request, timeout_s, queued_s)
        channel: ChatBackend = entry.target.channel(self.client)
        if self.trajectories is not None:
            channel = run.turns = TurnLog(channel)
        try:
            response = await run_rollout(
                self.agent,
                request,
                channel,
                tools=tools,
                deadline_s=deadline_s,
                tracer=self.tracer,
                control=entry.control,
                observer=self.metrics,
            )
        except Exception as exc:  # a toolkit bug must still end in one callback
            log_exception(request.rollout_id, request.api_key_value, "internal error")
            response = ended_response(request, "error", f"internal error: {type(exc).__name__}")
        name_agent_timeout(response, agent_limit, queued_s, timeout_s)
        if response.metrics is not None:
            response.metrics = response.metrics.model_copy(
                update={"queue_latency_ms": round(queued_s * 1000, 3)}
            )
        if self.metrics is not None:
            self.metrics.rollout_ended(response.status.value, response.finish_reason)
        return response

    async def _grade(self, entry: RolloutEntry, response: RolloutResponse) -> Grade | None:
        """The grader phase, if the agent has one and ``run()`` completed (``grade``)."""
        if not wants_grade(self.agent, response) or not getattr(entry.request, "grade", True):
            return None  # no grade() hook, run() failed, or the controller grades (polling)
        self.registry.grading(entry)
        await self._publish(entry, "grading")
        return await grade(self.agent, entry, response, self.settings.rollout_timeout_s)

    async def _publish(
        self, entry: RolloutEntry, status: str, terminal: Terminal | None = None
    ) -> None:
        """Tell the other replicas (a shared state only) where the rollout is."""
        if self.state.shared and entry.target is not None:
            await publish_status(
                self.state,
                entry.rollout_id,
                entry.target.protocol,
                self.replica,
                status,
                terminal,
                self.settings.record_ttl_s,
            )

    async def _unqueue(self, entry: RolloutEntry) -> None:
        try:
            await self.state.unqueue(self.replica)
        except StateUnavailable as exc:  # the place is freed when this replica's heartbeat lapses
            logger.warning("rollout %s: queue place not freed: %s", loggable(entry.rollout_id), exc)

    async def _still_ours(self, entry: RolloutEntry) -> bool:
        """Renew the lease before the callback; False if a peer already ended the rollout."""
        leased_at = self.leased_at.get(entry.key)
        if leased_at is None or time.monotonic() - leased_at < self.lease_s / 2:
            return True  # memory, or a lease too fresh to have lapsed: no round trip
        try:
            held = await self.state.hold(entry.key, self.lease_s)
        except StateUnavailable as exc:
            # Nobody can take the rollout while the store is down: deliver.
            logger.warning("rollout %s: lease not checked: %s", loggable(entry.rollout_id), exc)
            return True
        if not held:
            logger.error(
                "rollout %s: its lease lapsed (this replica stalled for over %g s) and another "
                "replica already sent its ERROR callback; this result is not sent",
                loggable(entry.rollout_id),
                self.lease_s,
            )
        return held

    async def _release_lease(self, entry: RolloutEntry) -> None:
        try:
            await self.state.finish(entry.key, entry.rollout_id, self.settings.record_ttl_s)
        except StateUnavailable as exc:
            logger.warning("rollout %s: lease not released: %s", loggable(entry.rollout_id), exc)


# -- admission across replicas ----------------------------------------------------------------


async def claim_init(
    state: StateBackend,
    registry: RolloutRegistry,
    rollout: RolloutRequest,
    digest: int,
    limit: float,
    accepted: AcceptedBody,
) -> Answer | None:
    """Claim the init in the shared state: None when it is ours to decide (first of its key
    anywhere); otherwise the answer: the first init's 202, a 409, or a 503 when the replica
    deciding it takes longer than ``limit`` (seconds)."""
    deadline = anyio.current_time() + limit
    pause = 0.01
    while True:
        claim = await state.claim_init(
            rollout.dedup_key, rollout.rollout_id, str(digest), pending_ttl_s=limit
        )
        if claim.outcome is ClaimOutcome.CLAIMED:
            return None
        if claim.outcome is ClaimOutcome.CONFLICT:
            return refusal(409, claim.detail)
        if claim.outcome is ClaimOutcome.ANSWERED:
            return Answer(claim.status, claim.body)
        local = registry.lookup(rollout)
        if local is not None and not isinstance(local, Conflict):
            # Decided in this process: wait for it without polling the store.
            answer = await local.init_answer(accepted)
            if answer.status != 202:  # refused: duplicates waiting meanwhile get the same answer
                return answer
            continue
        if anyio.current_time() > deadline:
            detail = "an init with this key is still being decided by another replica; retry"
            return refusal(503, detail, retry_after=True)
        await anyio.sleep(pause)
        pause = min(0.25, pause * 2)


# -- the rules of a rollout's phases -----------------------------------------------------------


def agent_deadline(
    request: RolloutRequest, rollout_timeout_s: float, queued_s: float
) -> tuple[float, float | None]:
    """The agent's deadline (seconds from now) and the v2 limit behind it, if any."""
    # From the instance's fields (pydantic keeps them in __dict__): getattr on a v1 request,
    # which has no such field, would raise and catch inside pydantic on every rollout.
    limit: float | None = request.__dict__.get("agent_timeout_sec")
    if limit is None:
        return rollout_timeout_s, None
    return min(rollout_timeout_s, max(0.0, limit - queued_s)), limit


def name_agent_timeout(
    response: RolloutResponse, limit: float | None, queued_s: float, rollout_timeout_s: float
) -> None:
    """When v2's ``agent_timeout_sec`` (not the server's timeout) cut the agent, say so."""
    if limit is None or response.finish_reason != "timeout":
        return
    if limit - queued_s >= rollout_timeout_s:
        return
    queued = f" ({queued_s:.1f} s of it spent queued)" if queued_s >= 0.1 else ""
    response.error_message = f"rollout exceeded its agent_timeout_sec of {limit:g} s{queued}"


def cancelled_response(request: RolloutRequest, reason: str, when: str = "") -> RolloutResponse:
    """The ``ERROR``/``cancelled`` result of a rollout stopped before its agent ran."""
    return RolloutResponse(
        rollout_id=request.rollout_id,
        status=RolloutStatus.ERROR,
        final_messages=list(request.messages),
        finish_reason="cancelled",
        error_message=f"rollout cancelled ({reason}){' ' + when if when else ''}",
    )


def wants_grade(agent: RolloutAgentLoop, response: RolloutResponse) -> bool:
    """Whether the grader phase runs: the agent has ``grade`` and ``run()`` completed."""
    return has_grade(agent) and response.status is RolloutStatus.COMPLETED


async def grade(
    agent: RolloutAgentLoop,
    entry: RolloutEntry,
    response: RolloutResponse,
    rollout_timeout_s: float,
) -> Grade | None:
    """Run the grade under v2's ``grader_timeout_sec``, else the server's rollout timeout."""
    request = entry.request
    limit: float | None = getattr(request, "grader_timeout_sec", None)
    return await run_grade(
        agent,
        entry.control.context,
        response,
        timeout_s=rollout_timeout_s if limit is None else limit,
        control=entry.control,
        secret=request.api_key_value,
    )


class RunState:
    """How far one rollout got, for the scheduler's error paths: what the agent made, the
    result settled for delivery, and whether delivery took it over; ``turns``: the agent's
    turns, kept for its ATIF trajectory (``server/trajectories.TurnLog``) when one is written."""

    __slots__ = ("handed", "response", "settled", "turns")

    def __init__(self) -> None:
        self.response: RolloutResponse | None = None
        self.settled: RolloutResponse | None = None
        self.handed = False
        self.turns: TurnLog | None = None


def settled_result(entry: RolloutEntry, run: RunState, why: str) -> RolloutResponse:
    """The result an error path delivers: the settled one, else what the agent made (or an
    internal-error result saying ``why``) settled without a grade."""
    if run.settled is not None:
        return run.settled
    assert entry.target is not None
    response = run.response or ended_response(entry.request, "error", why)
    run.settled, entry.terminal = entry.target.settle(response, None)
    return run.settled


def ended_response(request: RolloutRequest, reason: str, message: str) -> RolloutResponse:
    """The ERROR result of a rollout that ended without the agent's (a bug, a stop)."""
    return RolloutResponse(
        rollout_id=request.rollout_id,
        status=RolloutStatus.ERROR,
        final_messages=list(request.messages),
        finish_reason=reason,
        error_message=message,
    )
