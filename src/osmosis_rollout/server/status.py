"""Publishing a rollout's status where every replica can read it (a shared state only).

The registry answers status requests for this process's rollouts; with a shared state each
phase change (queued, running, grading, then the terminal status, before the callbacks) is
also written to the store, so any replica answers ``GET .../status`` and passes a cancel on to
the replica that owns the rollout (``state.request_cancel``; the owner polls its list in
``Replicas``). A store that does not answer costs only that visibility: never the rollout.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..redaction import loggable
from .state import StateBackend, StateUnavailable

if TYPE_CHECKING:
    from .types import Terminal

__all__ = ["publish_status"]

logger = logging.getLogger("osmosis_rollout.server")


async def publish_status(
    state: StateBackend,
    rollout_id: str,
    protocol: str,
    replica: str,
    status: str,
    terminal: Terminal | None = None,
    record_ttl_s: float = 3600.0,
) -> None:
    """Write one phase (or, with ``terminal``, the end, kept ``record_ttl_s``) to the store."""
    if not state.shared:
        return
    try:
        if terminal is None:
            await state.publish_status(rollout_id, protocol, replica, status)
        else:
            await state.publish_status(
                rollout_id,
                protocol,
                replica,
                terminal.status,
                reward=terminal.reward,
                err_message=terminal.err_message,
                ttl_s=record_ttl_s,
            )
    except StateUnavailable as exc:
        logger.warning("rollout %s: status not published: %s", loggable(rollout_id), exc)
