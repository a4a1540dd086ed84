"""Delivery: each accepted rollout's result reaches its trainer once, or waits in the outbox.

``Delivery.deliver`` sends a result through the rollout's ``DeliveryTarget``; one the trainer
does not take (or that shutdown interrupts) is kept by ``Delivery.keep`` in the state's outbox,
and in a file on this host if the state cannot take it. ``redeliver`` sends one kept entry
again: the server's redelivery loop (shared state) and ``osmosis outbox replay`` both use it.
Entries the trainer accepts are removed; the others stay with the attempt counted, so a replay
can be repeated safely (TrainGate deduplicates callbacks by their ``X-Request-Id``). An entry
names its wire protocol and, for v2, which of its two callbacks are still due: a redelivery
sends only those, and one that gets the completion through but not the grader callback
replaces the entry by one holding only the grader callback.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from ..errors import TrainGateError, TrainGateHTTPError
from ..protocol import RolloutResponse, wire
from ..redaction import loggable, scrub, scrub_data
from .outbox_guard import OutboxGuard
from .state import LeasedRollout, OutboxEntry, StateBackend, StateUnavailable
from .state.memory import write_outbox
from .types import DeliveryTarget, TargetFactory

if TYPE_CHECKING:
    from ..client import TrainGateClient
    from .metrics import ServerMetrics
    from .registry import RolloutEntry

__all__ = [
    "DEFAULT_OUTBOX_DIR",
    "Delivery",
    "ReplayOutcome",
    "log_exception",
    "redeliver",
    "replay_outbox",
]

logger = logging.getLogger("osmosis_rollout.server")

DEFAULT_OUTBOX_DIR = Path(".osmosis") / "outbox"

#: Redelivery backoff: 10 s, 20 s, 40 s ... at most 10 minutes between attempts.
_FIRST_DELAY_S = 10.0
_MAX_DELAY_S = 600.0


def _scrub_all(value: Any, secrets: tuple[str, ...]) -> Any:
    """``value`` (text or JSON-like) with every one of ``secrets`` scrubbed."""
    for secret in secrets:
        value = scrub(value, secret) if isinstance(value, str) else scrub_data(value, secret)
    return value


def log_exception(rollout_id: str, api_key: str | None, what: str) -> None:
    """Log the exception being handled, its traceback scrubbed of the rollout's api_key."""
    text = scrub(traceback.format_exc(), api_key)
    logger.error("rollout %s: %s\n%s", loggable(rollout_id), what, text.rstrip())


class Delivery:
    """Sends results and keeps the undeliverable ones; one per server."""

    def __init__(
        self,
        state: StateBackend,
        outbox_dir: Path,
        metrics: ServerMetrics | None,
        guard: OutboxGuard | None = None,
    ) -> None:
        self.state = state
        self.outbox_dir = outbox_dir
        self.metrics = metrics
        #: Holds results no outbox could take, and caps the outbox (docs/security.md).
        self.guard = guard or OutboxGuard(None if state.shared else outbox_dir)

    async def deliver(
        self, client: TrainGateClient, entry: RolloutEntry, response: RolloutResponse
    ) -> None:
        """Send ``response`` to the entry's target; kept in the outbox if that fails."""
        target = entry.target
        assert target is not None  # the wire set it before the rollout was started
        entry.outcome = "outbox"  # until the trainer accepts it
        progress = None
        if self.state.shared and target.record() is not None:

            async def progress() -> None:
                await self.save_lease(entry)

        try:
            await target.deliver(client, response, progress)
            entry.outcome = response.status.value
            if self.metrics is not None:
                self.metrics.callbacks.labels(outcome="delivered").inc()
        except TrainGateError as exc:
            await self.to_outbox(target, response, str(exc))
        except Exception as exc:  # never let one delivery take the server down
            log_exception(target.rollout_id, target.api_key, "callback could not be sent")
            await self.to_outbox(target, response, f"callback not sent: {type(exc).__name__}")
        except BaseException as exc:  # cancelled mid-delivery (drain gave up, or a hard stop)
            reason = "shutdown: TrainGate did not accept it in time"
            error = f"delivery interrupted ({reason}): {type(exc).__name__}"
            await self.to_outbox(target, response, error)
            raise

    async def save_lease(self, entry: RolloutEntry) -> None:
        """With a shared state, put the target's settled callbacks and the parts still due in
        the rollout's lease: a peer ending it as an orphan (this replica died) then sends those
        parts, the same bodies under the same request ids, never a contradicting ERROR."""
        target = entry.target
        if not self.state.shared or target is None or target.record() is None:
            return
        try:
            with anyio.fail_after(10):
                await self.state.update_lease(LeasedRollout.of(entry.request, target))
        except (StateUnavailable, TimeoutError) as exc:
            logger.warning("rollout %s: lease not updated: %s", loggable(entry.rollout_id), exc)

    async def to_outbox(
        self, target: DeliveryTarget, response: RolloutResponse, error: str
    ) -> None:
        """Keep a result that was not delivered, counted in the metrics."""
        if self.metrics is not None:
            self.metrics.callbacks.labels(outcome="outbox").inc()
        await self.keep(target, response, error)

    async def keep(self, target: DeliveryTarget, response: RolloutResponse, error: str) -> None:
        """Put an undeliverable result in the state's outbox (a local file if that fails)."""
        rollout_id, api_key = target.rollout_id, target.api_key
        hidden = target.secrets
        entry = OutboxEntry(
            id="",
            rollout_id=rollout_id,
            server_url=target.server_url,
            error=_scrub_all(error, hidden),
            written_at=time.time(),
            response=_scrub_all(wire(response), hidden),
            api_key=api_key,
            protocol=target.protocol,
            route=_scrub_all(target.record(), hidden),
        )

        async def store() -> str:
            return await self._store(entry, target, response)

        try:
            where = await store()
        except Exception as exc:  # neither the state nor this host's disk took it: hold it
            logger.error("rollout %s: outbox file not writable (%s)", loggable(rollout_id), exc)
            self.guard.hold(rollout_id, store)
            return
        self.guard.kept(len(entry.error) + len(repr(entry.response)))
        logger.error(
            "rollout %s: callback failed (%s); saved to %s",
            loggable(rollout_id),
            entry.error,
            where,
        )

    async def _store(
        self, entry: OutboxEntry, target: DeliveryTarget, response: RolloutResponse
    ) -> str:
        """Write ``entry`` to the state's outbox, else to a file here; returns where."""
        rollout_id, api_key = target.rollout_id, target.api_key
        try:
            with anyio.CancelScope(shield=True), anyio.fail_after(10):
                where = await self.state.outbox_put(entry)
        except (StateUnavailable, TimeoutError) as exc:
            logger.error("rollout %s: outbox store unavailable (%s)", loggable(rollout_id), exc)
            where = ""
        except Exception as exc:
            logger.error("rollout %s: outbox not writable (%s)", loggable(rollout_id), exc)
            where = ""
        if where:
            return where
        path = write_outbox(
            self.outbox_dir,
            target.server_url,
            response,
            entry.error,
            api_key,
            protocol=entry.protocol,
            route=entry.route,
        )
        return str(path)

    async def close(self) -> None:
        """At shutdown: write the held results one last time; log those that still fail."""
        if await self.guard.close():
            return
        for held in self.guard.held:
            logger.critical(
                "rollout %s: the outbox is still not writable at shutdown; the result is lost "
                "(its callback failed before)",
                loggable(held.rollout_id),
            )


