"""tools.threads: the pool that runs sync tool calls (``ToolThreads``), through ``Toolbox.execute``
and ``ToolThreads.run``: results as if called inline, the limit, cancellation, daemon threads,
idle exit, one event loop after another, and trio (through anyio) when it is installed."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import gc
import importlib.util
import random
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from osmosis_rollout import telemetry
from osmosis_rollout.tools import Toolbox, threads
from osmosis_rollout.tools.threads import ToolThreads

from .tool_calls import call, make_ctx

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
NO_TRIO = "trio is not installed (not a dependency): the non-asyncio path is tested with it only"
HAS_TRIO = importlib.util.find_spec("trio") is not None
ASYNCIO_ONLY = pytest.mark.parametrize("anyio_backend", ["asyncio"])

caller_var: contextvars.ContextVar[str] = contextvars.ContextVar("caller_var", default="unset")


@pytest.fixture(
    params=["asyncio", pytest.param("trio", marks=pytest.mark.skipif(not HAS_TRIO, reason=NO_TRIO))]
)
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Each test on asyncio (the server's loop) and on trio (anyio's threads) when installed."""
    return str(request.param)


class Gauge:
    """How many calls run at once, and the most that ever did."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = 0
        self.peak = 0

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        with self._lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
        try:
            yield
        finally:
            with self._lock:
                self.now -= 1


async def eventually(predicate: Callable[[], bool], what: str) -> None:
    """Wait (generously: the machine is loaded) until ``predicate()`` holds."""
    with anyio.move_on_after(10):
        while not predicate():  # noqa: ASYNC110 - polling worker threads' state
            await anyio.sleep(0.005)
    assert predicate(), f"still waiting for {what}"


def wait_until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not predicate():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.005)


async def outcome(awaitable: Awaitable[Any]) -> BaseException | None:
    """The exception ``awaitable`` raised, caught here so that none can reach the event loop."""
    try:
        await awaitable
    except BaseException as exc:
        return exc
    return None


def refuse_to_start(self: threading.Thread) -> None:
    raise RuntimeError("can't start new thread")


def raiser(error: BaseException) -> Callable[[], Any]:
    def fn() -> Any:
        raise error

    return fn


# --------------------------------------------------------------------------------------------
# Results and exceptions, as if called inline
# --------------------------------------------------------------------------------------------


async def test_results_exceptions_and_context_come_back_as_if_called_inline() -> None:
    """The value itself, the exception object itself, and the caller's context variables."""
    pool = ToolThreads(2)
    marker = object()
    assert await pool.run(lambda: marker) is marker
    assert await pool.run(functools.partial(pow, 3, 4)) == 81

    error = ValueError("bad input")
    with pytest.raises(ValueError, match="bad input") as caught:
        await pool.run(raiser(error))
    assert caught.value is error

    caller_var.set("the caller's")
    assert await pool.run(caller_var.get) == "the caller's"


@pytest.mark.parametrize(
    "error",
    [StopIteration("done"), KeyboardInterrupt("^C"), SystemExit(2), asyncio.CancelledError()],
    ids=["StopIteration", "KeyboardInterrupt", "SystemExit", "CancelledError"],
)
async def test_exceptions_no_future_can_carry_arrive_as_errors_and_the_worker_survives(
    error: BaseException, anyio_backend: str
) -> None:
    """Raised in a worker they cannot mean a signal, an exit or a cancellation; re-raised in
    the event loop they would stop it or pass for its own cancellation. The caller gets a
    RuntimeError caused by the original, and the next call runs on the same worker."""
    pool = ToolThreads(1)
    worker = await pool.run(threading.current_thread)
    with anyio.fail_after(10):
        caught = await outcome(pool.run(raiser(error)))
    assert type(caught) is RuntimeError
    assert str(caught) == f"the tool raised {type(error).__name__}: {error}"
    assert caught.__cause__ is error
    with anyio.fail_after(10):
        again = await pool.run(threading.current_thread)
    if anyio_backend == "asyncio":  # on trio, anyio's threads
        assert again is worker


