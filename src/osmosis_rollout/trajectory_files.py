"""Where ATIF trajectories go on disk: ``<root>/<safe rollout id>/trajectory.json``.

The layout is the Osmosis platform's artifact root (``_OSMOSIS_ROLLOUT_ARTIFACT_ROOT``), whose
runner waits for each rollout's ``trajectory.json``; ``osmosis test --trajectories DIR`` writes
the same layout. Folder names follow the trace rule (``tracing.safe_name``): an id such as
``../x`` can never leave the root. Each file is written whole (a temporary file renamed into
place, so a reader polling for it never sees half a document) with mode 0600, its folder 0700:
a trajectory holds the whole conversation. Building and writing happen on one background
thread, so a slow disk never stalls the event loop, and a failure is logged (scrubbed), never
raised: a trajectory is a record of the rollout, not part of its result.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import stat
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from .atif import encode_trajectory
from .redaction import loggable, scrub
from .tracing import safe_name

__all__ = ["FILE_NAME", "TrajectoryFiles"]

logger = logging.getLogger("osmosis_rollout.trajectories")

#: The file name the platform's runner reads in each rollout's folder.
FILE_NAME = "trajectory.json"
_FILE_MODE = 0o600
_DIR_MODE = 0o700
_counter = itertools.count()

Job = tuple[str, Callable[[], Mapping[str, Any]], list[str]]


class TrajectoryFiles:
    """Writes each rollout's ``trajectory.json`` under ``root``, in order, off the caller's
    thread. ``close()`` waits until everything submitted is on disk."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()
        self._queue: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        #: How many documents were written, how many failed, and why the last one did (scrubbed).
        self.written = 0
        self.failed = 0
        self.last_error: str | None = None

    def path_for(self, rollout_id: str) -> Path:
        """Where the trajectory of ``rollout_id`` goes (always one folder below the root)."""
        folder = self.root / safe_name(rollout_id)
        if folder.parent != self.root:  # defence in depth; safe_name prevents it
            raise ValueError("unsafe trajectory path")
        return folder / FILE_NAME

    def submit(
        self,
        rollout_id: str,
        build: Callable[[], Mapping[str, Any]],
        secrets: Iterable[str | None] = (),
    ) -> None:
        """Build (``build()``) and write the document of ``rollout_id`` on the writer thread;
        ``secrets`` are scrubbed from it."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._write_loop, name="osmosis-trajectories", daemon=True
                )
                self._thread.start()
        self._queue.put((rollout_id, build, [s for s in secrets if s]))

    def write(
        self,
        rollout_id: str,
        document: Mapping[str, Any],
        secrets: Iterable[str | None] = (),
    ) -> Path:
        """Write one document now, on this thread; raises ``OSError`` when it cannot."""
        hidden = [s for s in secrets if s]
        path = self.path_for(rollout_id)
        _write_whole(path, encode_trajectory(document, hidden))
        return path

    def _write_loop(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            rollout_id, build, secrets = job
            try:
                self.write(rollout_id, build(), secrets)
            except Exception as exc:  # a record, never a failure of the rollout
                self.failed += 1
                text = f"{type(exc).__name__}: {exc}"
                for secret in secrets:
                    text = scrub(text, secret)
                self.last_error = text
                logger.error(
                    "could not write the trajectory of rollout %s: %s",
                    loggable(rollout_id),
                    loggable(text),
                )
            else:
                self.written += 1

    def close(self) -> None:
        """Write everything submitted, then stop the writer thread."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join()


def _write_whole(path: Path, data: bytes) -> None:
    """``data`` into ``path`` through a temporary file in the same folder, renamed into place;
    the folder is made (0700) if missing and must not be a symbolic link."""
    folder = path.parent
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        folder.mkdir(mode=_DIR_MODE)
    except FileExistsError:
        if stat.S_ISLNK(os.lstat(folder).st_mode) or not folder.is_dir():
            raise OSError(f"{folder.name} is not a plain folder") from None
    temporary = folder / f".{FILE_NAME}.{os.getpid()}.{next(_counter)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(temporary, flags, _FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
