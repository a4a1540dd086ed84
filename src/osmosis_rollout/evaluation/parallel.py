"""``osmosis test --jobs N``: the rows of one batch run by N worker processes.

A batch through the in-process pipeline (mock LLM or ``--replay``) is CPU-bound Python, so one
process uses one core. Rows are independent; each worker (a ``spawn``-ed process: never a fork
of a process with an event loop and threads) loads the agent from its ``TARGET`` string, builds
its own backend and :class:`Harness`, and runs rows with ``--concurrency`` rollouts at once.

The pool starts before the parent reads its dataset or cassette, so the workers' imports overlap
that work. The parent hands rows out on request, in chunks that shrink as the batch drains (a
slow worker never holds rows another could run), reads every result back as a
:class:`~.runner.RowResult`, and owns everything the user sees. For a replay, the parent binds
each row to its recorded row (as one process would, in dataset order) and sends that row along:
workers never read the cassette, and two rows with the same input replay two recordings.

It knows which rows each worker holds: when a worker dies (killed, crashed, its agent failed to
import), those rows end as ``ERROR`` rows that say so, and the others go on. Workers ignore
SIGINT and SIGTERM (a Ctrl-C reaches the whole process group; the parent decides), are killed by
the parent when the batch ends or is interrupted, and exit on their own when the parent is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from ..testing.turn_times import TurnTimes
from .collector import lighter_gc
from .worker import Item, WorkerSettings, WorkerSpec, row_rollout_id, worker_main

if TYPE_CHECKING:
    # .runner (and through it the harness) is imported on use: `osmosis test --jobs` starts
    # its workers before it has imported them.
    from .cassette import Cassette, CassetteRow
    from .runner import BatchReport, RowInput, RowResult, RunOptions

__all__ = ["WorkerPool", "warm_up"]

#: Seconds a worker is given to exit after its pipe closed, before it is killed.
_STOP_GRACE_S = 2.0

_Message = tuple[Any, ...]


@dataclass
class _Run:
    """The parent's state of one :meth:`WorkerPool.run`."""

    settings: WorkerSettings
    pending: deque[tuple[int, RowInput]]
    bind: Callable[[RowInput], CassetteRow | None] | None
    on_result: Callable[[RowResult], None] | None
    results: dict[int, RowResult] = field(default_factory=dict)
    stopped: list[str] = field(default_factory=list)  # why the batch stopped early
    #: Each recorded row's line in the cassette, by the row's id (sent instead of the row).
    sources: dict[int, str] = field(default_factory=dict)

    def recorded(self, row: RowInput) -> str | None:
        """The recorded row ``row`` replays, as JSON for its worker (None: no recording)."""
        recorded = self.bind(row) if self.bind is not None else None
        if recorded is None:
            return None
        source = self.sources.get(id(recorded))
        return source if source is not None else recorded.model_dump_json()

    def finish(self, position: int, result: RowResult) -> None:
        self.results[position] = result
        if self.on_result is not None:
            self.on_result(result)


@dataclass
class _Worker:
    """The parent's view of one worker: its process, pipes, and the rows it holds."""

    number: int
    process: Any  # multiprocessing.context.SpawnProcess
    tasks: Connection  # parent -> worker: (settings or None, [items]); [] when no rows are left
    results: Connection  # worker -> parent: messages
    lifeline: Connection  # only the parent holds it open: when it closes, the worker exits
    held: dict[int, RowInput] = field(default_factory=dict)
    configured: bool = False
    failure: str | None = None
    reader: threading.Thread | None = None