async def test_a_sync_tool_that_exits_or_stops_iterating_becomes_a_tool_message() -> None:
    """An argparse-style ``sys.exit`` in a sync tool is the model's feedback, not the end of
    the server's event loop."""

    def parse(flags: str) -> str:
        """Parse command-line flags."""
        raise SystemExit(2)

    def first(items: list[int]) -> int:
        """The first item."""
        return next(iter(items))

    with anyio.fail_after(10):
        messages = await Toolbox([parse, first], timeout_s=10).execute(
            make_ctx(),
            [call("parse", '{"flags": "-x"}', "c1"), call("first", '{"items": []}', "c2")],
        )
    assert [m["content"] for m in messages] == [
        "Error: tool 'parse' raised RuntimeError: the tool raised SystemExit: 2",
        "Error: tool 'first' raised RuntimeError: the tool raised StopIteration: ",
    ]


async def test_a_sync_tool_runs_inside_its_tool_call_span() -> None:
    """Spans a sync tool opens nest under ``osmosis.tool_call``: the context goes with it."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    seen: list[int] = []

    def lookup(key: str) -> str:
        """Look a key up."""
        seen.append(trace.get_current_span().get_span_context().span_id)
        return key

    telemetry.tracer_provider = provider
    try:
        [message] = await Toolbox([lookup]).execute(make_ctx(), [call("lookup", '{"key": "k"}')])
    finally:
        telemetry.tracer_provider = None
        provider.shutdown()
    assert message["content"] == "k"
    [span] = [s for s in exporter.get_finished_spans() if s.name == "osmosis.tool_call"]
    assert span.context is not None
    assert seen == [span.context.span_id]


# --------------------------------------------------------------------------------------------
# The limit
# --------------------------------------------------------------------------------------------


def barrier_work(gauge: Gauge, barrier: threading.Barrier, value: int) -> int:
    """Wait until ``barrier``'s parties all run at once: only returns if that many can."""
    with gauge.running():
        barrier.wait()
        return value * value


async def test_at_most_limit_calls_run_at_once_and_the_rest_queue_until_done() -> None:
    pool = ToolThreads(3)
    gauge = Gauge()
    barrier = threading.Barrier(3, timeout=10)
    results: dict[int, int] = {}

    async def one(i: int) -> None:
        results[i] = await pool.run(functools.partial(barrier_work, gauge, barrier, i))

    with anyio.fail_after(20):
        async with anyio.create_task_group() as group:
            for i in range(12):
                group.start_soon(one, i)
    assert results == {i: i * i for i in range(12)}
    assert gauge.peak == 3


async def test_toolbox_max_threads_bounds_a_batch_and_can_be_changed_after_use() -> None:
    gauge = Gauge()
    barrier = threading.Barrier(3, timeout=10)

    def square(x: int) -> int:
        """Square a number, with two others at once."""
        return barrier_work(gauge, barrier, x)

    def count(x: int) -> int:
        """Count a call."""
        with gauge.running():
            time.sleep(0.002)  # room for others to overlap, were they let in
            return x

    async def peak(toolbox: Toolbox, name: str) -> int:
        gauge.peak = 0
        batch = [call(name, f'{{"x": {i}}}', f"c{i}") for i in range(6)]
        with anyio.fail_after(20):
            messages = await toolbox.execute(make_ctx(), batch)
        expected = [i * i if name == "square" else i for i in range(6)]
        assert [m["content"] for m in messages] == [str(v) for v in expected]
        return gauge.peak

    toolbox = Toolbox([square, count], max_threads=1)
    assert await peak(toolbox, "count") == 1
    toolbox.max_threads = 3
    assert toolbox.max_threads == 3
    assert await peak(toolbox, "square") == 3  # the barrier trips only if 3 run at once
    toolbox.max_threads = 1
    assert await peak(toolbox, "count") == 1


async def test_raising_the_limit_starts_calls_already_queued() -> None:
    pool = ToolThreads(1)
    gauge = Gauge()
    barrier = threading.Barrier(3, timeout=10)
    results: list[int] = []

    async def one(i: int) -> None:
        results.append(await pool.run(functools.partial(barrier_work, gauge, barrier, i)))

    with anyio.fail_after(20):
        async with anyio.create_task_group() as group:
            for i in range(3):
                group.start_soon(one, i)
            await eventually(lambda: gauge.now == 1, "the first call to run")
            await anyio.wait_all_tasks_blocked()  # the two others are queued
            pool.limit = 3  # without a new call arriving, the queued two must start now
    assert sorted(results) == [0, 1, 4]


