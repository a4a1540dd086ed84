"""The ``--jobs`` worker process: what it is started with, and how it runs the rows it is sent.

Each worker (forked from the forkserver, or spawned) loads the agent from its ``TARGET``
string, builds its own backend and :class:`~osmosis_rollout.testing.Harness`, and runs the rows
the parent hands it (:mod:`.parallel`), sending each result back as it finishes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import os
import signal
import sys
import threading
import uuid
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, Literal

from ..judging.tape import JudgeTape, use_tape
from .collector import lighter_gc

if TYPE_CHECKING:
    from ..protocol import CompletionsRequest, CompletionsResponse, RolloutResponse
    from ..testing.records import RolloutRecord
    from .cassette import Cassette
    from .replay import ReplayBackend
    from .runner import RowInput, RowResult, RunOptions

__all__ = [
    "BackendSpec",
    "WorkerSettings",
    "WorkerSpec",
    "one_row_at_a_time",
    "row_rollout_id",
    "worker_main",
]

#: One row as handed to a worker: its position in the batch, the row, its recorded row (replay).
Item = tuple[int, "RowInput", Any]


@dataclass(frozen=True)
class BackendSpec:
    """How a worker builds its LLM backend: the same CLI options, rebuilt in each process.

    The API key is never part of it: an ``openai`` worker reads ``OPENAI_API_KEY`` from the
    environment it inherits, like the parent does. A ``replay`` worker gets each row's recording
    from the parent with the row.
    """

    kind: Literal["mock", "openai", "replay"] = "mock"
    #: The mock's seed; for ``openai``, the ``seed`` sent to the server (None: none sent).
    seed: int | None = 0
    base_url: str | None = None
    model: str | None = None
    timeout_s: float = 120.0
    replay_mode: Literal["strict", "lenient"] = "strict"
    mock_policy: str = "walk"

    def build(self) -> Any:
        """A fresh backend of this kind."""
        if self.kind == "replay":
            return _RowReplays(self.replay_mode)
        if self.kind == "openai":
            from ..testing.openai_backend import OpenAICompatibleBackend

            return OpenAICompatibleBackend.from_env(
                os.environ,
                base_url=self.base_url,
                model=self.model,
                timeout_s=self.timeout_s,
                seed=self.seed,
            )
        from ..testing.backends import MockLLMBackend

        return MockLLMBackend(seed=self.seed or 0, policy=self.mock_policy)


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker is started with: what to load and how; the run's options come later."""

    target: str
    backend: BackendSpec
    #: The wire the workers' mock TrainGates speak (``--protocol``'s name): always given.
    protocol: str
    debug_dir: str | None = None
    verbose: bool = False
    #: Shared by every worker: rollout ids read ``row-<n>-<run_id>`` as with one process.
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])


@dataclass(frozen=True)
class WorkerSettings:
    """Sent with a worker's first rows: the run options and, for a replay, the cassette's
    header (its rows come one by one with the rows they replay)."""

    options: RunOptions
    cassette: Cassette | None = None


def row_rollout_id(row: RowInput, run_id: str) -> str:
    """The rollout id :func:`~.runner.run_batch` gives ``row`` in the run ``run_id``."""
    from .runner import rollout_id_of

    return rollout_id_of(row, run_id)


class _RowReplays:
    """A worker's backend for ``--replay``: each rollout is answered by a
    :class:`~.replay.ReplayBackend` over the one recorded row the parent bound to its row."""

    def __init__(self, mode: Literal["strict", "lenient"]) -> None:
        self.mode: Literal["strict", "lenient"] = mode
        self.cassette: Cassette | None = None  # the header, from the first settings
        self._by_rollout: dict[str, ReplayBackend] = {}
        #: The judge calls of the rows handed over, answered offline (``judging.tape``).
        self.judge_tape = JudgeTape(replaying=True)

    def expect(self, rollout_id: str, recorded: str | None) -> None:
        """The next rollout ``rollout_id`` replays ``recorded`` (a cassette row line; None: a
        row not recorded)."""
        from .cassette import Cassette, CassetteRow
        from .replay import ReplayBackend

        assert self.cassette is not None
        header = self.cassette
        rows = [CassetteRow.model_validate_json(recorded)] if recorded is not None else []
        for row in rows:
            self.judge_tape.load(row.judge)
        cassette = Cassette(header.path, header.header, rows, header.complete)
        self._by_rollout[rollout_id] = ReplayBackend(cassette, mode=self.mode)

    def done(self, rollout_id: str) -> None:
        self._by_rollout.pop(rollout_id, None)

    async def complete(
        self, request: CompletionsRequest, record: RolloutRecord
    ) -> CompletionsResponse:
        return await self._for(record).complete(request, record)

    def rollout_completed(self, record: RolloutRecord, response: RolloutResponse) -> None:
        self._for(record).rollout_completed(record, response)

    def _for(self, record: RolloutRecord) -> ReplayBackend:
        backend = self._by_rollout.get(record.rollout_id)
        if backend is None:
            from ..errors import LLMBackendError

            raise LLMBackendError(
                f"rollout {record.rollout_id!r} is not one this worker was given",
                kind="replay_unknown_row",
            )
        return backend


