"""Rollout state shared between replicas: ``memory`` (one process) or ``redis`` (a cluster).

``open_state(url)`` picks the backend from the ``state`` setting; see ``base.py`` for the API.
"""

from __future__ import annotations

from pathlib import Path

from ...config import check_state_url
from ...errors import ConfigError
from .base import (
    BODY_CHANGED,
    Claim,
    ClaimOutcome,
    LeasedRollout,
    OutboxEntry,
    StateBackend,
    StateUnavailable,
    fingerprint,
)
from .memory import MemoryState

__all__ = [
    "BODY_CHANGED",
    "Claim",
    "ClaimOutcome",
    "LeasedRollout",
    "MemoryState",
    "OutboxEntry",
    "StateBackend",
    "StateUnavailable",
    "check_state_url",
    "fingerprint",
    "open_state",
]


def open_state(url: str, *, outbox_dir: Path) -> StateBackend:
    """The backend for ``url``; a ``ConfigError`` if it is unknown or its package is missing."""
    try:
        check_state_url(url)
    except ValueError as exc:
        raise ConfigError(f"invalid state {url!r}: {exc}") from None
    if url == "memory":
        return MemoryState(outbox_dir)
    from .redis import RedisState  # the optional extra: imported only when asked for

    return RedisState(url)
