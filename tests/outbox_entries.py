"""Outbox entries for the state backends and ``osmosis outbox``, built without a server."""

from __future__ import annotations

import time

from osmosis_rollout.protocol import RolloutResponse, RolloutStatus, wire
from osmosis_rollout.server.state import OutboxEntry


def undelivered(rollout_id: str = "r-1") -> OutboxEntry:
    """An outbox entry for an ERROR result, with a per-rollout key."""
    response = RolloutResponse(
        rollout_id=rollout_id,
        status=RolloutStatus.ERROR,
        final_messages=[],
        finish_reason="error",
        error_message="boom",
    )
    return OutboxEntry(
        id="",
        rollout_id=rollout_id,
        server_url="http://127.0.0.1:9/tg",
        error="POST ... returned HTTP 503",
        written_at=time.time(),
        response=wire(response),
        api_key="tg-secret",
    )