def test_max_threads_must_be_at_least_one() -> None:
    def echo(text: str) -> str:
        """Echo."""
        return text

    message = "max_threads must be a whole number of at least 1, not 0"
    with pytest.raises(ValueError, match=message):
        Toolbox([echo], max_threads=0)
    toolbox = Toolbox([echo], max_threads=2)
    with pytest.raises(ValueError, match=r"not 1\.5"):
        toolbox.max_threads = 1.5  # type: ignore[assignment]
    assert toolbox.max_threads == 2


# --------------------------------------------------------------------------------------------
# Cancellation: queued calls never run; running ones are abandoned
# --------------------------------------------------------------------------------------------


async def test_a_call_cancelled_while_queued_never_runs() -> None:
    pool = ToolThreads(1)
    started, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def first() -> str:
        started.set()
        release.wait(10)
        return "first"

    with anyio.fail_after(20):
        async with anyio.create_task_group() as group:
            group.start_soon(pool.run, first)
            await eventually(started.is_set, "the first call to run")
            with anyio.CancelScope() as queued:
                queued.cancel()  # cancelled at its first wait: in the queue, behind `first`
                await pool.run(lambda: ran.append("queued"))
            release.set()
        assert await pool.run(lambda: "after") == "after"  # FIFO: the dropped one came before
    assert ran == []
    assert pool.stuck == 0


async def test_a_call_cancelled_while_queued_keeps_nothing_alive() -> None:
    """Its arguments are freed at once, even while a hung call keeps the queue from moving."""
    pool = ToolThreads(1)
    started, release = threading.Event(), threading.Event()

    def hang() -> str:
        started.set()
        release.wait(10)
        return "late"

    class Payload:
        pass

    payload = Payload()
    alive = weakref.ref(payload)
    try:
        with anyio.fail_after(20):
            async with anyio.create_task_group() as group:
                group.start_soon(pool.run, hang)
                await eventually(started.is_set, "the hanging call to run")
                with anyio.CancelScope() as queued:
                    queued.cancel()
                    await pool.run(functools.partial(id, payload))
                del payload
                await anyio.lowlevel.checkpoint()  # the loop lets go of the cancelling traceback
                gc.collect()
                assert alive() is None
                release.set()
    finally:
        release.set()


async def test_a_call_cancelled_while_running_is_abandoned_and_frees_its_place() -> None:
    pool = ToolThreads(1)
    started, release = threading.Event(), threading.Event()
    returned: list[str] = []
    results: list[str] = []

    def hang() -> str:
        started.set()
        release.wait(10)
        returned.append("hang")
        return "late"

    async def run_queued() -> None:
        results.append(await pool.run(lambda: "queued"))

    try:
        with anyio.fail_after(20):
            async with anyio.create_task_group() as group:
                hung = anyio.CancelScope()

                async def run_hang() -> None:
                    with hung:
                        results.append(await pool.run(hang))

                group.start_soon(run_hang)
                await eventually(started.is_set, "the hanging call to run")
                group.start_soon(run_queued)
                await anyio.wait_all_tasks_blocked()
                assert results == []  # queued behind `hang`: the only place is taken
                hung.cancel()
                await eventually(lambda: results == ["queued"], "the queued call to run")
                assert pool.stuck == 1
                assert returned == []  # it still runs: abandoned, not finished
    finally:
        release.set()
    await eventually(lambda: pool.stuck == 0, "the abandoned call to return")
    assert returned == ["hang"]
    assert results == ["queued"]  # its late result went nowhere
    assert await pool.run(lambda: "next") == "next"


