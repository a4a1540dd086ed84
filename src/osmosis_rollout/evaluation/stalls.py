"""The ``event_loop_stall`` finding: an agent that blocks the event loop, named with the line.

Rollouts share one event loop; a ``time.sleep`` or a sync HTTP call in ``async def run`` stops
every other rollout while it runs, and only shows as slower tool or LLM time elsewhere. A
heartbeat callback on the loop marks each time the loop gets round to it; a watchdog thread
that sees the heartbeat late looks at the loop thread's stack every tick: the time up to each
look is the share of the rollout whose code it saw (inside the frame of ``run_rollout``, at the
innermost line of the user's own code), so each rollout that blocked in a late turn is named,
however many did. Shares shorter than ``threshold_s`` are not reported, nor ones in this
library's own code (a first ``ctx.chat`` importing its HTTP client, say), nor once-only waits
in any code (an import, a thread's start, a TLS context's certificates, and the first stall of
a user's line inside a library it calls: the library setting itself up, as the OpenAI Agents
SDK's first ``Runner.run`` does; a blocking call there stalls again and is reported), nor a
turn the loop thread spent mostly waiting for a CPU (a busy machine, not the agent): on Linux
its schedstat splits the turn into running, waiting on the run queue and sleeping, and a stall
counts by what the thread ran or slept.
"""

from __future__ import annotations

import asyncio
import os
import sys
import sysconfig
import threading
import time
from collections import deque
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any

from ..findings import EVENT_LOOP_STALL
from ..testing.records import Finding

__all__ = ["StallMonitor"]

#: A stall at least this long is a finding: ten times a typical mock rollout.
DEFAULT_THRESHOLD_S = 0.2

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LIBRARY_DIRS = tuple(
    {
        os.path.abspath(p)
        for k in ("stdlib", "platstdlib", "purelib", "platlib")
        if (p := sysconfig.get_paths().get(k))
    }
)


@dataclass
class _Stall:
    rollout_id: str
    where: str
    seconds: float = 0.0
    count: int = 0


@dataclass
class _Share:
    """The time of one late turn of the loop that the watchdog saw one rollout's code hold."""

    where: str
    #: Whether that code had called into a library which held the loop.
    in_library: bool
    seconds: float = 0.0