# -- redelivery ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayOutcome:
    """What happened to one entry."""

    entry: OutboxEntry
    delivered: bool
    error: str = ""


async def redeliver(
    state: StateBackend,
    client: TrainGateClient,
    entry: OutboxEntry,
    api_key: str | None = None,
    *,
    target_of: TargetFactory,
) -> ReplayOutcome:
    """Send one entry once more: delivered -> removed; refused by TrainGate (a 4xx other than
    429) -> kept for a replay only; anything else -> kept and retried later with backoff.

    ``target_of`` rebuilds the entry's target (its wire protocol's callback)."""
    key = entry.api_key or api_key
    try:
        response = RolloutResponse.model_validate(entry.response)
    except ValueError as exc:  # an unreadable entry: leave it for a person to look at
        return ReplayOutcome(entry, False, f"not a valid callback: {exc}")
    try:
        target = target_of(entry.protocol, entry.rollout_id, entry.server_url, key, entry.route)
    except ValueError as exc:  # a protocol this version does not speak
        return ReplayOutcome(entry, False, str(exc))
    try:
        await target.deliver(client, response)
    except TrainGateError as exc:
        error = scrub(str(exc), key)
        route = target.record()
        if _pending(route) != _pending(entry.route):  # a part got through: keep only the rest
            await _replace(state, entry, scrub_data(route, key), error)
            return ReplayOutcome(entry, False, error)
        refused = isinstance(exc, TrainGateHTTPError) and not (
            exc.status_code == 429 or exc.status_code >= 500
        )
        automatic = state.shared and not refused
        delay = min(_MAX_DELAY_S, _FIRST_DELAY_S * 2**entry.attempts) if automatic else None
        await state.outbox_retry(entry, delay, error)
        return ReplayOutcome(entry, False, error)
    await state.outbox_done(entry)
    return ReplayOutcome(entry, True)


def _pending(route: dict[str, Any] | None) -> Any:
    return None if route is None else route.get("pending")


async def _replace(
    state: StateBackend, entry: OutboxEntry, route: dict[str, Any] | None, error: str
) -> None:
    """Swap ``entry`` for one whose route says what is still due (put first: never lost)."""
    remaining = dataclasses.replace(
        entry, id="", location="", route=route, error=error, attempts=entry.attempts + 1
    )
    await state.outbox_put(remaining)
    await state.outbox_done(entry)


async def replay_outbox(
    state: StateBackend,
    client: TrainGateClient,
    *,
    target_of: TargetFactory,
    ids: Iterable[str] = (),
    api_key: str | None = None,
) -> list[ReplayOutcome]:
    """Try every entry (or those whose id or rollout id is in ``ids``) once, oldest first.

    ``api_key`` is sent for entries that do not carry their own (the file outbox never keeps it).
    """
    wanted = set(ids)
    outcomes: list[ReplayOutcome] = []
    for entry in await state.outbox_list():
        if not wanted or entry.id in wanted or entry.rollout_id in wanted:
            outcomes.append(await redeliver(state, client, entry, api_key, target_of=target_of))
    return outcomes
