"""``create_app``: the Starlette app that serves one agent over the remote rollout protocol.

The app's lifespan owns the long-lived parts: the pooled ``TrainGateClient``, the task group in
which rollouts run (never request-scoped), the TTL cleanup, the debug tracer. Each accepted
rollout ends in exactly one completion callback; one that cannot be delivered goes to the outbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import json
import logging
import os
import random
import secrets
import socket
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import sniffio
from pydantic import SecretStr, ValidationError
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from .. import telemetry
from ..agent import RolloutAgentLoop
from ..client import RetryPolicy, TrainGateClient
from ..config import ServerSettings
from ..errors import TrainGateError
from ..protocol import (
    DEFAULT_MAX_METADATA_BYTES,
    HealthResponse,
    OpenAIFunctionToolSchema,
    RolloutRequest,
    RolloutResponse,
    RolloutStatus,
    wire,
)
from ..redaction import loggable, scrub, scrub_data
from ..rollout import run_rollout
from ..tools.tool_set import resolve_tool_set
from ..tracing import Tracer
from .auth import key_matches
from .outbox import DEFAULT_OUTBOX_DIR, write_outbox
from .registry import Conflict, RolloutEntry, RolloutRegistry, init_body
from .replay import redeliver
from .state import (
    BODY_CHANGED,
    ClaimOutcome,
    LeasedRollout,
    OutboxEntry,
    StateBackend,
    StateUnavailable,
    fingerprint,
    open_state,
)

if TYPE_CHECKING:
    from .metrics import ServerMetrics

__all__ = ["RolloutServer", "create_app"]

logger = logging.getLogger("osmosis_rollout.server")

_JSON = "application/json"
#: Inits larger than this are refused with 413 before parsing (messages can be long).
_MIN_BODY_LIMIT = 16 * 1024 * 1024
_RETRY_AFTER_S = "5"
#: After the grace period, how long cancelled rollouts get to deliver their callbacks before
#: the rest are stopped and written to the outbox (a dead TrainGate must not hold shutdown).
_DELIVERY_GRACE_S = 15.0
#: How long a duplicate init waits for another replica to decide the first one.
_PEER_DECISION_MARGIN_S = 5.0
#: How long a replica trying an outbox entry hides it from its peers.
_OUTBOX_VISIBILITY_S = 900.0
#: How long a client may take to send an init's body (a slow sender must not hold a connection).
_BODY_TIMEOUT_S = 30.0
#: A 422 lists at most this many validation errors (plus the total count), each message cut to
#: _MAX_ERROR_CHARS and the whole list to _MAX_ERRORS_BYTES: small whatever the input.
_MAX_ERRORS = 20
_MAX_ERROR_CHARS = 200
_MAX_ERRORS_BYTES = 4096

#: The context rollout tasks' done-callbacks run in (they read no context variable).
_CALLBACK_CONTEXT = contextvars.Context()

#: A start-up or shutdown hook: an async function without arguments (a sync one works too).
Hook = Callable[[], Awaitable[None] | None]


async def _call_hook(hook: Hook | None, when: str) -> None:
    if hook is None:
        return
    result = hook()
    if inspect.isawaitable(result):
        await result
    logger.debug("%s hook %r done", when, hook)


def create_app(
    agent_loop: RolloutAgentLoop,
    *,
    api_key: str | None = None,
    max_concurrent: int = 100,
    max_queued: int = 10_000,
    rollout_timeout_s: float = 3600.0,
    record_ttl_s: float = 3600.0,
    shutdown_grace_s: float = 30.0,
    debug_dir: str | Path | None = None,
    outbox_dir: str | Path | None = None,
    max_metadata_bytes: int = DEFAULT_MAX_METADATA_BYTES,
    settings: ServerSettings | None = None,
    client: TrainGateClient | None = None,
    on_startup: Hook | None = None,
    on_shutdown: Hook | None = None,
    metrics: bool = True,
    state: str = "memory",
    lease_ttl_s: float = 30.0,
) -> Starlette:
    """Build the rollout server for ``agent_loop``.

    Pass either keyword settings or a resolved ``ServerSettings`` (not both). ``client`` lets
    tests and the mock harness route callbacks in-process; by default the lifespan opens one.
    ``on_startup`` is awaited before the first request is served; ``on_shutdown`` after the
    drain (running rollouts have ended), before the client closes. The ``RolloutServer`` behind
    the app is ``app.state.rollout_server``.
    """
    if settings is None:
        settings = ServerSettings(
            api_key=SecretStr(api_key) if api_key else None,
            max_concurrent=max_concurrent,
            max_queued=max_queued,
            rollout_timeout_s=rollout_timeout_s,
            record_ttl_s=record_ttl_s,
            shutdown_grace_s=shutdown_grace_s,
            debug_dir=Path(debug_dir) if debug_dir is not None else None,
            outbox_dir=Path(outbox_dir) if outbox_dir is not None else None,
            max_metadata_bytes=max_metadata_bytes,
            metrics=metrics,
            state=state,
            lease_ttl_s=lease_ttl_s,
        )
    server = RolloutServer(agent_loop, settings, client=client)
    server.hooks = (on_startup, on_shutdown)
    routes = [
        Route("/v1/rollout/init", server.counted_init, methods=["POST"]),
        Route("/health", server.health, methods=["GET"]),
        Route("/platform/health", server.platform_health, methods=["GET"]),
    ]
    if server.metrics is not None:
        routes.append(Route("/metrics", server.metrics_page, methods=["GET"]))
    app = Starlette(
        routes=routes,
        lifespan=server.lifespan,
    )
    app.state.rollout_server = server
    return app


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(body), status_code=status, media_type=_JSON, headers=headers)


class RolloutServer:
    """The state and handlers behind ``create_app``; one per app."""

    def __init__(
        self,
        agent: RolloutAgentLoop,
        settings: ServerSettings,
        *,
        client: TrainGateClient | None = None,
    ) -> None:
        self.agent = agent
        self.settings = settings
        self.registry = RolloutRegistry(
            max_concurrent=settings.max_concurrent,
            max_queued=settings.max_queued,
            record_ttl_s=settings.record_ttl_s,
        )
        self._server_key = settings.api_key.get_secret_value() if settings.api_key else None
        self._given_client = client
        self.client: TrainGateClient | None = client
        self.tracer = Tracer(settings.debug_dir) if settings.debug_dir else None
        self.outbox_dir = settings.outbox_dir or DEFAULT_OUTBOX_DIR
        self.state: StateBackend = open_state(settings.state, outbox_dir=self.outbox_dir)
        #: This process among the replicas sharing the state (leases and queue places name it).
        self.replica = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self._admitting = 0  # inits between the admission check and registry.accept
        self._counted: set[str] = set()  # keys holding a place in the shared queue
        #: When each lease held here was last extended (monotonic, taken before the call): a
        #: lease extended less than half a TTL ago cannot have lapsed, so no check is needed.
        self._leased_at: dict[str, float] = {}
        # ``lease_ttl_s`` is the promise: a dead replica's rollouts get their ERROR within it.
        # So a lease runs for 70% of it (renewed every fifth), and sweeps come every tenth (at
        # most a second apart): death -> lapse -> sweep takes at most about 0.7 + 0.125 of it.
        self._lease_s = 0.7 * settings.lease_ttl_s
        self._slots = anyio.Semaphore(settings.max_concurrent)
        self._tasks: anyio.abc.TaskGroup | None = None
        #: Rollout tasks started straight on the asyncio loop (see ``_start``), each with the
        #: cancel scope that stands in for the task group's.
        self._rollouts: dict[asyncio.Task[None], anyio.CancelScope] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_rollout_end = self._rollout_ended
        self._body_limit = max(_MIN_BODY_LIMIT, 4 * settings.max_metadata_bytes)
        self.body_timeout_s = _BODY_TIMEOUT_S
        self.delivery_grace_s = _DELIVERY_GRACE_S
        self.hooks: tuple[Hook | None, Hook | None] = (None, None)  # on_startup, on_shutdown
        self.metrics: ServerMetrics | None = None
        if settings.metrics:
            from .metrics import ServerMetrics

            self.metrics = ServerMetrics(
                self.registry,
                client_stats=lambda: self.client.stats if self.client is not None else None,
            )

    # -- lifespan -------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        """Open the client and the rollout task group; on exit drain, then close everything."""
        owns_client = self._given_client is None
        if owns_client:
            self.client = TrainGateClient(
                retry=RetryPolicy(),
                max_connections=max(1000, 2 * self.settings.max_concurrent),
            )
        try:
            async with anyio.create_task_group() as tasks:
                self._tasks = tasks
                if sniffio.current_async_library() == "asyncio":
                    self._loop = asyncio.get_running_loop()
                tasks.start_soon(self._expire_records)
                if self.state.shared:
                    tasks.start_soon(self._renew_leases)
                    tasks.start_soon(self._sweep_orphans)
                    tasks.start_soon(self._redeliver_outbox)
                await _call_hook(self.hooks[0], "startup")
                try:
                    yield
                finally:
                    with anyio.CancelScope(shield=True):
                        try:
                            await self.drain()
                            try:
                                await _call_hook(self.hooks[1], "shutdown")
                            except Exception:
                                logger.exception("the on_shutdown hook raised")
                        finally:  # whatever happened above: no plain rollout task outlives us
                            await self._stop_rollouts()
                    tasks.cancel_scope.cancel()
        finally:
            self._tasks = None
            self._loop = None
            if owns_client and self.client is not None:
                await self.client.aclose()
            if self.tracer is not None:
                self.tracer.close()
            with anyio.CancelScope(shield=True):
                await self.state.close()

    async def drain(self) -> None:
        """Stop accepting; give running rollouts the grace period; cancel the rest."""
        if not self.registry.draining:
            logger.info(
                "draining: %d running, %d queued; grace period %g s",
                self.registry.active,
                self.registry.queued,
                self.settings.shutdown_grace_s,
            )
        await self.registry.drain(self.settings.shutdown_grace_s, self.delivery_grace_s)

    async def _expire_records(self) -> None:
        interval = min(60.0, max(0.05, self.settings.record_ttl_s / 2))
        while True:
            await anyio.sleep(interval)
            self.registry.expire()
            self.state.expire()

    # -- GET /health, GET /platform/health --------------------------------------------------------

    async def _health_body(self) -> HealthResponse:
        registry = self.registry
        reachable = False
        with anyio.move_on_after(2.0):
            reachable = await self.state.ping()
        status = "draining" if registry.draining else "healthy" if reachable else "degraded"
        return HealthResponse(
            status=status,
            agent_loop=self.agent.name,
            active_rollouts=registry.active,
            completed_rollouts=registry.completed_total,
            queued_rollouts=registry.queued,
            state=self.state.name,
            state_reachable=reachable,
        )

    async def health(self, request: Request) -> Response:
        """200 with counts; 503 while draining or while the shared state is unreachable."""
        body = await self._health_body()
        status = 200 if body.status == "healthy" else 503
        return Response(body.model_dump_json(), status_code=status, media_type=_JSON)

    async def platform_health(self, request: Request) -> Response:
        """The ``/health`` body behind the server key; 404 when the server has no key."""
        if self._server_key is None:
            return _json(404, {"detail": "Not Found"})
        if not key_matches(request.headers.get("authorization"), self._server_key):
            return _json(401, {"detail": "Invalid or missing API key"})
        return await self.health(request)

    # -- GET /metrics --------------------------------------------------------------------------

    async def metrics_page(self, request: Request) -> Response:
        """Prometheus text exposition; behind the server key when there is one, like inits."""
        if self._server_key is not None and not key_matches(
            request.headers.get("authorization"), self._server_key
        ):
            return _json(401, {"detail": "Invalid or missing API key"})
        assert self.metrics is not None  # the route exists only with metrics on
        from .metrics import CONTENT_TYPE

        # The outbox lives in the state (files, or a Redis stream): counted at scrape time; if
        # the store does not answer, the gauge keeps its last value.
        with contextlib.suppress(StateUnavailable, TimeoutError, OSError):
            with anyio.fail_after(5):
                self.metrics.outbox_size.set(len(await self.state.outbox_list()))
        return Response(self.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE})

    # -- POST /v1/rollout/init ------------------------------------------------------------------

    async def counted_init(self, request: Request) -> Response:
        """``init``, with every answer other than 202 counted by cause in the metrics."""
        response = await self.init(request)
        if self.metrics is not None and response.status_code != 202:
            from .metrics import refusal_cause

            cause = refusal_cause(
                response.status_code,
                draining=self.registry.draining,
                running=self._tasks is not None,
            )
            self.metrics.rejected.labels(cause=cause).inc()
        return response

    async def init(self, request: Request) -> Response:
        """Auth, validate, deduplicate, get tools, admit, start; see protocol.md section 1."""
        if self._server_key is not None and not key_matches(
            request.headers.get("authorization"), self._server_key
        ):
            return _json(401, {"detail": "Invalid or missing API key"})
        unavailable = self._unavailable()
        if unavailable is not None:
            return unavailable
        body = await self._read_body(request)
        if isinstance(body, Response):
            return body
        try:
            rollout = RolloutRequest.model_validate_json(
                body, context={"max_metadata_bytes": self.settings.max_metadata_bytes}
            )
        except ValidationError as exc:
            return _json(422, _validation_body(exc))

        digest = fingerprint(rollout)
        found = self.registry.lookup(rollout)  # this process first: no round trip
        if isinstance(found, Conflict):
            return _json(409, {"detail": found.detail})
        if found is not None:
            if found.fingerprint != digest:
                return _json(409, {"detail": BODY_CHANGED})
            status, answer = await found.init_answer()
            return Response(answer, status_code=status, media_type=_JSON)
        if self.state.shared:
            try:
                earlier = await self._claim(rollout, digest)
            except StateUnavailable as exc:
                return self._state_down(rollout, exc)
            if earlier is not None:
                return earlier
        entry = self.registry.reserve(rollout, digest)
        try:
            tool_set = await resolve_tool_set(
                self.agent, rollout, timeout_s=self.settings.get_tools_timeout_s
            )
        except TimeoutError:
            detail = f"get_tools did not return within {self.settings.get_tools_timeout_s:g} s"
            logger.error("rollout %s refused: %s", loggable(rollout.rollout_id), detail)
            return await self._refuse(entry, _json(500, {"detail": detail}))
        except Exception as exc:
            detail = scrub(f"get_tools failed: {type(exc).__name__}: {exc}", rollout.api_key_value)
            logger.error("rollout %s refused: %s", loggable(rollout.rollout_id), detail)
            return await self._refuse(entry, _json(500, {"detail": detail}))
        except BaseException:  # the request was cancelled: free the key so retries can start
            with anyio.CancelScope(shield=True):
                await self._refuse(entry, _json(503, {"detail": "init interrupted; retry"}))
            raise
        # Re-checked: draining may have begun while get_tools ran.
        unavailable = self._unavailable()
        if unavailable is not None:
            return await self._refuse(entry, unavailable)
        tools_json = tool_set.json
        payload = init_body(rollout.rollout_id, tools_json)
        # A free slot here needs no place in the shared queue (counted before any await, so a
        # burst of inits cannot all see the same free slot).
        registry = self.registry
        queue = registry.active + registry.queued + self._admitting >= self.settings.max_concurrent
        self._admitting += 1
        leased_at = time.monotonic()
        try:
            admitted = await self.state.accept(
                LeasedRollout.of(rollout),
                digest=str(digest),
                replica=self.replica,
                status=202,
                body=payload,
                lease_ttl_s=self._lease_s,
                queue=queue,
                max_queued=self.settings.max_queued,
            )
        except StateUnavailable as exc:
            return await self._refuse(entry, self._state_down(rollout, exc))
        finally:
            self._admitting -= 1
        if not admitted:
            busy = {"detail": "too many rollouts queued; retry later"}
            return await self._refuse(entry, _json(503, busy, {"Retry-After": _RETRY_AFTER_S}))
        registry.accept(entry, tools_json)
        if self.state.shared:
            self._leased_at[entry.key] = leased_at
        if queue:
            self._counted.add(entry.key)
        self._start(entry, tool_set.tools)
        return Response(payload, status_code=202, media_type=_JSON)

    async def _claim(self, rollout: RolloutRequest, digest: int) -> Response | None:
        """Claim the init in the shared state: None when it is ours to decide (first of its key
        anywhere); otherwise the answer: the first init's 202, a 409, or a 503 when the replica
        deciding it takes longer than get_tools may."""
        limit = self.settings.get_tools_timeout_s + _PEER_DECISION_MARGIN_S
        deadline = anyio.current_time() + limit
        pause = 0.01
        while True:
            claim = await self.state.claim_init(
                rollout.dedup_key, rollout.rollout_id, str(digest), pending_ttl_s=limit
            )
            if claim.outcome is ClaimOutcome.CLAIMED:
                return None
            if claim.outcome is ClaimOutcome.CONFLICT:
                return _json(409, {"detail": claim.detail})
            if claim.outcome is ClaimOutcome.ANSWERED:
                return Response(claim.body, status_code=claim.status, media_type=_JSON)
            local = self.registry.lookup(rollout)
            if local is not None and not isinstance(local, Conflict):
                # Decided in this process: wait for it without polling the store.
                status, answer = await local.init_answer()
                if status != 202:  # refused: duplicates waiting meanwhile get the same answer
                    return Response(answer, status_code=status, media_type=_JSON)
                continue
            if anyio.current_time() > deadline:
                detail = "an init with this key is still being decided by another replica; retry"
                return _json(503, {"detail": detail}, {"Retry-After": _RETRY_AFTER_S})
            await anyio.sleep(pause)
            pause = min(0.25, pause * 2)

    def _state_down(self, rollout: RolloutRequest, exc: StateUnavailable) -> Response:
        logger.error("rollout %s refused: %s", loggable(rollout.rollout_id), exc)
        return _json(503, {"detail": str(exc)}, {"Retry-After": _RETRY_AFTER_S})

    def _unavailable(self) -> Response | None:
        """The 503 to answer when no rollout can start now, or None."""
        if self.registry.draining:
            detail = "server is shutting down; retry on another server"
        elif self._tasks is None:
            detail = (
                "server is not running: its lifespan has not started (when mounting the app, "
                "run its lifespan too, or use osmosis_rollout.server.serve)"
            )
        else:
            return None
        return _json(503, {"detail": detail}, {"Retry-After": _RETRY_AFTER_S})

    async def _refuse(self, entry: RolloutEntry, response: Response) -> Response:
        """Answer ``response`` and forget the init here and in the shared state."""
        self.registry.release(entry, response.status_code, bytes(response.body))
        try:
            await self.state.release_init(entry.key, entry.rollout_id)
        except StateUnavailable as exc:  # the claim lapses by itself after its pending TTL
            logger.warning("rollout %s: claim not released: %s", loggable(entry.rollout_id), exc)
        return response

    async def _read_body(self, request: Request) -> bytes | Response:
        """The body, or the error to answer: 413 as soon as ``Content-Length`` (or the bytes
        received) exceed the limit, 408 when the body is not in within ``body_timeout_s``."""
        too_large = _json(413, {"detail": f"request body exceeds {self._body_limit} bytes"})
        declared = request.headers.get("content-length")
        if declared is not None:
            if not declared.isdigit():
                return _json(400, {"detail": "Content-Length must be a whole number of bytes"})
            if int(declared) > self._body_limit:
                return too_large
        chunks: list[bytes] = []
        size = 0
        with anyio.move_on_after(self.body_timeout_s):
            try:
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > self._body_limit:
                        return too_large
                    chunks.append(chunk)
            except ClientDisconnect:
                return _json(400, {"detail": "client disconnected"})
            return b"".join(chunks)
        return _json(
            408,
            {"detail": f"request body not received within {self.body_timeout_s:g} s"},
            {"Connection": "close"},
        )

    # -- one rollout's background life ----------------------------------------------------------

    def _start(self, entry: RolloutEntry, tools: Sequence[OpenAIFunctionToolSchema]) -> None:
        """Start the rollout's task. On asyncio it is a plain task with its own cancel scope,
        which the lifespan cancels as the task group would: an anyio task-group task costs
        ~2.7 KB more per rollout in flight (a handle, an event, a wrapper coroutine)."""
        scope = anyio.CancelScope()
        if self._loop is None:  # another backend: the task group's task
            assert self._tasks is not None  # _unavailable() checked it; the lifespan outlives us
            self._tasks.start_soon(self._run, entry, tools, scope)
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

    async def _stop_rollouts(self) -> None:
        """After the drain, what the task group's exit did: cancel the rollouts still running
        (their shielded outbox writes still finish) and wait for every one to end."""
        while self._rollouts:
            for scope in self._rollouts.values():
                scope.cancel()
            await asyncio.wait(list(self._rollouts))

    async def _run(
        self,
        entry: RolloutEntry,
        tools: Sequence[OpenAIFunctionToolSchema],
        scope: anyio.CancelScope,
    ) -> None:
        """Run the agent when a slot frees up, then send exactly one callback; all of it in
        ``scope`` (cancelled at shutdown) and the rollout's OpenTelemetry span, so the callback
        joins its trace."""
        with scope, telemetry.rollout_span(entry.rollout_id, self.agent.name):
            request = entry.request
            assert self.client is not None  # the lifespan opened it
            response: RolloutResponse | None = None
            try:
                async with self._slots:
                    if entry.key in self._counted:
                        self._counted.discard(entry.key)
                        await self._unqueue(entry)
                    self.registry.start(entry)
                    if self.metrics is not None:
                        self.metrics.started.inc()
                    queued_ms = round((time.perf_counter() - entry.accepted_at) * 1000, 3)
                    try:
                        response = await run_rollout(
                            self.agent,
                            request,
                            self.client.channel(request),
                            tools=tools,
                            deadline_s=self.settings.rollout_timeout_s,
                            tracer=self.tracer,
                            control=entry.control,
                            observer=self.metrics,
                        )
                    except Exception as exc:  # a toolkit bug must still end in one callback
                        _log_exception(request, "internal error")
                        response = RolloutResponse(
                            rollout_id=request.rollout_id,
                            status=RolloutStatus.ERROR,
                            final_messages=list(request.messages),
                            finish_reason="error",
                            error_message=f"internal error: {type(exc).__name__}",
                        )
                if response.metrics is not None:
                    response.metrics = response.metrics.model_copy(
                        update={"queue_latency_ms": queued_ms}
                    )
                if self.metrics is not None:
                    self.metrics.rollout_ended(response.status.value, response.finish_reason)
                self.registry.delivering(entry)
                if await self._still_ours(entry):
                    # A drain that gives up on this delivery cancels this scope: the result goes to
                    # the outbox at once, not when the process exits.
                    with anyio.CancelScope() as entry.delivery:
                        await self._deliver(entry, response)
            except BaseException:
                if response is None:  # stopped before the agent ran: the result is still kept
                    cancelled = RolloutResponse(
                        rollout_id=request.rollout_id,
                        status=RolloutStatus.ERROR,
                        final_messages=list(request.messages),
                        finish_reason="cancelled",
                        error_message="rollout cancelled (server stopped before it ran)",
                    )
                    if self.metrics is not None:
                        self.metrics.rollout_ended(cancelled.status.value, cancelled.finish_reason)
                    await self._to_outbox(
                        request, cancelled, "server stopped before the rollout ran"
                    )
                raise
            finally:
                self._counted.discard(entry.key)
                self._leased_at.pop(entry.key, None)
                self.registry.finish(entry)
                if self.state.shared:  # a round trip: shielded from shutdown, and bounded
                    with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                        await self._release_lease(entry)
                else:  # this process's memory: nothing to wait for, nothing to interrupt
                    await self._release_lease(entry)

    async def _unqueue(self, entry: RolloutEntry) -> None:
        try:
            await self.state.unqueue(self.replica)
        except StateUnavailable as exc:  # the place is freed when this replica's heartbeat lapses
            logger.warning("rollout %s: queue place not freed: %s", loggable(entry.rollout_id), exc)

    async def _still_ours(self, entry: RolloutEntry) -> bool:
        """Renew the lease before the callback; False if a peer already ended the rollout."""
        leased_at = self._leased_at.get(entry.key)
        if leased_at is None or time.monotonic() - leased_at < self._lease_s / 2:
            return True  # memory, or a lease too fresh to have lapsed: no round trip
        try:
            held = await self.state.hold(entry.key, self._lease_s)
        except StateUnavailable as exc:
            # Nobody can take the rollout while the store is down: deliver.
            logger.warning("rollout %s: lease not checked: %s", loggable(entry.rollout_id), exc)
            return True
        if not held:
            logger.error(
                "rollout %s: its lease lapsed (this replica stalled for over %g s) and another "
                "replica already sent its ERROR callback; this result is not sent",
                loggable(entry.rollout_id),
                self._lease_s,
            )
        return held

    async def _release_lease(self, entry: RolloutEntry) -> None:
        try:
            await self.state.finish(entry.key, entry.rollout_id, self.settings.record_ttl_s)
        except StateUnavailable as exc:
            logger.warning("rollout %s: lease not released: %s", loggable(entry.rollout_id), exc)

    async def _deliver(self, entry: RolloutEntry, response: RolloutResponse) -> None:
        assert self.client is not None
        request = entry.request
        entry.outcome = "outbox"  # until TrainGate accepts it
        try:
            await self.client.complete_rollout(
                request.server_url, response, api_key=request.api_key_value
            )
            entry.outcome = response.status.value
            if self.metrics is not None:
                self.metrics.callbacks.labels(outcome="delivered").inc()
        except TrainGateError as exc:
            await self._to_outbox(request, response, str(exc))
        except Exception as exc:  # never let one delivery take the task group down
            _log_exception(request, "callback could not be sent")
            await self._to_outbox(request, response, f"callback not sent: {type(exc).__name__}")
        except BaseException as exc:  # cancelled mid-delivery (drain gave up, or a hard stop)
            reason = "shutdown: TrainGate did not accept it in time"
            error = f"delivery interrupted ({reason}): {type(exc).__name__}"
            await self._to_outbox(request, response, error)
            raise

    async def _to_outbox(
        self, request: RolloutRequest, response: RolloutResponse, error: str
    ) -> None:
        if self.metrics is not None:
            self.metrics.callbacks.labels(outcome="outbox").inc()
        await self._keep(
            request.rollout_id, request.server_url, request.api_key_value, response, error
        )

    async def _keep(
        self,
        rollout_id: str,
        server_url: str,
        api_key: str | None,
        response: RolloutResponse,
        error: str,
    ) -> None:
        """Put an undeliverable callback in the state's outbox (a local file if that fails)."""
        entry = OutboxEntry(
            id="",
            rollout_id=rollout_id,
            server_url=server_url,
            error=scrub(error, api_key),
            written_at=time.time(),
            response=scrub_data(wire(response), api_key),
            api_key=api_key,
        )
        try:
            with anyio.CancelScope(shield=True), anyio.fail_after(10):
                where = await self.state.outbox_put(entry)
        except (StateUnavailable, TimeoutError) as exc:
            logger.error("rollout %s: outbox store unavailable (%s)", loggable(rollout_id), exc)
            where = ""
        except Exception as exc:
            logger.error("rollout %s: outbox not writable (%s)", loggable(rollout_id), exc)
            where = ""
        if not where:  # the last resort: this host's disk
            try:
                path = write_outbox(self.outbox_dir, server_url, response, entry.error, api_key)
                where = str(path)
            except Exception as exc:
                logger.critical(
                    "rollout %s: callback failed (%s) and the outbox is not writable (%s); "
                    "response follows: %s",
                    loggable(rollout_id),
                    entry.error,
                    exc,
                    scrub(repr(response), api_key),
                )
                return
        logger.error(
            "rollout %s: completion callback failed (%s); saved to %s",
            loggable(rollout_id),
            entry.error,
            where,
        )

    # -- what replicas do for each other (shared state only) ------------------------------------

    async def _renew_leases(self) -> None:
        """Keep this replica's leases (and its heartbeat) fresh, a fifth of the TTL apart."""
        ttl = self._lease_s
        failing = False
        while True:
            keys = [entry.key for entry in self.registry.unfinished()]
            renewing_at = time.monotonic()
            try:
                await self.state.renew(self.replica, keys, ttl)
                for key in keys:
                    # Extended only if it had not lapsed (and been swept) before this call.
                    last = self._leased_at.get(key)
                    if last is not None and renewing_at - last < ttl / 2:
                        self._leased_at[key] = renewing_at
            except StateUnavailable as exc:
                if not failing:
                    logger.error("cannot renew %d rollout lease(s): %s", len(keys), exc)
                failing = True
            else:
                if failing:
                    logger.warning("rollout state store reachable again")
                failing = False
            await anyio.sleep(self.settings.lease_ttl_s / 5)

    async def _sweep_orphans(self) -> None:
        """End the rollouts of replicas that died: each lapsed lease is claimed by one sweeper."""
        interval = min(1.0, self.settings.lease_ttl_s / 10)
        while True:
            await anyio.sleep(interval * (0.75 + random.random() / 2))
            if self.registry.draining:
                continue
            try:
                orphans = await self.state.claim_orphans(100, self.settings.record_ttl_s)
            except StateUnavailable:
                continue
            assert self._tasks is not None
            for orphan in orphans:
                self._tasks.start_soon(self._end_orphan, orphan)

    async def _end_orphan(self, orphan: LeasedRollout) -> None:
        assert self.client is not None
        logger.warning(
            "rollout %s: its replica stopped renewing its lease; sending the ERROR callback",
            loggable(orphan.rollout_id),
        )
        response = RolloutResponse(
            rollout_id=orphan.rollout_id,
            status=RolloutStatus.ERROR,
            final_messages=orphan.messages,
            finish_reason="error",
            error_message=(
                "the server replica running this rollout stopped (it no longer renewed its "
                "lease); the rollout was lost with it"
            ),
        )
        try:
            await self.client.complete_rollout(orphan.server_url, response, api_key=orphan.api_key)
        except Exception as exc:
            await self._keep(
                orphan.rollout_id, orphan.server_url, orphan.api_key, response, str(exc)
            )
        except BaseException as exc:
            error = f"delivery interrupted: {type(exc).__name__}"
            await self._keep(orphan.rollout_id, orphan.server_url, orphan.api_key, response, error)
            raise

    async def _redeliver_outbox(self) -> None:
        """Retry undeliverable callbacks kept in the shared outbox, with exponential backoff."""
        assert self.client is not None
        while True:
            await anyio.sleep(0.5 + random.random())
            if self.registry.draining:
                continue
            try:
                due = await self.state.outbox_due(20, _OUTBOX_VISIBILITY_S)
            except StateUnavailable:
                continue
            for entry in due:
                try:
                    outcome = await redeliver(self.state, self.client, entry)
                except StateUnavailable:  # the entry reappears after its visibility timeout
                    break
                if outcome.delivered:
                    logger.info("rollout %s: outbox entry delivered", loggable(entry.rollout_id))


def _log_exception(request: RolloutRequest, what: str) -> None:
    """Log the exception being handled, its traceback scrubbed of the rollout's api_key."""
    text = scrub(traceback.format_exc(), request.api_key_value)
    logger.error("rollout %s: %s\n%s", loggable(request.rollout_id), what, text.rstrip())


def _validation_body(exc: ValidationError) -> dict[str, Any]:
    """The 422 body: the first errors (never input values), each cut short, and the count.

    The input is pydantic's own (``fail_fast`` lists keep the count small); the caps keep the
    body a few KB whatever was sent.
    """
    details: list[dict[str, Any]] = []
    size = 0
    errors = exc.errors(include_input=False, include_url=False, include_context=False)
    for err in errors[:_MAX_ERRORS]:
        loc = [
            "body",
            *(_cut(str(part), 64) if isinstance(part, str) else part for part in err["loc"][:8]),
        ]
        item = {
            "loc": loc,
            "msg": _cut(err["msg"], _MAX_ERROR_CHARS),
            "type": _cut(err["type"], 64),
        }
        size += len(json.dumps(item))
        if size > _MAX_ERRORS_BYTES:
            break
        details.append(item)
    return {"detail": details, "error_count": exc.error_count()}


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
