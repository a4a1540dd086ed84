"""``OutboxGuard``: the outbox never loses a result, and is never allowed to grow without end.

Two ways an outbox could lose results, and what this guard does about each:

- it cannot be written (the process is out of file handles, the disk is full, Redis and the
  disk both refuse): the result is **held in memory** and written again every second until it
  goes through, and while anything is held new inits are refused (503), so the number of results
  only in memory stays bounded by the rollouts already accepted;
- it keeps growing (a trainer that refuses every callback): past ``max_entries`` results or
  ``max_bytes`` of them, new inits are refused (503) with a body saying what to do. Rollouts
  already accepted still write their result: the cap stops new work, it never drops a result.

The cap is the file outbox's: the guard counts the files there at the first init, adds what
this process writes, and counts again (at most every 2 s) once the cap is reached, so a replay
that empties the folder reopens the server. A Redis outbox is Redis's memory, capped there
(``maxmemory``); a Redis that refuses the write sends the result to the file outbox. Its own
module because the delivery path (``delivery.py``) and admission (``scheduler.py``) both ask it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from ..redaction import loggable

__all__ = ["DEFAULT_OUTBOX_MAX_BYTES", "DEFAULT_OUTBOX_MAX_ENTRIES", "OutboxGuard"]

logger = logging.getLogger("osmosis_rollout.server")

DEFAULT_OUTBOX_MAX_ENTRIES = 10_000
DEFAULT_OUTBOX_MAX_BYTES = 1024 * 2**20
#: How often held results are written again.
REWRITE_EVERY_S = 1.0
#: At most this often the outbox folder is counted again once the cap is reached.
_RECOUNT_EVERY_S = 2.0


@dataclass
class _Held:
    rollout_id: str
    write: Callable[[], Awaitable[str]]


class OutboxGuard:
    """Held results and the outbox's size; ``folder`` is the file outbox (None: not files)."""

    def __init__(
        self,
        folder: Path | None,
        *,
        max_entries: int = DEFAULT_OUTBOX_MAX_ENTRIES,
        max_bytes: int = DEFAULT_OUTBOX_MAX_BYTES,
    ) -> None:
        self.folder = folder
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.held: list[_Held] = []
        self.entries = 0
        self.bytes = 0
        self._counted_at: float | None = None
        self._task: asyncio.Task[None] | None = None

    # -- admission ------------------------------------------------------------------------------

    def refusal(self) -> str | None:
        """Why a new init must be refused now (the 503's detail), or None."""
        if self.held:
            return (
                f"the outbox cannot be written ({len(self.held)} result(s) held in memory until "
                "it can): free file handles or disk space; retry later"
            )
        if self.folder is None:
            return None
        if self._counted_at is None or self._full():
            self._recount()
        if self._full():
            return (
                f"the outbox is full ({self.entries:,} results, {self.bytes / 2**20:.1f} MiB; "
                f"limits {self.max_entries:,} and {self.max_bytes / 2**20:.0f} MiB): replay it "
                "with `osmosis outbox replay` or raise outbox_max_entries / outbox_max_bytes"
            )
        return None

    def _full(self) -> bool:
        return self.entries >= self.max_entries or self.bytes >= self.max_bytes

    def _recount(self) -> None:
        """Count the file outbox's results and bytes again (at most every 2 s)."""
        now = time.monotonic()
        if self._counted_at is not None and now - self._counted_at < _RECOUNT_EVERY_S:
            return
        self._counted_at = now
        entries = size = 0
        with contextlib.suppress(OSError), os.scandir(self.folder or ".") as found:
            for item in found:
                if item.name.endswith(".json") and not item.name.startswith("."):
                    entries += 1
                    with contextlib.suppress(OSError):
                        size += item.stat().st_size
        self.entries, self.bytes = entries, size

    # -- the delivery side ------------------------------------------------------------------------

    def kept(self, size: int) -> None:
        """A result of ``size`` bytes went into the outbox."""
        if self._counted_at is None:
            return  # the first count, at the next init, finds it
        self.entries += 1
        self.bytes += size

    def hold(self, rollout_id: str, write: Callable[[], Awaitable[str]]) -> None:
        """Keep a result that could not be written; ``write`` tries again (returns where)."""
        self.held.append(_Held(rollout_id, write))
        logger.critical(
            "rollout %s: the outbox cannot be written; the result is held in memory and written "
            "again every %g s; new inits are refused (503) until it is",
            loggable(rollout_id),
            REWRITE_EVERY_S,
        )
        if self._task is None or self._task.done():
            with contextlib.suppress(RuntimeError):  # no asyncio loop: flush() at shutdown
                self._task = asyncio.get_running_loop().create_task(self._rewrite())

    async def _rewrite(self) -> None:
        while self.held:
            await asyncio.sleep(REWRITE_EVERY_S)
            await self.flush()

    async def flush(self) -> bool:
        """Try every held result once; True when none is left."""
        for held in list(self.held):
            try:
                where = await held.write()
            except Exception as exc:
                logger.debug("rollout %s: outbox still not writable: %s", held.rollout_id, exc)
                continue
            if where:
                self.held.remove(held)
                logger.error(
                    "rollout %s: held result written to the outbox: %s",
                    loggable(held.rollout_id),
                    where,
                )
        return not self.held

    async def close(self) -> bool:
        """At shutdown: one last try for the held results, then stop retrying; True when none
        is left."""
        written = await self.flush()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        return written