def one_row_at_a_time(options: RunOptions) -> RunOptions:
    """The options of each row a worker runs (one row per ``run_batch``): every setting of the
    batch's, whatever fields ``RunOptions`` has, with a concurrency of 1."""
    return dataclasses.replace(options, concurrency=1)


def worker_main(
    spec: WorkerSpec, tasks: Connection, results: Connection, lifeline: Connection
) -> None:
    """A worker's life: load the agent and backend, run the rows handed to it, say goodbye."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _exit_with_parent(lifeline)
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
        times = getattr(getattr(backend, "inner", backend), "times", None)
        # The model/server/toolkit split is made in the parent, from every worker's turns.
        bye = {"max_in_flight": in_flight, "times": times.state() if times is not None else None}
        # multiprocessing ends a worker without the interpreter's teardown: what the agent
        # holds (an open file, say) is finalized here or never, even in a reference cycle.
        del agent, backend
        gc.collect()
    except (EOFError, BrokenPipeError):  # the parent went away: nobody to report to
        os._exit(1)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            results.send(("fatal", _describe(exc)))
        sys.exit(1)
    results.send(("bye", bye))


async def _work(
    spec: WorkerSpec, agent: Any, backend: Any, tasks: Connection, results: Connection
) -> int:
    """Run rows with ``concurrency`` lanes, each taking the next row when it is free."""
    import anyio

    from ..testing.harness import Harness
    from ..testing.traingate import MockTrainGate
    from .runner import run_batch
    from .stalls import StallMonitor

    lock = anyio.Lock()
    stalls = StallMonitor()
    buffer: deque[Item] = deque()
    exhausted = False
    told_stopped = False
    settings: list[WorkerSettings] = []
    replays = backend if isinstance(backend, _RowReplays) else None

    async def fetch() -> None:
        nonlocal exhausted
        results.send(("want",))
        first, chunk = await anyio.to_thread.run_sync(tasks.recv)
        if first is not None:
            settings.append(first)
        exhausted = not chunk
        buffer.extend(chunk)

    async def next_row() -> Item | None:
        async with lock:
            if not buffer and not exhausted:
                await fetch()
            return buffer.popleft() if buffer else None

    async def lane(harness: Harness, options: RunOptions) -> None:
        nonlocal told_stopped
        while (item := await next_row()) is not None:
            position, row, recorded = item
            rollout_id = row_rollout_id(row, spec.run_id)
            if replays is not None:
                replays.expect(rollout_id, recorded)

            def send(result: RowResult, at: int = position) -> None:
                result.findings.extend(stalls.take(result.rollout_id))
                results.send(("row", at, result))

            report = await run_batch(harness, [row], options, on_result=send, run_id=spec.run_id)
            if replays is not None:
                replays.done(rollout_id)
            if report.stopped_early and not told_stopped:
                told_stopped = True
                results.send(("stopped", report.stopped_early))

    await fetch()  # the settings come with the first rows
    if not buffer:
        return 0
    options = settings[0].options
    if replays is not None:
        replays.cassette = settings[0].cassette
    one_at_a_time = one_row_at_a_time(options)
    try:
        # The collector set once for the worker's life, not per row's run_batch (collector.py).
        with lighter_gc():
            async with (
                stalls,
                use_tape(replays.judge_tape if replays is not None else None),
                Harness(
                    agent,
                    gate=MockTrainGate(backend),
                    rollout_timeout_s=options.timeout_s,
                    max_concurrent=options.concurrency,
                    debug_dir=spec.debug_dir,
                    secrets=[os.environ.get("OPENAI_API_KEY")],
                    protocol=spec.protocol,
                ) as harness,
                anyio.create_task_group() as lanes,
            ):
                for _ in range(max(1, options.concurrency)):
                    lanes.start_soon(lane, harness, one_at_a_time)
    finally:
        close = getattr(backend, "aclose", None)
        if close is not None:
            await close()
    return int(getattr(backend, "max_in_flight", 0))


def _exit_with_parent(lifeline: Connection) -> None:
    """A daemon thread that ends this worker the moment its parent is gone (even ``kill -9``):
    the parent holds the only other end of ``lifeline``, which closes with it."""

    def watch() -> None:
        with contextlib.suppress(OSError, EOFError):
            while not lifeline.poll(None):
                pass
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
