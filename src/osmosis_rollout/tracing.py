"""Per-rollout JSONL debug traces: ``<debug_dir>/<safe rollout id>.jsonl``.

Writes happen on one background thread, in order, so a slow disk never blocks the event loop.
File names are made safe (a rollout id like ``../x`` can never leave the directory), and secrets
are removed twice: by key name (``api_key``, ``authorization``...) and by value. Every record
carries the format version ``v`` (``TRACE_VERSION``); docs/traces.md describes the events.
"""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import re
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .private_files import open_private
from .redaction import REDACTED, scrub, scrub_data

__all__ = [
    "MAX_TRACED_TEXT",
    "TRACE_VERSION",
    "Tracer",
    "clip_text",
    "file_sink",
    "is_secret_key",
    "safe_name",
    "safe_trace_name",
    "secret_free_json",
]

logger = logging.getLogger("osmosis_rollout.tracing")

_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_UNSAFE_CHARS = re.compile(r"[^A-Za-z0-9_-]+")
#: Device names Windows reserves with any extension (``con.jsonl`` is the console).
_RESERVED = re.compile(r"(con|prn|aux|nul|com[0-9]|lpt[0-9])(\..*)?", re.IGNORECASE)
#: The suffix hashed names end with; a plain id ending so could collide with one.
_HASH_SUFFIX = re.compile(r".*-[0-9a-f]{16}")
#: The trace format's version, written into every record as ``"v"``; bumped on breaking changes.
TRACE_VERSION = 2
#: Tool results (and other free text) longer than this are cut in traces; the full length is kept.
MAX_TRACED_TEXT = 4096
_SECRET_KEYS = frozenset({"api_key", "apikey", "authorization", "x-api-key", "password", "token"})


def safe_name(rollout_id: str) -> str:
    """A file or folder name for a rollout id that cannot escape its directory.

    Plain ids (letters, digits, ``._-``, not starting with a dot) are kept as they are; anything
    else (and plain ids that look like a hashed name or a Windows device name) is reduced to
    ``[A-Za-z0-9_-]`` and suffixed with a hash so distinct ids stay distinct. Traces
    (``<name>.jsonl``) and ATIF trajectories (``<name>/trajectory.json``) share the rule.
    """
    if (
        _SAFE.fullmatch(rollout_id)
        and ".." not in rollout_id
        and not _RESERVED.fullmatch(rollout_id)
        and not _HASH_SUFFIX.fullmatch(rollout_id)
    ):
        return rollout_id
    stem = _UNSAFE_CHARS.sub("_", rollout_id).strip("_-")[:80] or "rollout"
    digest = hashlib.sha256(rollout_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{stem}-{digest}"


def safe_trace_name(rollout_id: str) -> str:
    """The trace file name (without directory) of a rollout id: ``safe_name(id) + ".jsonl"``."""
    return f"{safe_name(rollout_id)}.jsonl"


def clip_text(text: str, limit: int = MAX_TRACED_TEXT) -> tuple[str, int | None]:
    """``text`` cut to ``limit`` characters, and its full length when it was cut (else None).

    Traces keep what a person needs to debug a turn without growing with every huge tool output.
    """
    if len(text) <= limit:
        return text, None
    return text[:limit], len(text)


#: Leaf types that need no look inside: tested inline, so a list of 2,000 token ids or logprobs
#: costs no Python call per number (recording a cassette spent most of its extra CPU there).
_LEAVES = frozenset({str, int, float, bool, type(None)})


def _redact(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: (REDACTED if is_secret_key(k) else v if type(v) in _LEAVES else _redact(v))
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [v if type(v) in _LEAVES else _redact(v) for v in value]
    return value


def is_secret_key(name: object) -> bool:
    """Whether a value under the key ``name`` (``api_key``, ``authorization``, ``password``,
    ``token``...) is written as ``**********``, in traces and ATIF trajectories alike."""
    return str(name).lower() in _SECRET_KEYS


def secret_free_json(record: dict[str, Any], secrets: Iterable[str] = ()) -> str:
    """One JSON line of ``record`` with secrets removed: values under secret-looking keys and
    every form of each string in ``secrets`` become ``**********`` (debug traces, cassettes)."""
    hidden = [s for s in secrets if s]
    data: Any = _redact(record)
    for secret in hidden:  # before encoding, then after (default=str may reveal more)
        data = scrub_data(data, secret)
    line = json.dumps(data, default=str, ensure_ascii=False)
    for secret in hidden:
        line = scrub(line, secret)
    return line


def _encode(event: dict[str, Any], secrets: list[str]) -> str:
    return secret_free_json({"v": TRACE_VERSION, "ts": round(time.time(), 6), **event}, secrets)


def file_sink(
    debug_dir: str | Path, rollout_id: str, secrets: Iterable[str | None] = ()
) -> Callable[[dict[str, Any]], None]:
    """A synchronous sink for one rollout outside a server (the legacy ``RolloutContext(...,
    _debug_dir=...)``): each event is on disk when the call returns. A directory or file that
    cannot be written logs a warning and the event is dropped; the agent never fails for it."""
    hidden = [s for s in secrets if s]
    directory = Path(debug_dir)

    def emit(event: dict[str, Any]) -> None:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            with open_private(directory / safe_trace_name(rollout_id)) as fh:
                fh.write(_encode(event, hidden) + "\n")
        except OSError as exc:
            logger.warning("could not write debug event to %s: %s", directory, exc)

    return emit


class Tracer:
    """Appends events to per-rollout JSONL files from a single writer thread.

    ``close()`` waits until everything queued is on disk; call it on shutdown.
    """

    def __init__(self, debug_dir: str | Path, *, secrets: Iterable[str | None] = ()) -> None:
        self.directory = Path(debug_dir).resolve()
        #: Scrubbed from every trace besides each rollout's own key (``osmosis test``'s LLM key).
        self.secrets = [s for s in secrets if s]
        self.directory.mkdir(parents=True, exist_ok=True)
        self._queue: queue.SimpleQueue[tuple[Path, str] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def path_for(self, rollout_id: str) -> Path:
        """Where the trace of ``rollout_id`` goes (always inside the debug directory)."""
        path = (self.directory / safe_trace_name(rollout_id)).resolve()
        if path.parent != self.directory:  # defence in depth; safe_trace_name prevents it
            raise ValueError("unsafe trace path")
        return path

    def sink(
        self, rollout_id: str, secrets: Iterable[str | None] = ()
    ) -> Callable[[dict[str, Any]], None]:
        """A callable that records one event dict for ``rollout_id``, scrubbing ``secrets``."""
        path = self.path_for(rollout_id)
        hidden = [s for s in secrets if s] + self.secrets

        def emit(event: dict[str, Any]) -> None:
            self._put(path, _encode(event, hidden))

        return emit

    def _put(self, path: Path, line: str) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._write_loop, name="osmosis-tracer", daemon=True
                )
                self._thread.start()
        self._queue.put((path, line))

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            path, line = item
            try:
                with open_private(path) as fh:
                    fh.write(line + "\n")
            except OSError as exc:
                logger.error("could not write debug trace %s: %s", path, exc)

    def close(self) -> None:
        """Flush queued events and stop the writer thread."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join()
