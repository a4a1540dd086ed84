"""Worker threads for sync tool calls: ``ToolThreads``.

A toolbox's own small pool, for two reasons. Tools that hang past their timeout must never
starve a shared pool (the server's, anyio's), so the pool counts the calls abandoned at a
timeout and refuses new ones while too many still hold a thread. And the hop must be cheap:
on asyncio a call is one queue hand-off and one ``call_soon_threadsafe`` (~35 us of CPU),
where ``anyio.to_thread`` with a capacity limiter cost ~85 us; a replayed row makes several.
Threads are daemons, so a tool that never returns cannot keep the process from exiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import math
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread

#: An idle worker thread exits after this long without a call.
IDLE_S = 10.0
#: The context of a job on the anyio path, which copies the caller's itself.
_UNUSED = contextvars.Context()


class _Job:
    """One sync call: ``queued`` -> ``running`` -> ``done``; or -> ``abandoned`` (its caller
    gave up while it ran) -> ``done``; or ``queued`` -> ``dropped`` (never runs)."""

    __slots__ = ("context", "fn", "future", "loop", "state")

    def __init__(
        self,
        fn: Callable[[], Any],
        loop: asyncio.AbstractEventLoop | None,
        future: asyncio.Future[Any] | None,
        context: contextvars.Context,
    ) -> None:
        self.fn = fn
        self.loop = loop
        self.future = future
        self.context = context
        self.state = "queued"


def _dropped() -> None:
    """What a dropped call holds instead of its function (and the arguments bound to it)."""


def _carried(error: BaseException) -> BaseException:
    """``error`` as its caller may receive it. A future cannot carry StopIteration; and
    SystemExit, KeyboardInterrupt or CancelledError raised by the tool (in a worker thread they
    cannot mean a signal or a cancellation) would stop the caller's event loop or pass for its
    own cancellation: those arrive as a RuntimeError caused by the original."""
    if isinstance(error, Exception) and not isinstance(error, StopIteration):
        return error
    carried = RuntimeError(f"the tool raised {type(error).__name__}: {error}")
    carried.__cause__ = error
    return carried


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # its caller was cancelled meanwhile: the result is dropped
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(_carried(error))


class ToolThreads:
    """Run sync calls on daemon threads, at most ``limit`` at once.

    Results and exceptions come back as if called inline, in a copy of the caller's context
    variables (as ``anyio.to_thread`` does); see ``_carried`` for the few exceptions that cannot.
    A call whose caller is cancelled while it runs (a timeout) is *abandoned*: its thread runs
    on, its result is dropped, and it stops counting against ``limit``; :attr:`stuck` counts
    them until they return. A call cancelled while still queued never runs. ``limit`` may be
    changed at any time. Works on any asyncio loop (one after another, as tests do); on other
    event loops (trio) through ``anyio.to_thread`` with the same accounting.
    """

    def __init__(self, limit: int) -> None:
        self._limit = _checked(limit)
        self.stuck = 0  # abandoned calls whose thread still runs
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._queue: deque[_Job] = deque()
        self._threads = 0  # live worker threads
        self._waiting = 0  # of which idle, waiting for a call
        self._holding = 0  # calls running and not abandoned: each holds one of `limit` places
        # The non-asyncio path only: places, and anyio threads that no abandoned call can starve.
        self._limiter: anyio.CapacityLimiter | None = None
        self._unlimited: anyio.CapacityLimiter | None = None

    @property
    def limit(self) -> int:
        """At most this many calls run at once (abandoned ones aside)."""
        return self._limit

    @limit.setter
    def limit(self, value: int) -> None:
        with self._lock:
            self._limit = _checked(value)
            for _ in range(min(len(self._queue), value)):  # raised: queued calls start now
                self._wake()
        if self._limiter is not None:
            self._limiter.total_tokens = value

    async def run(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` on a worker thread; its result, or its exception."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not asyncio (trio): anyio's threads, the same accounting
            return await self._run_on_anyio(fn)
        job = _Job(fn, loop, loop.create_future(), contextvars.copy_context())
        try:
            with self._lock:
                self._queue.append(job)
                self._dispatch()
            return await job.future  # type: ignore[misc]
        except BaseException:  # cancelled (or no thread could start): give the call up
            self._abandon(job)
            raise

    async def _run_on_anyio(self, fn: Callable[[], Any]) -> Any:
        if self._limiter is None or self._unlimited is None:
            self._limiter = anyio.CapacityLimiter(self._limit)
            self._unlimited = anyio.CapacityLimiter(math.inf)
        job = _Job(fn, None, None, _UNUSED)  # anyio copies the context
        try:
            # The place is held here, not by the thread: an abandoned call gives it back at once.
            async with self._limiter:
                return await anyio.to_thread.run_sync(
                    self._execute, job, abandon_on_cancel=True, limiter=self._unlimited
                )
        except BaseException:
            self._abandon(job)
            raise

    def _execute(self, job: _Job) -> Any:
        """Run ``job`` on this thread (the anyio path), with the state changes of a worker."""
        with self._lock:
            if job.state == "dropped":
                return None
            job.state = "running"
            self._holding += 1
        try:
            return job.fn()
        except BaseException as exc:
            carried = _carried(exc)
            if carried is exc:
                raise
            raise carried from exc
        finally:
            with self._lock:
                self._finish(job)

    def _abandon(self, job: _Job) -> None:
        with self._lock:
            if job.state == "queued":  # it stays queued until a worker skips it: keep nothing
                job.state = "dropped"
                job.fn, job.context, job.loop, job.future = _dropped, _UNUSED, None, None
            elif job.state == "running":
                job.state = "abandoned"
                self._holding -= 1
                self.stuck += 1
                self._wake()  # its place is free for a queued call

    def _finish(self, job: _Job) -> None:
        """Under the lock: ``job`` returned."""
        if job.state == "abandoned":
            self.stuck -= 1
        else:
            self._holding -= 1
        job.state = "done"

    def _dispatch(self) -> None:
        """Under the lock: wake an idle worker for the queue, or start one if none is idle."""
        if self._waiting:
            self._ready.notify()
        if len(self._queue) > self._waiting and self._threads - self.stuck < self._limit:
            self._threads += 1
            try:
                threading.Thread(target=self._work, name="osmosis-tool", daemon=True).start()
            except BaseException:  # "can't start new thread": a worker not stuck may serve it
                self._threads -= 1
                if self._threads <= self.stuck:
                    raise

    def _wake(self) -> None:
        """Under the lock: ``_dispatch`` for calls already queued; if no thread can start, they
        wait for a worker (or their timeout), and the caller here is not the one to tell."""
        with contextlib.suppress(RuntimeError):
            self._dispatch()

    def _next(self) -> _Job | None:
        """Under the lock: the next call to run, if a place is free."""
        while self._queue and self._holding < self._limit:
            job = self._queue.popleft()
            if job.state == "queued":
                job.state = "running"
                self._holding += 1
                return job
        return None

    def _work(self) -> None:
        """A worker thread: run calls until none comes for ``IDLE_S``."""
        with self._lock:
            while True:
                job = self._next()
                if job is None:
                    self._waiting += 1
                    woken = self._ready.wait(IDLE_S)
                    self._waiting -= 1
                    if not woken and not self._queue:
                        self._threads -= 1
                        return
                    continue
                self._lock.release()
                result: Any = None
                error: BaseException | None = None
                try:
                    result = job.context.run(job.fn)
                except BaseException as exc:  # the caller's to handle, as if called there
                    error = exc
                finally:
                    self._lock.acquire()
                self._finish(job)
                if job.loop is not None and job.future is not None:
                    # RuntimeError: its event loop is closed, so no one is waiting
                    with contextlib.suppress(RuntimeError):
                        job.loop.call_soon_threadsafe(_settle, job.future, result, error)
                del job, result, error  # not kept alive while idle


def _checked(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"max_threads must be a whole number of at least 1, not {limit!r}")
    return limit
