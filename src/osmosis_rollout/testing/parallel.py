"""``osmosis test --jobs N``: the rows of one batch run by N worker processes.

A batch through the in-process pipeline (mock LLM or ``--replay``) is CPU-bound Python, so one
process uses one core. Rows are independent; each worker (a ``spawn``-ed process: never a fork
of a process with an event loop and threads) loads the agent from its ``TARGET`` string, builds
its own backend and :class:`Harness` from a :class:`WorkerSpec`, and runs rows with
``--concurrency`` rollouts at once.

The parent hands rows out on request, in chunks that shrink as the batch drains, so a slow
worker never holds rows another could run; it reads every result back as a
:class:`~.runner.RowResult` and owns everything the user sees. It knows which rows each worker
holds: when a worker dies (killed, crashed, its agent failed to import), those rows end as
``ERROR`` rows that say so, and the others go on. Workers ignore SIGINT and SIGTERM (a Ctrl-C
reaches the whole process group; the parent decides), are killed by the parent when the batch
ends or is interrupted, and exit on their own when the parent goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import sys
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Literal

from .runner import BatchReport, RowInput, RowResult, RunOptions

__all__ = ["BackendSpec", "WorkerPool", "WorkerSpec", "cpu_count"]

#: Seconds a worker is given to exit after its pipes close, before it is killed.
_STOP_GRACE_S = 2.0


def cpu_count() -> int:
    """The CPUs this process may run on (``--jobs auto``): its affinity mask where known."""
    counter = getattr(os, "process_cpu_count", None)  # 3.13+
    if counter is not None:
        return int(counter() or 1)
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


@dataclass(frozen=True)
class BackendSpec:
    """How a worker builds its LLM backend: the same CLI options, rebuilt in each process.

    The API key is never part of it: an ``openai`` worker reads ``OPENAI_API_KEY`` from the
    environment it inherits, like the parent would.
    """

    kind: Literal["mock", "openai", "replay"] = "mock"
    seed: int = 0
    base_url: str | None = None
    model: str | None = None
    timeout_s: float = 120.0
    cassette: Path | None = None
    replay_mode: Literal["strict", "lenient"] = "strict"

    def build(self) -> Any:
        """A fresh backend of this kind (a replay reads the cassette itself)."""
        if self.kind == "replay":
            from .replay import ReplayBackend

            assert self.cassette is not None
            return ReplayBackend(self.cassette, mode=self.replay_mode)
        if self.kind == "openai":
            from .backends import OpenAICompatibleBackend

            return OpenAICompatibleBackend.from_env(
                os.environ, base_url=self.base_url, model=self.model, timeout_s=self.timeout_s
            )
        from .backends import MockLLMBackend

        return MockLLMBackend(seed=self.seed)


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs to run rows exactly as the parent would in process."""

    target: str
    backend: BackendSpec
    options: RunOptions
    debug_dir: str | None = None
    verbose: bool = False
    #: Shared by every worker: rollout ids read ``row-<n>-<run_id>`` as with one process.
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])


@dataclass
class _Worker:
    """The parent's view of one worker: its process, pipes, and the rows it holds."""

    number: int
    process: Any  # multiprocessing.context.SpawnProcess
    tasks: Connection  # parent -> worker: chunks of (position, row); [] when no rows are left
    results: Connection  # worker -> parent: messages
    held: dict[int, RowInput] = field(default_factory=dict)
    failure: str | None = None
    reader: threading.Thread | None = None


