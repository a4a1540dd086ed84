"""``RolloutServer``: one server's parts, wired together, and the lifespan that runs them.

It owns the registry, the state, the tracer and the metrics, and composes the ``Scheduler``
(admission and runs), ``Delivery`` (callbacks and the outbox) and, with a shared state,
``Replicas``. Its lifespan opens the pooled ``TrainGateClient`` and the task group the
background loops run in (never request-scoped), and on exit drains before closing anything.
The HTTP edge is ``app.py``; the wire protocols' shapes are ``wire/`` (v1 and v2, served side
by side: each lease and outbox entry names its protocol, and ``target_of`` rebuilds its target).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import secrets
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import sniffio
from starlette.applications import Starlette

from ..agent import RolloutAgentLoop
from ..client import RetryPolicy, TrainGateClient
from ..config import ServerSettings
from ..destinations import DestinationPolicy
from ..protocol import HealthResponse
from ..tracing import Tracer
from .delivery import DEFAULT_OUTBOX_DIR, Delivery
from .outbox_guard import OutboxGuard
from .registry import RolloutRegistry
from .replicas import Replicas
from .scheduler import Scheduler
from .state import StateBackend, open_state
from .trajectories import TrajectorySaver
from .types import Wire, targets_by_protocol

if TYPE_CHECKING:
    from .metrics import ServerMetrics

__all__ = ["Hook", "RolloutServer"]

logger = logging.getLogger("osmosis_rollout.server")

#: After the grace period, how long cancelled rollouts get to deliver their callbacks before
#: the rest are stopped and written to the outbox (a dead TrainGate must not hold shutdown).
DELIVERY_GRACE_S = 15.0
#: How long a client may take to send a start request's body (a slow sender must not hold a
#: connection); the edge answers 408 after it.
BODY_TIMEOUT_S = 30.0

#: A start-up or shutdown hook: an async function without arguments (a sync one works too).
Hook = Callable[[], Awaitable[None] | None]


async def _call_hook(hook: Hook | None, when: str) -> None:
    if hook is None:
        return
    result = hook()
    if inspect.isawaitable(result):
        await result
    logger.debug("%s hook %r done", when, hook)


class RolloutServer:
    """The state and parts behind ``create_app``; one per app (``app.state.rollout_server``).

    ``wires`` are the protocols it serves (``create_app`` passes v1's)."""

    def __init__(
        self,
        agent: RolloutAgentLoop,
        settings: ServerSettings,
        *,
        wires: Sequence[Wire],
        client: TrainGateClient | None = None,
        delivery_grace_s: float = DELIVERY_GRACE_S,
        body_timeout_s: float = BODY_TIMEOUT_S,
    ) -> None:
        self.agent = agent
        #: The wire protocols served (each its own start route); leases and outbox entries name
        #: theirs, and ``target_of`` rebuilds their targets by it.
        self.wires = tuple(wires)
        self.target_of = targets_by_protocol(self.wires)
        self.registry = RolloutRegistry(
            max_concurrent=settings.max_concurrent,
            max_queued=settings.max_queued,
            record_ttl_s=settings.record_ttl_s,
        )
        self._given_client = client
        self.tracer = Tracer(settings.debug_dir) if settings.debug_dir else None
        #: Each rollout's ATIF ``trajectory.json`` under the artifact root, when there is one.
        self.trajectories = (
            TrajectorySaver(settings.artifact_root, agent.name) if settings.artifact_root else None
        )
        self.outbox_dir = settings.outbox_dir or DEFAULT_OUTBOX_DIR
        self.state: StateBackend = open_state(settings.state, outbox_dir=self.outbox_dir)
        #: This process among the replicas sharing the state (leases and queue places name it).
        self.replica = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        #: What ``/health`` reports as ``instance_id`` (v2): the platform's (the settings', or
        #: the variable's for an app built without them), else the replica.
        self.instance_id = (
            settings.instance_id or os.environ.get("_OSMOSIS_ROLLOUT_INSTANCE_ID") or self.replica
        )
        #: This process's life (``/health``'s ``process_id``): a polling controller that sees
        #: it change knows the server restarted.
        self.process_id = uuid.uuid4().hex
        self.delivery_grace_s = delivery_grace_s
        #: How long the edge waits for a start request's body (then 408).
        self.body_timeout_s = body_timeout_s
        self.hooks: tuple[Hook | None, Hook | None] = (None, None)  # on_startup, on_shutdown
        guard = OutboxGuard(
            None if self.state.shared else self.outbox_dir,
            max_entries=settings.outbox_max_entries,
            max_bytes=settings.outbox_max_bytes,
        )
        self.delivery = Delivery(self.state, self.outbox_dir, None, guard)
        self.scheduler = Scheduler(
            agent,
            settings,
            self.registry,
            self.state,
            self.delivery,
            replica=self.replica,
            tracer=self.tracer,
            metrics=None,
            client=client,
            trajectories=self.trajectories,
        )
        # The metrics come last: registering them collects once, and the client gauges read
        # ``self.client`` (the scheduler's).
        self.metrics: ServerMetrics | None = None
        if settings.metrics:
            from .metrics import ServerMetrics

            self.metrics = ServerMetrics(
                self.registry,
                client_stats=lambda: self.client.stats if self.client is not None else None,
            )
            self.scheduler.metrics = self.delivery.metrics = self.metrics
        self.replicas: Replicas | None = None
        if self.state.shared:
            self.replicas = Replicas(
                self.scheduler,
                self.delivery,
                target_of=self.target_of,
            )

    @property
    def settings(self) -> ServerSettings:
        """The resolved settings (replaceable, e.g. by a test: the scheduler reads them)."""
        return self.scheduler.settings

    @settings.setter
    def settings(self, value: ServerSettings) -> None:
        self.scheduler.settings = value

    @property
    def client(self) -> TrainGateClient | None:
        """The pooled client callbacks and chat turns go through (None outside the lifespan,
        unless one was given)."""
        return self.scheduler.client

    @property
    def running(self) -> bool:
        """Whether the lifespan runs (rollouts can start)."""
        return self.scheduler.tasks is not None

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        """Open the client and the task group; on exit drain, then close everything."""
        owns_client = self._given_client is None
        if owns_client:
            self.scheduler.client = TrainGateClient(
                retry=RetryPolicy(max_reply_bytes=self.settings.max_reply_bytes),
                max_connections=max(1000, 2 * self.settings.max_concurrent),
                # Each connection's resolved addresses checked (docs/security.md).
                destinations=DestinationPolicy.for_server(
                    self.settings.host, self.settings.traingate
                ),
            )
        try:
            async with anyio.create_task_group() as tasks:
                on_asyncio = sniffio.current_async_library() == "asyncio"
                self.scheduler.open(tasks, asyncio.get_running_loop() if on_asyncio else None)
                tasks.start_soon(self._expire_records)
                if self.replicas is not None:
                    self.replicas.start(tasks)
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
                            await self.scheduler.stop()
                            await self.delivery.close()
                    tasks.cancel_scope.cancel()
        finally:
            self.scheduler.close()
            client = self.scheduler.client
            if owns_client and client is not None:
                await client.aclose()
            if self.tracer is not None:
                self.tracer.close()
            if self.trajectories is not None:
                self.trajectories.close()
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

    async def health_body(self) -> HealthResponse:
        """What ``/health`` reports: counts, and whether the state answers (2 s at most)."""
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
            concurrency={
                "max_concurrent": self.settings.max_concurrent,
                "queued": registry.queued,
                "running": registry.active,
            },
            instance_id=self.instance_id,
            process_id=self.process_id,
            # The polling SDK's RolloutLifecycle: new rollouts taken; rollouts not yet ended.
            lifecycle={
                "accepting_rollouts": self.running and not registry.draining,
                "active_rollouts": len(registry.by_id),
            },
        )

    # -- status and cancel beyond this process (a shared state) ---------------------------------

    async def shared_status(self, rollout_id: str, protocol: str) -> dict[str, Any] | None:
        """The status another replica published for ``rollout_id``, or None."""
        if self.replicas is None:
            return None
        return await self.replicas.status(rollout_id, protocol)

    async def cancel_remote(self, rollout_id: str, protocol: str) -> str:
        """Cancel a rollout another replica runs; its disposition (``not_found`` without)."""
        if self.replicas is None:
            return "not_found"
        return await self.replicas.cancel(rollout_id, protocol)

    async def cancel_remote_matching(self, prefix: str, protocol: str) -> dict[str, str]:
        """Cancel the other replicas' rollouts whose id starts with ``prefix``."""
        if self.replicas is None:
            return {}
        return await self.replicas.cancel_matching(prefix, protocol, self.replica)