async def test_cancellations_at_random_moments_leave_no_stuck_call_and_no_lost_place() -> None:
    """Calls cancelled while queued, while running, or as they finish, among calls that
    complete: every completed call has its own value, every abandoned call is counted until it
    returns, and afterwards all ``limit`` places are free."""
    rng = random.Random(17)
    pool = ToolThreads(3)
    release = threading.Event()
    completed: dict[int, int] = {}

    def work(i: int, blocks: bool) -> int:
        if blocks:
            release.wait(10)
        return i

    async def one(i: int, blocks: bool, deadline: float) -> None:
        with anyio.move_on_after(deadline):
            completed[i] = await pool.run(functools.partial(work, i, blocks))

    plan = [(i, rng.random() < 0.2, rng.random() * 0.02) for i in range(200)]
    try:
        with anyio.fail_after(20):
            async with anyio.create_task_group() as group:
                for i, blocks, deadline in plan:
                    group.start_soon(one, i, blocks, deadline)
    finally:
        release.set()
    assert all(value == i for i, value in completed.items())
    assert not any(blocks for i, blocks, _ in plan if i in completed)  # they all timed out
    await eventually(lambda: pool.stuck == 0, "every abandoned call to return")
    gauge = Gauge()
    barrier = threading.Barrier(3, timeout=10)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as group:
            for i in range(3):
                group.start_soon(pool.run, functools.partial(barrier_work, gauge, barrier, i))
    assert gauge.peak == 3


async def test_a_stuck_call_counts_against_the_changed_max_threads() -> None:
    """After a timeout, raising max_threads lets new sync calls in while the first is stuck."""
    release = threading.Event()

    def hang() -> str:
        """Wait for the test."""
        release.wait(30)
        return "late"

    def echo(text: str) -> str:
        """Echo."""
        return text

    toolbox = Toolbox([hang, echo], timeout_s=0.05, max_threads=1)
    try:
        [first] = await toolbox.execute(make_ctx(), [call("hang")])
        toolbox.max_threads = 2
        [second] = await toolbox.execute(make_ctx(), [call("echo", '{"text": "hi"}')], timeout_s=5)
    finally:
        release.set()
    assert first["content"] == "Error: tool 'hang' timed out after 0.05 s"
    assert second["content"] == "hi"


@ASYNCIO_ONLY
async def test_a_call_whose_thread_cannot_start_fails_and_never_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pool = ToolThreads(1)
    ran: list[str] = []

    with monkeypatch.context() as patched:
        patched.setattr(threading.Thread, "start", refuse_to_start)
        with pytest.raises(RuntimeError, match="can't start new thread"):
            await pool.run(lambda: ran.append("refused"))
    with anyio.fail_after(10):
        assert await pool.run(lambda: "next") == "next"
    assert ran == []


@ASYNCIO_ONLY
async def test_a_timeout_is_still_a_timeout_when_no_thread_can_start_for_the_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Abandoning a call tries to start a thread for the queue; that failing is not the
    abandoned caller's error: the queued call waits for the worker to come back."""
    pool = ToolThreads(1)
    started, release = threading.Event(), threading.Event()
    abandoned = anyio.Event()
    results: list[str] = []
    hung = anyio.CancelScope()

    def hang() -> str:
        started.set()
        release.wait(10)
        return "late"

    async def run_hang() -> None:
        with hung:
            results.append(await pool.run(hang))
        abandoned.set()

    async def run_queued() -> None:
        results.append(await pool.run(lambda: "queued"))

    try:
        with anyio.fail_after(20):
            async with anyio.create_task_group() as group:
                group.start_soon(run_hang)
                await eventually(started.is_set, "the hanging call to run")
                group.start_soon(run_queued)
                await anyio.wait_all_tasks_blocked()  # queued behind `hang`
                with monkeypatch.context() as patched:
                    patched.setattr(threading.Thread, "start", refuse_to_start)
                    hung.cancel()
                    await abandoned.wait()
                assert hung.cancelled_caught
                assert pool.stuck == 1
                assert results == []
                release.set()  # the worker returns, and serves the queue
    finally:
        release.set()
    assert results == ["queued"]
    assert pool.stuck == 0


# --------------------------------------------------------------------------------------------
# Many calls; threads that exit when idle, and never keep the process alive
# --------------------------------------------------------------------------------------------


