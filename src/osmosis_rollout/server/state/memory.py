"""``MemoryState``: the shared state of a single process, in dicts; the outbox is files on disk.

This is the default and needs nothing installed. Idempotency records are the server's own
registry (compact, capped; see ``server/registry.py``); this backend holds the queue count, the
leases and the outbox. It is exact for one process; with several workers each has its own copy,
so a retried init that lands on another worker starts again (``--workers`` warns about it).
Undeliverable callbacks are JSON files that survive the process (``write_outbox`` and
``read_outbox_dir`` below: the file outbox's format in one place); they are replayed with
``osmosis outbox replay``, not automatically, because the files do not keep the per-rollout key.

One JSON file per undelivered callback, ``<rollout id>.<UTC time>.<random>.json``:
``{"server_url", "error", "written_at", "response"}``, plus ``"protocol"`` and ``"route"`` for a
v2 rollout (its callback URLs and which of its two callbacks are still to deliver). The
per-rollout ``api_key`` is never written, in any form (raw, JSON-, repr- or URL-escaped),
wherever the agent or TrainGate put it; whoever replays a file supplies it again.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio.to_thread

from ...private_files import write_private
from ...protocol import RolloutResponse, wire
from ...redaction import redact_url, scrub_data
from ...tracing import safe_trace_name
from .base import (
    LEGACY_PROTOCOL,
    Claim,
    ClaimOutcome,
    LeasedRollout,
    OutboxEntry,
    StateBackend,
)

__all__ = ["MemoryState", "read_outbox_dir", "write_outbox"]


class MemoryState(StateBackend):
    """Claims, admission and leases in this process; the outbox in ``outbox_dir``."""

    name = "memory"
    shared = False

    def __init__(self, outbox_dir: Path) -> None:
        self.outbox_dir = outbox_dir
        self._leases: dict[str, tuple[LeasedRollout, float]] = {}
        self._queued: dict[str, int] = {}

    def describe(self) -> str:
        """``memory (outbox: DIR)``."""
        return f"memory (outbox: {self.outbox_dir})"

    async def ping(self) -> bool:
        """Always reachable."""
        return True

    # -- idempotency: the server's registry is this process's record -----------------------------

    async def claim_init(
        self, key: str, rollout_id: str, digest: str, *, pending_ttl_s: float
    ) -> Claim:
        """Always the caller's: with one process, the server's registry (which keeps compact
        records for the TTL) has already answered duplicates and conflicts."""
        return Claim(ClaimOutcome.CLAIMED)

    async def release_init(self, key: str, rollout_id: str) -> None:
        """Nothing to release (see ``claim_init``)."""

    async def accept(
        self,
        lease: LeasedRollout,
        *,
        digest: str,
        replica: str,
        status: int,
        body: bytes,
        lease_ttl_s: float,
        queue: bool,
        max_queued: int,
    ) -> bool:
        """Take a queue place (if asked and free) and the lease; the record is the registry's."""
        if queue:
            if sum(self._queued.values()) >= max_queued:
                return False
            self._queued[replica] = self._queued.get(replica, 0) + 1
        self._leases[lease.key] = (lease, time.monotonic() + lease_ttl_s)
        return True

    async def unqueue(self, replica: str) -> None:
        """See ``StateBackend.unqueue``."""
        if self._queued.get(replica, 0) > 0:
            self._queued[replica] -= 1

    async def queued(self) -> int:
        """Rollouts waiting for a slot in this process."""
        return sum(self._queued.values())

    # -- leases ---------------------------------------------------------------------------------

    async def renew(self, replica: str, keys: list[str], lease_ttl_s: float) -> None:
        """See ``StateBackend.renew``."""
        until = time.monotonic() + lease_ttl_s
        for key in keys:
            held = self._leases.get(key)
            if held is not None:
                self._leases[key] = (held[0], until)

    async def hold(self, key: str, lease_ttl_s: float) -> bool:
        """See ``StateBackend.hold``."""
        held = self._leases.get(key)
        if held is None:
            return False
        self._leases[key] = (held[0], time.monotonic() + lease_ttl_s)
        return True

    async def update_lease(self, lease: LeasedRollout) -> None:
        """See ``StateBackend.update_lease``."""
        held = self._leases.get(lease.key)
        if held is not None:
            self._leases[lease.key] = (lease, held[1])

    async def finish(self, key: str, rollout_id: str, record_ttl_s: float) -> None:
        """Drop the lease."""
        self._leases.pop(key, None)

    async def claim_orphans(self, limit: int, record_ttl_s: float) -> list[LeasedRollout]:
        """See ``StateBackend.claim_orphans``."""
        now = time.monotonic()
        taken: list[LeasedRollout] = []
        for key, (lease, until) in list(self._leases.items()):
            if len(taken) >= limit:
                break
            if until < now:
                del self._leases[key]
                taken.append(lease)
        return taken

    # -- outbox: files --------------------------------------------------------------------------

    async def outbox_put(self, entry: OutboxEntry) -> str:
        """Write one JSON file (without the api_key); returns its path."""
        response = RolloutResponse.model_validate(entry.response)
        path = await anyio.to_thread.run_sync(
            functools.partial(
                write_outbox,
                self.outbox_dir,
                entry.server_url,
                response,
                entry.error,
                entry.api_key,
                protocol=entry.protocol,
                route=entry.route,
            )
        )
        return str(path)

    async def outbox_list(self) -> list[OutboxEntry]:
        """Every file in the outbox directory, oldest first."""
        return await anyio.to_thread.run_sync(read_outbox_dir, self.outbox_dir)

    async def outbox_due(self, limit: int, visibility_s: float) -> list[OutboxEntry]:
        """Nothing: files are replayed by ``osmosis outbox replay``, which supplies the key."""
        return []

    async def outbox_done(self, entry: OutboxEntry) -> None:
        """Delete the file."""
        await anyio.to_thread.run_sync(Path(entry.location).unlink, True)

    async def outbox_retry(self, entry: OutboxEntry, delay_s: float | None, error: str) -> None:
        """Record the attempt in the file (kept for the next replay)."""
        await anyio.to_thread.run_sync(_record_attempt, Path(entry.location), entry.attempts, error)


