"""What replicas sharing a state do for each other; started only with a shared state.

``Replicas`` runs the three loops (admission across replicas, ``claim_init``, is the
scheduler's): each replica keeps
its leases (and its heartbeat) fresh, sweeps the lapsed leases of replicas that died (each
orphan is claimed by one sweeper, which ends it with an ERROR result), and retries the results
kept in the shared outbox.
"""

from __future__ import annotations

import logging
import random
import time
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from ..protocol import RolloutResponse, RolloutStatus
from ..redaction import loggable
from .delivery import Delivery, redeliver
from .registry import (
    CANCELLED_BY_TRAINER,
    cancel_entry,
)
from .state import LeasedRollout, StateUnavailable
from .status import publish_status
from .types import TargetFactory

if TYPE_CHECKING:
    from ..client import TrainGateClient
    from .registry import RolloutRegistry
    from .scheduler import Scheduler

__all__ = ["Replicas"]

logger = logging.getLogger("osmosis_rollout.server")

#: How long a replica trying an outbox entry hides it from its peers.
_OUTBOX_VISIBILITY_S = 900.0


class Replicas:
    """The lease renewal, orphan sweep and outbox redelivery loops of one replica."""

    def __init__(
        self,
        scheduler: Scheduler,
        delivery: Delivery,
        *,
        target_of: TargetFactory,
    ) -> None:
        self.scheduler = scheduler
        self.delivery = delivery
        self.state = scheduler.state
        self.target_of = target_of
        self._tasks: anyio.abc.TaskGroup | None = None

    # Read through the scheduler each time, as the loops always did: a test may replace the
    # server's settings while it runs.

    @property
    def registry(self) -> RolloutRegistry:
        return self.scheduler.registry

    @property
    def lease_ttl_s(self) -> float:
        return self.scheduler.settings.lease_ttl_s

    @property
    def record_ttl_s(self) -> float:
        return self.scheduler.settings.record_ttl_s

    @property
    def client(self) -> TrainGateClient:
        assert self.scheduler.client is not None  # the lifespan opened it
        return self.scheduler.client

    def start(self, tasks: anyio.abc.TaskGroup) -> None:
        """Run the three loops in ``tasks`` (the lifespan's task group)."""
        self._tasks = tasks
        tasks.start_soon(self._renew_leases)
        tasks.start_soon(self._sweep_orphans)
        tasks.start_soon(self._redeliver_outbox)
        tasks.start_soon(self._take_cancels)

    async def _renew_leases(self) -> None:
        """Keep this replica's leases (and its heartbeat) fresh, a fifth of the TTL apart."""
        scheduler = self.scheduler
        ttl = scheduler.lease_s
        failing = False
        while True:
            keys = [entry.key for entry in self.registry.unfinished()]
            renewing_at = time.monotonic()
            try:
                await self.state.renew(scheduler.replica, keys, ttl)
                for key in keys:
                    # Extended only if it had not lapsed (and been swept) before this call.
                    last = scheduler.leased_at.get(key)
                    if last is not None and renewing_at - last < ttl / 2:
                        scheduler.leased_at[key] = renewing_at
            except StateUnavailable as exc:
                if not failing:
                    logger.error("cannot renew %d rollout lease(s): %s", len(keys), exc)
                failing = True
            else:
                if failing:
                    logger.warning("rollout state store reachable again")
                failing = False
            await anyio.sleep(self.lease_ttl_s / 5)

    async def _sweep_orphans(self) -> None:
        """End the rollouts of replicas that died: each lapsed lease is claimed by one sweeper."""
        interval = min(1.0, self.lease_ttl_s / 10)
        while True:
            await anyio.sleep(interval * (0.75 + random.random() / 2))
            if self.registry.draining:
                continue
            try:
                orphans = await self.state.claim_orphans(100, self.record_ttl_s)
            except StateUnavailable:
                continue
            assert self._tasks is not None
            for orphan in orphans:
                self._tasks.start_soon(self._end_orphan, orphan)

    async def _end_orphan(self, orphan: LeasedRollout) -> None:
        logger.warning(
            "rollout %s: its replica stopped renewing its lease; ending it here",
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
        target = self.target_of(
            orphan.protocol, orphan.rollout_id, orphan.server_url, orphan.api_key, orphan.route
        )
        response, terminal = target.settle(response, None)
        await publish_status(
            self.state,
            orphan.rollout_id,
            orphan.protocol,
            self.scheduler.replica,
            terminal.status,
            terminal,
            self.record_ttl_s,
        )
        try:
            await target.deliver(self.client, response)
        except Exception as exc:
            await self.delivery.keep(target, response, str(exc))
        except BaseException as exc:
            error = f"delivery interrupted: {type(exc).__name__}"
            await self.delivery.keep(target, response, error)
            raise

    # -- status and cancel across replicas ------------------------------------------------------

    async def status(self, rollout_id: str, protocol: str) -> dict[str, Any] | None:
        """The status of a rollout another replica runs or ran, from the shared state."""
        try:
            return await self.state.rollout_status(rollout_id, protocol)
        except StateUnavailable:
            return None

    async def cancel(self, rollout_id: str, protocol: str) -> str:
        """Ask the replica that runs ``rollout_id`` to cancel it; the disposition."""
        try:
            return await self.state.request_cancel(rollout_id, protocol)
        except StateUnavailable:
            return "not_found"

    async def cancel_matching(self, prefix: str, protocol: str, replica: str) -> dict[str, str]:
        """Cancel the other replicas' in-flight rollouts whose id starts with ``prefix``."""
        try:
            return await self.state.request_cancel_matching(prefix, protocol, replica)
        except StateUnavailable:
            return {}

    async def _take_cancels(self) -> None:
        """Cancel the rollouts peers asked this replica to cancel (polled twice a second)."""
        registry = self.registry
        while True:
            await anyio.sleep(0.5)
            try:
                wanted = await self.state.take_cancels(self.scheduler.replica)
            except StateUnavailable:
                continue
            for rollout_id in wanted:
                entry = registry.by_id.get(rollout_id)
                if entry is not None:
                    cancel_entry(entry, CANCELLED_BY_TRAINER)

    async def _redeliver_outbox(self) -> None:
        """Retry undeliverable results kept in the shared outbox, with exponential backoff."""
        client = self.client
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
                    outcome = await redeliver(self.state, client, entry, target_of=self.target_of)
                except StateUnavailable:  # the entry reappears after its visibility timeout
                    break
                if outcome.delivered:
                    logger.info("rollout %s: outbox entry delivered", loggable(entry.rollout_id))
