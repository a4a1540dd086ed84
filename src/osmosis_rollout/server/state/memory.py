"""``MemoryState``: the shared state of a single process, in dicts; the outbox is files on disk.

This is the default and needs nothing installed. It is exact for one process; with several
workers each has its own copy, so a retried init that lands on another worker starts again
(``osmosis serve --workers`` warns about it). Undeliverable callbacks are JSON files (see
``server/outbox.py``) that survive the process; they are replayed with ``osmosis outbox replay``,
not automatically, because the files do not keep the per-rollout key.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import anyio.to_thread

from ...protocol import RolloutResponse
from ..outbox import write_outbox
from .base import (
    BODY_CHANGED,
    ID_RUNNING,
    KEY_REUSED,
    Claim,
    ClaimOutcome,
    LeasedRollout,
    OutboxEntry,
    StateBackend,
)

__all__ = ["MemoryState", "read_outbox_dir"]


@dataclass
class _Record:
    rollout_id: str
    digest: str
    expires_at: float | None  # monotonic; None while the rollout runs
    status: int = 0  # 0 while pending
    body: bytes = b""


class MemoryState(StateBackend):
    """Claims, admission and leases in this process; the outbox in ``outbox_dir``."""

    name = "memory"
    shared = False

    def __init__(self, outbox_dir: Path) -> None:
        self.outbox_dir = outbox_dir
        self._records: dict[str, _Record] = {}
        self._running: dict[str, str] = {}  # rollout_id -> key, from claim to finish
        self._leases: dict[str, tuple[LeasedRollout, float]] = {}
        self._queued: dict[str, int] = {}

    def describe(self) -> str:
        """``memory (outbox: DIR)``."""
        return f"memory (outbox: {self.outbox_dir})"

    async def ping(self) -> bool:
        """Always reachable."""
        return True

    def expire(self) -> int:
        """Drop records past their TTL; returns how many."""
        now = time.monotonic()
        stale = [k for k, r in self._records.items() if _lapsed(r, now)]
        for key in stale:
            self._drop(key)
        return len(stale)

    def _drop(self, key: str) -> None:
        record = self._records.pop(key, None)
        if record is not None and self._running.get(record.rollout_id) == key:
            del self._running[record.rollout_id]

    # -- idempotency ----------------------------------------------------------------------------

    async def claim_init(
        self, key: str, rollout_id: str, digest: str, *, pending_ttl_s: float
    ) -> Claim:
        """See ``StateBackend.claim_init``."""
        now = time.monotonic()
        record = self._records.get(key)
        if record is not None and _lapsed(record, now):
            self._drop(key)
            record = None
        if record is not None:
            if record.rollout_id != rollout_id:
                return Claim(ClaimOutcome.CONFLICT, detail=KEY_REUSED)
            if record.digest != digest:
                return Claim(ClaimOutcome.CONFLICT, detail=BODY_CHANGED)
            if record.status == 0:
                return Claim(ClaimOutcome.PENDING)
            return Claim(ClaimOutcome.ANSWERED, status=record.status, body=record.body)
        if rollout_id in self._running:
            return Claim(ClaimOutcome.CONFLICT, detail=ID_RUNNING)
        self._records[key] = _Record(rollout_id, digest, now + pending_ttl_s)
        self._running[rollout_id] = key
        return Claim(ClaimOutcome.CLAIMED)

    async def release_init(self, key: str, rollout_id: str) -> None:
        """See ``StateBackend.release_init``."""
        record = self._records.get(key)
        if record is not None and record.rollout_id == rollout_id:
            self._drop(key)

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
        """See ``StateBackend.accept``."""
        if queue:
            if sum(self._queued.values()) >= max_queued:
                return False
            self._queued[replica] = self._queued.get(replica, 0) + 1
        now = time.monotonic()
        record = self._records.get(lease.key)
        if record is None:  # lapsed while get_tools ran: claim it again
            record = self._records[lease.key] = _Record(lease.rollout_id, digest, None)
            self._running[lease.rollout_id] = lease.key
        record.status, record.body, record.expires_at = status, body, None
        self._leases[lease.key] = (lease, now + lease_ttl_s)
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

    async def finish(self, key: str, rollout_id: str, record_ttl_s: float) -> None:
        """See ``StateBackend.finish``."""
        self._leases.pop(key, None)
        record = self._records.get(key)
        if record is not None and record.rollout_id == rollout_id:
            record.expires_at = time.monotonic() + record_ttl_s
        if self._running.get(rollout_id) == key:
            del self._running[rollout_id]

    async def claim_orphans(self, limit: int, record_ttl_s: float) -> list[LeasedRollout]:
        """See ``StateBackend.claim_orphans``."""
        now = time.monotonic()
        taken: list[LeasedRollout] = []
        for key, (lease, until) in list(self._leases.items()):
            if len(taken) >= limit:
                break
            if until < now:
                del self._leases[key]
                if self._running.get(lease.rollout_id) == key:
                    del self._running[lease.rollout_id]
                record = self._records.get(key)
                if record is not None:
                    record.expires_at = now + record_ttl_s
                taken.append(lease)
        return taken

    # -- outbox: files --------------------------------------------------------------------------

    async def outbox_put(self, entry: OutboxEntry) -> str:
        """Write one JSON file (without the api_key); returns its path."""
        response = RolloutResponse.model_validate(entry.response)
        path = await anyio.to_thread.run_sync(
            write_outbox, self.outbox_dir, entry.server_url, response, entry.error, entry.api_key
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


def _record_attempt(path: Path, attempts: int, error: str) -> None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    data["error"] = error
    data["attempts"] = attempts + 1
    tmp = path.with_name(f".tmp-{path.name}")
    tmp.write_text(json.dumps(data, ensure_ascii=False, indent=1), encoding="utf-8")
    tmp.replace(path)


def _lapsed(record: _Record, now: float) -> bool:
    return record.expires_at is not None and record.expires_at < now


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
