"""Replaying the outbox: send kept completion callbacks to TrainGate again, from any backend.

Entries that TrainGate accepts are removed; the others stay, with the attempt counted and the
error kept, so a replay can be repeated safely (TrainGate deduplicates callbacks by their
``X-Request-Id``, ``<rollout_id>:completed``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..client import TrainGateClient
from ..errors import TrainGateError, TrainGateHTTPError
from ..protocol import RolloutResponse
from ..redaction import scrub
from .state import OutboxEntry, StateBackend

__all__ = ["ReplayOutcome", "redeliver", "replay_outbox"]


@dataclass(frozen=True)
class ReplayOutcome:
    """What happened to one entry."""

    entry: OutboxEntry
    delivered: bool
    error: str = ""


#: Redelivery backoff: 10 s, 20 s, 40 s ... at most 10 minutes between attempts.
_FIRST_DELAY_S = 10.0
_MAX_DELAY_S = 600.0


async def redeliver(
    state: StateBackend, client: TrainGateClient, entry: OutboxEntry, api_key: str | None = None
) -> ReplayOutcome:
    """Send one entry once more: delivered -> removed; refused by TrainGate (a 4xx other than
    429) -> kept for a replay only; anything else -> kept and retried later with backoff."""
    key = entry.api_key or api_key
    try:
        response = RolloutResponse.model_validate(entry.response)
    except ValueError as exc:  # an unreadable entry: leave it for a person to look at
        return ReplayOutcome(entry, False, f"not a valid callback: {exc}")
    try:
        await client.complete_rollout(entry.server_url, response, api_key=key)
    except TrainGateError as exc:
        error = scrub(str(exc), key)
        refused = isinstance(exc, TrainGateHTTPError) and not (
            exc.status_code == 429 or exc.status_code >= 500
        )
        automatic = state.shared and not refused
        delay = min(_MAX_DELAY_S, _FIRST_DELAY_S * 2**entry.attempts) if automatic else None
        await state.outbox_retry(entry, delay, error)
        return ReplayOutcome(entry, False, error)
    await state.outbox_done(entry)
    return ReplayOutcome(entry, True)


async def replay_outbox(
    state: StateBackend,
    client: TrainGateClient,
    *,
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
            outcomes.append(await redeliver(state, client, entry, api_key))
    return outcomes