class WorkerPool:
    """Run a batch's rows in ``jobs`` worker processes; see the module docstring.

    ``notify`` is called with a one-line message when a worker dies, for the user to see.
    After :meth:`run`, ``max_in_flight`` is the sum of the workers' most LLM turns in flight
    at once (an OpenAI-compatible server saw up to that many).
    """

    def __init__(
        self, spec: WorkerSpec, jobs: int, *, notify: Callable[[str], None] | None = None
    ) -> None:
        self.spec = spec
        self.jobs = max(1, jobs)
        self.notify = notify or (lambda message: None)
        self.max_in_flight = 0

    async def run(
        self, rows: Sequence[RowInput], *, on_result: Callable[[RowResult], None] | None = None
    ) -> BatchReport:
        """Run every row; results keep dataset order, as :func:`~.runner.run_batch`'s do."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        inbox: asyncio.Queue[tuple[_Worker, tuple[Any, ...]]] = asyncio.Queue()
        pending: deque[tuple[int, RowInput]] = deque(enumerate(rows))
        results: dict[int, RowResult] = {}
        stopped: list[str] = []
        concurrency = max(1, self.spec.options.concurrency)

        def finish(position: int, result: RowResult) -> None:
            results[position] = result
            if on_result is not None:
                on_result(result)

        workers: list[_Worker] = []
        try:
            for number in range(1, min(self.jobs, max(1, len(rows))) + 1):
                workers.append(self._start(number, loop, inbox))
            live = len(workers)
            while live:
                worker, message = await inbox.get()
                kind = message[0]
                if kind == "want":
                    # Guided self-scheduling: big chunks early, single rows at the end.
                    size = min(concurrency, max(1, len(pending) // (8 * len(workers))))
                    chunk = [pending.popleft() for _ in range(min(size, len(pending)))]
                    worker.held.update(chunk)
                    with contextlib.suppress(OSError):  # it died: "gone" follows
                        worker.tasks.send(chunk)
                elif kind == "row":
                    position, result = message[1], message[2]
                    worker.held.pop(position, None)
                    finish(position, result)
                elif kind == "stopped":
                    stopped.append(message[1])
                elif kind == "fatal":
                    worker.failure = message[1]
                elif kind == "bye":
                    self.max_in_flight += int(message[1].get("max_in_flight", 0))
                elif kind == "gone":
                    live -= 1
                    how = await self._ended(worker)
                    if worker.held or worker.failure or how != "exited":
                        self._lost(worker, how, finish)
            if pending:
                reason = "every worker process died"
                last = next((w.failure for w in reversed(workers) if w.failure), None)
                stopped.append(f"{reason}: {last}" if last else reason)
                while pending:
                    position, row = pending.popleft()
                    finish(position, _error_row(row, self.spec.run_id, f"not run: {stopped[-1]}"))
        finally:
            self._stop(workers)
        return BatchReport(
            rows=[results[i] for i in range(len(rows))],
            wall_s=loop.time() - started,
            stopped_early=stopped[0] if stopped else None,
        )

    def _start(
        self,
        number: int,
        loop: asyncio.AbstractEventLoop,
        inbox: asyncio.Queue[tuple[_Worker, tuple[Any, ...]]],
    ) -> _Worker:
        context = multiprocessing.get_context("spawn")
        task_out, task_in = context.Pipe(duplex=False)
        result_out, result_in = context.Pipe(duplex=False)
        process = context.Process(
            target=_worker_main,
            args=(self.spec, task_out, result_in),
            name=f"osmosis-test-worker-{number}",
        )
        with _sigint_ignored():  # inherited: a Ctrl-C while it starts cannot kill it mid-import
            process.start()
        task_out.close()
        result_in.close()
        worker = _Worker(number, process, task_in, result_out)
        worker.reader = threading.Thread(
            target=_forward, args=(worker, loop, inbox), name=f"{process.name}-reader", daemon=True
        )
        worker.reader.start()
        return worker

    async def _ended(self, worker: _Worker) -> str:
        """Wait for a worker whose pipe closed; how it ended, in words."""
        process = worker.process
        await asyncio.to_thread(process.join, _STOP_GRACE_S)
        if process.exitcode is None:  # closed its pipe but lives on: it cannot be trusted
            process.kill()
            await asyncio.to_thread(process.join)
        code = process.exitcode
        if code == 0:
            return "exited"
        if code is not None and code < 0:
            with contextlib.suppress(ValueError):
                return f"killed by {signal.Signals(-code).name}"
        return f"exit code {code}"

    def _lost(self, worker: _Worker, how: str, finish: Callable[[int, RowResult], None]) -> None:
        """A worker ended with rows in hand (or failed): those rows end as errors that say why."""
        pid = worker.process.pid
        reason = f"worker process {worker.number} (pid {pid}) {how}"
        if worker.failure:
            reason += f": {worker.failure}"
        held = sorted(worker.held.items())
        worker.held.clear()
        if held:
            self.notify(f"{reason}; its {len(held)} unfinished row(s) count as errors")
        elif how != "exited" or worker.failure:
            self.notify(reason)
        for position, row in held:
            message = f"{reason} before this row finished"
            finish(position, _error_row(row, self.spec.run_id, message))

    def _stop(self, workers: list[_Worker]) -> None:
        """No worker outlives the batch: close their pipes, kill any still running, reap them."""
        for worker in workers:
            worker.tasks.close()
        for worker in workers:
            if worker.process.is_alive():
                worker.process.kill()
        for worker in workers:
            worker.process.join(_STOP_GRACE_S)
            if worker.reader is not None:
                worker.reader.join(_STOP_GRACE_S)
            worker.results.close()


def _error_row(row: RowInput, run_id: str, message: str) -> RowResult:
    return RowResult(
        index=row.index,
        rollout_id=f"row-{row.index}-{run_id}",
        status="ERROR",
        error_message=message,
        metadata=row.metadata,
    )


def _forward(
    worker: _Worker,
    loop: asyncio.AbstractEventLoop,
    inbox: asyncio.Queue[tuple[_Worker, tuple[Any, ...]]],
) -> None:
    """The reader thread of one worker: every message to the event loop, then ``gone``."""

    def post(message: tuple[Any, ...]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop already closed (interrupted run)
            loop.call_soon_threadsafe(inbox.put_nowait, (worker, message))

    try:
        while True:
            post(worker.results.recv())
    except (EOFError, OSError):
        pass
    except Exception as exc:  # a message that does not unpickle: the worker is unusable
        post(("fatal", f"unreadable message from the worker ({type(exc).__name__}: {exc})"))
    post(("gone",))


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """SIGINT ignored for a moment (a spawned child starts with it ignored), main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