def write_outbox(
    directory: Path,
    server_url: str,
    response: RolloutResponse,
    error: str,
    secret: str | None = None,
    *,
    protocol: str,
    route: dict[str, Any] | None = None,
) -> Path:
    """Atomically write one undelivered callback, ``secret`` scrubbed; returns the file's path."""
    directory.mkdir(parents=True, exist_ok=True)
    # Unique per write: a rollout id reused later must not overwrite an undelivered result.
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    stem = safe_trace_name(response.rollout_id).removesuffix(".jsonl")
    target = directory / f"{stem}.{stamp}.{secrets.token_hex(3)}.json"
    data: dict[str, Any] = {
        "server_url": redact_url(server_url),  # a password in it never reaches a file
        "error": error,
        "written_at": time.time(),
        "response": wire(response),
        "protocol": protocol,  # always named: a reader never has to guess the wire
    }
    if route is not None:
        data["route"] = route
    record = scrub_data(data, secret)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(record, fh, ensure_ascii=False, indent=1)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def _record_attempt(path: Path, attempts: int, error: str) -> None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    data["error"] = error
    data["attempts"] = attempts + 1
    write_private(path, json.dumps(data, ensure_ascii=False, indent=1))


def read_outbox_dir(directory: Path) -> list[OutboxEntry]:
    """The outbox files in ``directory`` as entries, oldest first; unreadable files are skipped
    with their error as the entry's ``error`` so that ``list`` still shows them."""
    if not directory.is_dir():
        return []
    entries: list[OutboxEntry] = []
    for path in sorted(directory.glob("*.json")):
        if path.name.startswith(".tmp-"):
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            response = data["response"]
            entries.append(
                OutboxEntry(
                    id=path.name,
                    rollout_id=str(response["rollout_id"]),
                    server_url=str(data["server_url"]),
                    error=str(data.get("error", "")),
                    written_at=float(data.get("written_at", path.stat().st_mtime)),
                    response=dict(response),
                    attempts=int(data.get("attempts", 0)),
                    location=str(path),
                    protocol=str(data.get("protocol", LEGACY_PROTOCOL)),
                    route=dict(data["route"]) if data.get("route") else None,
                )
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            entries.append(
                OutboxEntry(
                    id=path.name,
                    rollout_id="?",
                    server_url="",
                    error=f"unreadable outbox file: {type(exc).__name__}: {exc}",
                    written_at=0.0,
                    response={},
                    location=str(path),
                )
            )
    entries.sort(key=lambda e: e.written_at)
    return entries