class WorkerPool:
    """Run a batch's rows in ``jobs`` worker processes; see the module docstring.

    ``with WorkerPool(spec, jobs) as pool:`` starts the workers at once; ``await pool.run(...)``
    runs the rows; leaving the block kills whatever still runs. ``notify`` gets a one-line
    message when a worker dies. After :meth:`run`, ``max_in_flight`` is the sum of the workers'
    most LLM turns in flight at once, and ``times`` their LLM turns' times.
    """

    def __init__(
        self, spec: WorkerSpec, jobs: int, *, notify: Callable[[str], None] | None = None
    ) -> None:
        self.spec = spec
        self.jobs = max(1, jobs)
        self.notify = notify or (lambda message: None)
        self.max_in_flight = 0
        #: The workers' LLM turn times together (their model backends'), for the time split.
        self.times = TurnTimes()
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._early: list[tuple[_Worker, _Message]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._inbox: asyncio.Queue[tuple[_Worker, _Message]] | None = None
        self._started = False
        self._starter: threading.Thread | None = None  # forking the workers from a forkserver
        self._start_error: BaseException | None = None
        self._closed = False

    def __enter__(self) -> WorkerPool:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Start the workers (once); they load the agent while the caller prepares the rows.

        With a forkserver, the server is launched here (with SIGINT and SIGTERM ignored, which
        it and the workers inherit) and the workers are forked from a thread, since each fork
        waits for the server's imports: the caller goes on meanwhile.
        """
        if self._started:
            return
        self._started = True
        context = _context()
        if context.get_start_method() == "forkserver":
            _launch_forkserver()
            self._starter = threading.Thread(
                target=self._start_all, args=(context,), name="osmosis-test-start", daemon=True
            )
            self._starter.start()
        else:
            self._start_all(context)

    def _start_all(self, context: Any) -> None:
        try:
            for number in range(1, self.jobs + 1):
                if self._closed:
                    return
                self._start_one(context, number)
        except BaseException as exc:  # raised again by run()
            self._start_error = exc

    def _start_one(self, context: Any, number: int) -> None:
        task_out, task_in = context.Pipe(duplex=False)
        result_out, result_in = context.Pipe(duplex=False)
        life_out, life_in = context.Pipe(duplex=False)
        process = context.Process(
            target=worker_main,
            args=(self.spec, task_out, result_in, life_out),
            name=f"osmosis-test-worker-{number}",
        )
        with _signals_ignored():  # inherited: a Ctrl-C while it starts cannot kill it
            process.start()
        for child_end in (task_out, result_in, life_out):
            child_end.close()
        worker = _Worker(number, process, task_in, result_out, life_in)
        worker.reader = threading.Thread(
            target=self._forward, args=(worker,), name=f"{process.name}-reader", daemon=True
        )
        self._workers.append(worker)
        worker.reader.start()

    async def run(
        self,
        rows: Sequence[RowInput],
        options: RunOptions,
        *,
        cassette: Cassette | None = None,
        bind: Callable[[RowInput], CassetteRow | None] | None = None,
        on_result: Callable[[RowResult], None] | None = None,
    ) -> BatchReport:
        """Run every row; results keep dataset order, as :func:`~.runner.run_batch`'s do.

        For a replay, ``cassette`` is the cassette read by the caller and ``bind`` gives the
        recorded row each row replays (:meth:`~.replay.ReplayBackend.take_row`).
        """
        from .runner import BatchReport

        self.start()
        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.to_thread(self._wait_started)
        if self._start_error is not None:
            self.close()
            raise self._start_error
        inbox: asyncio.Queue[tuple[_Worker, _Message]] = asyncio.Queue()
        with self._lock:
            self._loop, self._inbox = loop, inbox
            for early in self._early:
                inbox.put_nowait(early)
            self._early.clear()
        header = None
        if cassette is not None:
            from .cassette import Cassette

            header = Cassette(cassette.path, cassette.header, [], cassette.complete)
        sources = {}
        # Unless the rows changed since they were read (then each is dumped as it is sent).
        if cassette is not None and len(cassette.sources or ()) == len(cassette.rows):
            pairs = zip(cassette.rows, cassette.sources or (), strict=True)
            sources = {id(row): line for row, line in pairs}
        run = _Run(
            settings=WorkerSettings(options, header),
            pending=deque(enumerate(rows)),
            bind=bind,
            on_result=on_result,
            sources=sources,
        )
        try:
            live = len(self._workers)
            with lighter_gc():  # the command holds the cassette: collect as one batch would
                while live:
                    worker, message = await inbox.get()
                    if message[0] == "gone":
                        live -= 1
                        how = await self._ended(worker)
                        if worker.held or worker.failure or how != "exited":
                            self._lost(worker, how, run)
                    else:
                        self._handle(worker, message, run)
            if run.pending:
                reason = "every worker process died"
                last = next((w.failure for w in reversed(self._workers) if w.failure), None)
                run.stopped.append(f"{reason}: {last}" if last else reason)
                while run.pending:
                    position, row = run.pending.popleft()
                    why = f"not run: {run.stopped[-1]}"
                    run.finish(position, _error_row(row, self.spec.run_id, why))
        finally:
            self.close()
        return BatchReport(
            rows=[run.results[i] for i in range(len(rows))],
            wall_s=loop.time() - started,
            stopped_early=run.stopped[0] if run.stopped else None,
        )

    def _handle(self, worker: _Worker, message: _Message, run: _Run) -> None:
        """One message from a worker: a request for rows, a row's result, or news of it."""
        kind = message[0]
        if kind == "want":
            # Guided self-scheduling: big chunks early, single rows at the end.
            concurrency = max(1, run.settings.options.concurrency)
            size = min(concurrency, max(1, len(run.pending) // (8 * len(self._workers))))
            chunk: list[Item] = []
            # A row's --samples stay in one worker: a judge ranks them together (GroupJudge).
            while run.pending and (
                len(chunk) < size or run.pending[0][1].index == chunk[-1][1].index
            ):
                position, row = run.pending.popleft()
                chunk.append((position, row, run.recorded(row)))
                worker.held[position] = row
            first = None if worker.configured else run.settings
            worker.configured = True
            with contextlib.suppress(OSError):  # it died: "gone" follows
                worker.tasks.send((first, chunk))
        elif kind == "row":
            worker.held.pop(message[1], None)
            run.finish(message[1], message[2])
        elif kind == "stopped":
            run.stopped.append(message[1])
        elif kind == "fatal":
            worker.failure = message[1]
        elif kind == "bye":
            self.max_in_flight += int(message[1].get("max_in_flight", 0))
            if message[1].get("times"):
                self.times.merge(message[1]["times"])

    def close(self) -> None:
        """No worker outlives the pool: close their pipes, kill any still running, reap them."""
        self._closed = True
        self._wait_started()
        for worker in self._workers:
            worker.tasks.close()
            worker.lifeline.close()
        for worker in self._workers:
            if worker.process.is_alive():
                worker.process.kill()
        for worker in self._workers:
            worker.process.join(_STOP_GRACE_S)
            if worker.reader is not None:
                worker.reader.join(_STOP_GRACE_S)
            worker.results.close()

    def _wait_started(self) -> None:
        if self._starter is not None:
            self._starter.join()

    def _forward(self, worker: _Worker) -> None:
        """The reader thread of one worker: every message to the event loop, then ``gone``."""
        try:
            while True:
                self._post(worker, worker.results.recv())
        except (EOFError, OSError):
            pass
        except Exception as exc:  # a message that does not unpickle: the worker is unusable
            self._post(worker, ("fatal", f"unreadable message ({type(exc).__name__}: {exc})"))
        self._post(worker, ("gone",))

    def _post(self, worker: _Worker, message: _Message) -> None:
        with self._lock:
            if self._loop is None or self._inbox is None:
                self._early.append((worker, message))  # run() has not begun: it takes them
                return
            with contextlib.suppress(RuntimeError):  # the loop already closed (interrupted)
                self._loop.call_soon_threadsafe(self._inbox.put_nowait, (worker, message))

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

    def _lost(self, worker: _Worker, how: str, run: _Run) -> None:
        """A worker ended with rows in hand (or failed): those rows end as errors that say why."""
        reason = f"worker process {worker.number} (pid {worker.process.pid}) {how}"
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
            run.finish(position, _error_row(row, self.spec.run_id, message))


def _error_row(row: RowInput, run_id: str, message: str) -> RowResult:
    from .runner import RowResult

    return RowResult(
        index=row.index,
        rollout_id=row_rollout_id(row, run_id),
        status="ERROR",
        error_message=message,
        metadata=row.metadata,
        sample=row.sample,
    )


def warm_up() -> None:
    """Launch the forkserver now, before the command reads its rows and imports the rest: it
    imports what the workers need meanwhile. The next :class:`WorkerPool` forks from it."""
    if _context().get_start_method() == "forkserver":
        _launch_forkserver()


def _launch_forkserver() -> None:
    """Make sure the forkserver runs, launched with SIGINT and SIGTERM ignored (which it and the
    workers inherit). It is multiprocessing's: it serves every later pool of this process, and
    ends when this process does (the pipe it watches closes), so no pool stops it."""
    from multiprocessing import forkserver

    with _signals_ignored():
        forkserver.ensure_running()


def _context() -> Any:
    """How workers start. ``forkserver`` where there is one: a clean server process imports the
    worker's modules once and forks each worker from that (no event loop or thread is ever
    forked); else (Windows) ``spawn``, each worker importing everything itself.
    ``_OSMOSIS_JOBS_START=spawn`` (internal, for the tests) takes spawn everywhere."""
    if os.environ.get("_OSMOSIS_JOBS_START") == "spawn" or (
        "forkserver" not in multiprocessing.get_all_start_methods()
    ):
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    # "__main__" (the `osmosis` script): imported once there, so no worker runs it again.
    context.set_forkserver_preload(["__main__", *_PRELOAD])
    return context


#: What a worker imports before it loads the agent (the forkserver imports it once).
_PRELOAD = (
    "osmosis_rollout.evaluation.parallel",
    "osmosis_rollout.evaluation.worker",
    "osmosis_rollout.testing.harness",
    "osmosis_rollout.evaluation.replay",
    "osmosis_rollout.loader",
    "osmosis_rollout.server",  # each worker's harness builds the app
    "osmosis_rollout.tools",  # what agents import
)


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    """SIGINT and SIGTERM ignored for a moment, in the main thread: a process started meanwhile
    (the forkserver, a spawned worker) starts with them ignored, and so do the workers forked
    from it. A Ctrl-C or a ``kill`` of the process group then reaches only the command, which
    stops the rest itself."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {
        signum: signal.signal(signum, signal.SIG_IGN) for signum in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