# -- in the worker process ----------------------------------------------------------------------


def _worker_main(spec: WorkerSpec, tasks: Connection, results: Connection) -> None:
    """A worker's life: load the agent and backend, run the rows handed to it, say goodbye."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _exit_with_parent()
    library_log = logging.getLogger("osmosis_rollout")
    library_log.setLevel(logging.WARNING if spec.verbose else logging.CRITICAL)
    if spec.verbose:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        library_log.addHandler(handler)
    try:
        from ..loader import load_agent

        agent = load_agent(spec.target)
        backend = spec.backend.build()
        in_flight = asyncio.run(_work(spec, agent, backend, tasks, results))
    except (EOFError, BrokenPipeError):  # the parent went away: nobody to report to
        os._exit(1)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            results.send(("fatal", _describe(exc)))
        sys.exit(1)
    results.send(("bye", {"max_in_flight": in_flight}))


async def _work(
    spec: WorkerSpec, agent: Any, backend: Any, tasks: Connection, results: Connection
) -> int:
    """Run rows with ``concurrency`` lanes, each taking the next row when it is free."""
    import anyio

    from .harness import Harness
    from .runner import run_batch
    from .traingate import MockTrainGate

    options = spec.options
    one_at_a_time = RunOptions(
        max_turns=options.max_turns,
        max_tokens_total=options.max_tokens_total,
        completion_params=options.completion_params,
        timeout_s=options.timeout_s,
        concurrency=1,
    )
    lock = anyio.Lock()
    buffer: deque[tuple[int, RowInput]] = deque()
    exhausted = False
    told_stopped = False

    async def next_row() -> tuple[int, RowInput] | None:
        nonlocal exhausted
        async with lock:
            if not buffer and not exhausted:
                results.send(("want",))
                chunk = await anyio.to_thread.run_sync(tasks.recv)
                exhausted = not chunk
                buffer.extend(chunk)
            return buffer.popleft() if buffer else None

    async def lane(harness: Harness) -> None:
        nonlocal told_stopped
        while (item := await next_row()) is not None:
            position, row = item

            def send(result: RowResult, at: int = position) -> None:
                results.send(("row", at, result))

            report = await run_batch(
                harness, [row], one_at_a_time, on_result=send, run_id=spec.run_id
            )
            if report.stopped_early and not told_stopped:
                told_stopped = True
                results.send(("stopped", report.stopped_early))

    gate = MockTrainGate(backend)
    try:
        async with (
            Harness(
                agent,
                gate=gate,
                rollout_timeout_s=options.timeout_s,
                max_concurrent=options.concurrency,
                debug_dir=spec.debug_dir,
            ) as harness,
            anyio.create_task_group() as lanes,
        ):
            for _ in range(max(1, options.concurrency)):
                lanes.start_soon(lane, harness)
    finally:
        close = getattr(backend, "aclose", None)
        if close is not None:
            await close()
    return int(getattr(backend, "max_in_flight", 0))


def _exit_with_parent() -> None:
    """A daemon thread that ends this worker the moment its parent is gone (even ``kill -9``)."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()
        os._exit(1)

    threading.Thread(target=watch, name="osmosis-parent-watch", daemon=True).start()


def _describe(exc: BaseException) -> str:
    """One line for an error that stopped a worker (an agent's own exception included)."""
    from ..errors import OsmosisError

    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = " ".join(str(exc).split())
    if len(text) > 500:
        text = text[:497] + "..."
    if isinstance(exc, OsmosisError):
        return text or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