class StallMonitor:
    """Within ``async with StallMonitor():``, find the rollouts that block the loop; each
    rollout's stall becomes one finding through :meth:`take`."""

    def __init__(self, threshold_s: float = DEFAULT_THRESHOLD_S, tick_s: float = 0.02) -> None:
        self.threshold_s = threshold_s
        self.tick_s = tick_s
        self._lock = threading.Lock()
        self._beat_at = time.perf_counter()
        #: The late turn of the loop so far: each rollout's share of it, by the watchdog's
        #: looks (the time up to a look is the rollout's whose code that look saw).
        self._turn: dict[str, _Share] = {}
        self._looked_at = 0.0
        self._last_seen: str | None = None
        #: The user's lines whose call into a library has stalled once: that was its setup.
        self._warmed: set[str] = set()
        self._native_id = 0
        #: (when, the loop thread's (ran, waited) ns, all this process's threads' waited ns).
        self._waits: deque[tuple[float, tuple[int, int], int]] = deque(maxlen=256)
        self._stalls: dict[str, _Stall] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._handle: asyncio.TimerHandle | None = None

    async def __aenter__(self) -> StallMonitor:
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:  # not asyncio (trio): no monitor
            return self
        self._loop_thread = threading.get_ident()
        self._native_id = threading.get_native_id()
        self._beat()
        self._thread = threading.Thread(target=self._watch, name="osmosis-stalls", daemon=True)
        self._thread.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._handle is not None:
            self._handle.cancel()
        if self._thread is not None:
            self._thread.join()

    def take(self, rollout_id: str) -> list[Finding]:
        """The stall finding of ``rollout_id`` (once), or none. Called on the loop, so a stall
        still open (the rollout ended before the heartbeat's next turn) has ended."""
        with self._lock:
            self._close(time.perf_counter())
            stall = self._stalls.pop(rollout_id, None)
        if stall is None:
            return []
        times = f" ({stall.count} stalls, {stall.seconds:.2f} s in all)" if stall.count > 1 else ""
        return [
            Finding(
                EVENT_LOOP_STALL,
                f"the agent blocked the event loop for {stall.seconds:.2f} s at {stall.where}"
                f"{times}: every other rollout waited meanwhile. A blocking call in async code "
                "(time.sleep, a sync HTTP or database client) must be awaited in its async "
                "form or run in a thread (await anyio.to_thread.run_sync(fn))",
                rollout_id,
                details={"stall_s": round(stall.seconds, 3), "where": stall.where},
            )
        ]

    def _beat(self) -> None:
        """On the loop: the heartbeat. A stall reported by the watchdog ends here."""
        now = time.perf_counter()
        with self._lock:
            self._close(now)
            self._beat_at = now
        if not self._stop.is_set() and self._loop is not None:
            self._handle = self._loop.call_later(self.tick_s, self._beat)

    def _close(self, now: float) -> None:
        """Under the lock, on the loop: the late turn the watchdog looked at has ended at
        ``now``. Each rollout that held the loop ``threshold_s`` or more of it stalled: one
        rollout's ``time.sleep``, or each of several rollouts' in one turn (six rollouts each
        sleeping 0.3 s before their first ``ctx.chat`` hold one turn for 1.8 s). Many rollouts
        each doing a little in one turn (a loaded machine) are no one's stall."""
        turn, self._turn = self._turn, {}
        last, self._last_seen = self._last_seen, None
        if not turn:
            return
        if last is not None and last in turn:  # it held the loop from the last look until now
            turn[last].seconds += max(0.0, now - self._looked_at)
        stalled = {rid: share for rid, share in turn.items() if share.seconds >= self.threshold_s}
        if stalled and not self._queued(now - self._beat_at - self.tick_s):
            for rid, share in stalled.items():
                if share.in_library and share.where not in self._warmed:
                    self._warmed.add(share.where)  # a library's first call here: its setup
                    continue
                stall = self._stalls.setdefault(rid, _Stall(rid, share.where))
                stall.count += 1
                stall.seconds += share.seconds
        self._beat_at = now  # the next stall is counted from here

    def _queued(self, seconds: float) -> bool:
        """Whether the stall was the machine's doing: the loop thread neither ran nor slept for
        ``threshold_s`` of it, or waited for a CPU longer than it ran and slept, or it slept
        while this process's threads spent at least half that time waiting for a CPU (the loop
        waited on the GIL or on a thread it started, whose holder was itself waiting)."""
        before = [(times, all_) for when, times, all_ in self._waits if when <= self._beat_at]
        now = _sched_times(self._native_id)
        if not before or now is None:
            return False
        (then, then_all) = before[-1]
        ran = (now[0] - then[0]) / 1e9
        waited = (now[1] - then[1]) / 1e9
        slept = seconds - ran - waited
        if max(ran, slept) < self.threshold_s or waited > ran + slept:
            # Mostly waiting for a CPU: on a loaded machine even a library's first call (the
            # openai client's, 0.3 s of CPU at load 8 against none seen idle) stretches past
            # the threshold; what the agent itself held the loop for is the smaller part.
            return True
        others_waited = (_process_wait() - then_all) / 1e9 - waited
        return ran < self.threshold_s and others_waited >= slept / 2

    def _watch(self) -> None:
        """In the watchdog thread: when the heartbeat is late, whose code holds the loop."""
        while not self._stop.wait(self.tick_s):
            wait = _sched_times(self._native_id)
            everyone = _process_wait() if wait is not None else 0
            with self._lock:
                if wait is not None:
                    self._waits.append((time.perf_counter(), wait, everyone))
                beat_at = self._beat_at
            late = time.perf_counter() - beat_at - self.tick_s
            if late < self.tick_s:
                continue
            frame = sys._current_frames().get(self._loop_thread)
            found = _rollout_frame(frame) if frame is not None else None
            now = time.perf_counter()
            with self._lock:
                if self._beat_at == beat_at:  # else the loop came back meanwhile
                    self._look(beat_at, found, now)

    def _look(self, beat_at: float, found: tuple[str, str, bool] | None, now: float) -> None:
        """Under the lock: a look at ``now`` at the loop, late since ``beat_at``, holding
        ``found``: the time since the last look (or since the heartbeat was due) is that
        rollout's share of the turn; none's when the look saw no rollout's code (this
        library's, the event loop's)."""
        since = max(self._looked_at, beat_at + self.tick_s)  # looks of past turns came before
        self._looked_at = now
        self._last_seen = found[0] if found is not None else None
        if found is None:
            return
        share = self._turn.setdefault(found[0], _Share(found[1], found[2]))
        share.seconds += max(0.0, now - since)


