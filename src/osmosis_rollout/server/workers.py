"""``--workers N``: N forked server processes on one listening socket, run and stopped as one.

The parent binds the socket, imports the agent once, then forks; every child accepts from the
same socket (the kernel hands each connection to one of them) and runs its own event loop, app
and lifespan. The parent only supervises: it turns the first SIGTERM or SIGINT into a SIGTERM
for every child (each drains as a single server does), a second into a second SIGTERM (cancel
what still runs), a third into SIGKILL; it restarts a child that dies on its own, and gives up if
children keep dying at start. A child whose parent dies gets SIGTERM (Linux) and drains.

Children ignore SIGINT: a Ctrl-C in a terminal reaches the whole process group, and each child
must see one stop request, from the parent, not two.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from types import FrameType

__all__ = ["die_with_parent", "run_workers"]

logger = logging.getLogger("osmosis_rollout.server")

#: A child that exits within this many seconds of its start counts as failing to start.
_QUICK_DEATH_S = 5.0
_MAX_QUICK_DEATHS = 3


def run_workers(child: Callable[[], None], workers: int) -> int:
    """Fork ``workers`` children that each call ``child()``; supervise them until they stop.

    Returns the exit code for the whole server: 0 after a requested stop, 1 if children kept
    dying on their own.
    """
    supervisor = _Supervisor(child, workers)
    return supervisor.run()


class _Supervisor:
    def __init__(self, child: Callable[[], None], workers: int) -> None:
        self.child = child
        self.workers = workers
        self.children: dict[int, float] = {}  # pid -> start time
        self.signals = 0
        self.quick_deaths = 0
        self.failed = False

    def run(self) -> int:
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            for _ in range(self.workers):
                self._spawn()
            logger.info("started %d workers: %s", self.workers, sorted(self.children))
            self._wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return 1 if self.failed else 0

    def _spawn(self) -> None:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child, which never returns
            _child_main(self.child)
        self.children[pid] = time.monotonic()

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        self.signals += 1
        if self.signals == 1:
            logger.info("stopping %d workers (draining)", len(self.children))
        forwarded = signal.SIGKILL if self.signals >= 3 else signal.SIGTERM
        for pid in list(self.children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, forwarded)

    def _wait(self) -> None:
        while self.children:
            try:
                pid, status = os.wait()
            except ChildProcessError:  # pragma: no cover - nothing left to wait for
                return
            started = self.children.pop(pid, None)
            if started is None:
                continue
            if self.signals or self.failed:
                continue
            code = os.waitstatus_to_exitcode(status)
            how = f"signal {-code}" if code < 0 else f"exit code {code}"
            if time.monotonic() - started < _QUICK_DEATH_S:
                self.quick_deaths += 1
            else:
                self.quick_deaths = 0
            if self.quick_deaths >= _MAX_QUICK_DEATHS:
                logger.error("worker %d died (%s); workers keep dying at start, stopping", pid, how)
                self.failed = True
                self._on_signal(signal.SIGTERM, None)
                continue
            logger.error("worker %d died (%s); starting a new one", pid, how)
            self._spawn()


def _child_main(child: Callable[[], None]) -> None:  # pragma: no cover - in the child
    code = 0
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        child()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def die_with_parent() -> None:  # pragma: no cover - in the child
    """Ask Linux to send SIGTERM when the supervisor dies (elsewhere: nothing to do).

    Called from the child once its server handles SIGTERM (a drain, not a hard stop)."""
    if not sys.platform.startswith("linux"):
        return
    name = ctypes.util.find_library("c")
    if name is None:
        return
    pr_set_pdeathsig = 1
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(name, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)