async def test_many_calls_from_many_tasks_all_return_their_values_without_leaking_threads(
    anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(threads, "IDLE_S", 0.05)
    before = set(threading.enumerate())
    baseline = threading.active_count()
    pool = ToolThreads(4)
    gauge = Gauge()
    results = [-1] * 2000

    def square(i: int) -> int:
        with gauge.running():
            return i * i

    async def one(i: int) -> None:
        results[i] = await pool.run(functools.partial(square, i))

    with anyio.fail_after(60):
        async with anyio.create_task_group() as group:
            for i in range(len(results)):
                group.start_soon(one, i)
    assert results == [i * i for i in range(len(results))]
    assert 1 <= gauge.peak <= 4
    if anyio_backend == "asyncio":  # on trio, the threads are trio's own cache
        started = [t for t in threading.enumerate() if t not in before]
        assert len(started) <= 4  # never more workers than the limit
        await eventually(lambda: not any(t.is_alive() for t in started), "idle workers to exit")
        assert threading.active_count() <= baseline


def test_idle_workers_exit_and_a_later_call_starts_a_new_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(threads, "IDLE_S", 0.05)
    pool = ToolThreads(2)
    first = asyncio.run(pool.run(threading.current_thread))
    assert first.daemon
    assert first.name == "osmosis-tool"
    wait_until(lambda: not first.is_alive(), "the idle worker to exit")
    second = asyncio.run(pool.run(threading.current_thread))
    assert second is not first
    assert second.daemon


def test_one_toolbox_serves_one_event_loop_after_another() -> None:
    """As under pytest and ``osmosis test``: a call abandoned in a closed loop returns later
    without harm, and its worker serves the next loop."""
    release = threading.Event()
    workers: list[threading.Thread] = []

    def hang() -> str:
        """Wait for the test."""
        workers.append(threading.current_thread())
        release.wait(10)
        return "late"

    def double(x: int) -> int:
        """Double a number."""
        workers.append(threading.current_thread())
        return 2 * x

    toolbox = Toolbox([hang, double], timeout_s=10, max_threads=1)

    async def first_loop() -> list[str]:
        batch = [call("double", '{"x": 1}', "c1"), call("hang", "{}", "c2")]
        return [m["content"] for m in await toolbox.execute(make_ctx(), batch, timeout_s=0.1)]

    async def second_loop() -> str:
        [message] = await toolbox.execute(make_ctx(), [call("double", '{"x": 21}')])
        return str(message["content"])

    try:
        assert asyncio.run(first_loop()) == ["2", "Error: tool 'hang' timed out after 0.1 s"]
        assert toolbox._threads.stuck == 1
    finally:
        release.set()  # it returns into a closed loop
    wait_until(lambda: toolbox._threads.stuck == 0, "the abandoned call to return")
    assert asyncio.run(second_loop()) == "42"
    assert workers[-1] is workers[1]  # the worker outlived the loop it first served


@pytest.mark.skipif(not HAS_TRIO, reason=NO_TRIO)
def test_one_toolbox_serves_one_trio_run_after_another() -> None:
    def double(x: int) -> int:
        """Double a number."""
        return 2 * x

    toolbox = Toolbox([double], max_threads=2)

    async def once(x: int) -> str:
        [message] = await toolbox.execute(make_ctx(), [call("double", f'{{"x": {x}}}')])
        return str(message["content"])

    assert anyio.run(once, 1, backend="trio") == "2"
    assert anyio.run(once, 21, backend="trio") == "42"
    assert asyncio.run(once(5)) == "10"  # and then asyncio, still the same toolbox


@pytest.mark.slow
def test_a_tool_that_never_returns_does_not_keep_the_process_from_exiting() -> None:
    script = textwrap.dedent(
        """
        import asyncio, threading
        from osmosis_rollout.agent import RolloutContext
        from osmosis_rollout.protocol import RolloutRequest
        from osmosis_rollout.tools import Toolbox

        def forever() -> str:
            "Never return."
            threading.Event().wait()
            return "never"

        request = RolloutRequest.model_validate(
            {"rollout_id": "r", "server_url": "http://traingate.test",
             "completion_params": {}, "messages": [{"role": "user", "content": "hi"}]}
        )
        ctx = RolloutContext(request, [], object())
        call = {"id": "c", "type": "function", "function": {"name": "forever", "arguments": "{}"}}
        [message] = asyncio.run(Toolbox([forever], timeout_s=0.1).execute(ctx, [call]))
        print(message["content"], flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "Error: tool 'forever' timed out after 0.1 s\n"