def _rollout_frame(top: FrameType) -> tuple[str, str, bool] | None:
    """``(rollout id, "file:line in function", inside a library)`` when the stack is inside a
    rollout and the innermost frame of ours or the user's is the user's (not, say, ``ctx.chat``
    importing); inside a library when that frame called into a library that holds the loop."""
    from ..rollout import run_rollout

    where: FrameType | None = None
    frame: FrameType | None = top
    while frame is not None:
        if frame.f_code is run_rollout.__code__:
            request: Any = frame.f_locals.get("request")
            if request is None or where is None:
                return None
            name = os.path.basename(where.f_code.co_filename)
            line = f"{name}:{where.f_lineno} in {where.f_code.co_name}"
            return str(request.rollout_id), line, where is not top
        if _handing_over(frame):
            return None  # importing once, or starting a worker thread: the loop waited its turn
        if where is None:
            owner = _owner(frame.f_code.co_filename)
            if owner == "ours":
                return None  # this library's own work, whoever called it
            if owner == "user":
                where = frame
        frame = frame.f_back
    return None


#: ``ssl.py``'s functions that read the system's CA certificates: what an HTTP client does once,
#: when it is made (measured: 0.27 s on a loaded 2-core machine under the OpenAI Agents SDK's
#: first ``Runner.run``, which builds its trace exporter's client even with tracing disabled).
_CERTIFICATE_LOADING = frozenset({"create_default_context", "load_default_certs"})


def _handing_over(frame: FrameType) -> bool:
    """Whether the frame is a once-only wait, not code that blocks the loop each time it runs:
    the import system (a module's first use), ``Thread.start`` (``asyncio.to_thread``'s first
    call: the new thread waiting for a CPU on a busy machine, measured 0.65 s under the openai
    client's first call on a loaded 2-core machine) or reading the CA certificates for a new
    HTTP client's TLS context."""
    code = frame.f_code
    if code.co_filename.startswith("<frozen importlib"):
        return True
    if code.co_filename.endswith(f"{os.sep}ssl.py"):
        return code.co_name in _CERTIFICATE_LOADING
    return code.co_name == "start" and code.co_filename.endswith(f"{os.sep}threading.py")


def _process_wait() -> int:
    """How long (ns) all of this process's threads have waited on a run queue (schedstat)."""
    total = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/schedstat", "rb") as stat:
                total += int(stat.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total


def _sched_times(native_id: int) -> tuple[int, int] | None:
    """How long (ns) the thread has run, and waited on a run queue for a CPU, where the system
    says (Linux's schedstat), else None."""
    try:
        with open(f"/proc/self/task/{native_id}/schedstat", "rb") as stat:
            fields = stat.read().split()
        return int(fields[0]), int(fields[1])
    except (OSError, IndexError, ValueError):
        return None


def _owner(filename: str) -> str:
    """Whose code a frame runs: ``"ours"`` (this library), ``"library"`` (the standard library
    or an installed package) or ``"user"``."""
    path = os.path.abspath(filename)
    if path.startswith(_PACKAGE_DIR + os.sep):
        return "ours"
    if filename.startswith("<") or any(path.startswith(d + os.sep) for d in _LIBRARY_DIRS):
        return "library"
    return "user"
