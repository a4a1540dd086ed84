"""Concurrency and memory: M rollouts in flight in one process, each waiting on a slow LLM reply.

In-process, as ``osmosis test`` runs: ``create_app`` behind ``httpx2.ASGITransport``, its
``TrainGateClient`` reaching a ``MockTrainGate`` through a second ``ASGITransport``; the mock's
LLM backend parks every chat turn until the benchmark releases it. Each (variant, M) runs in a
fresh child process so that RSS starts clean. Phases:

1. ramp: M inits (64 at a time) until M chat turns are parked;
2. hold: 1 s with all M parked; RSS is read here (after ``gc.collect()``);
3. steady: 2 s in which parked turns are answered at ``--rate`` per second and every finished
   rollout is replaced by a new init, so M stay in flight.

Event-loop lag is sampled all the time by a task that sleeps 5 ms and records how late it wakes.
The baseline holds M bare ``httpx2`` POSTs in flight through ``ASGITransport`` to a bare
Starlette endpoint that parks the same way: the least an in-flight HTTP call costs here.

    python benchmarks/bench_concurrency.py [--sizes 1000,5000,10000] [--rate 200] [--tracemalloc]

``--tracemalloc`` also traces the ramp's allocations in each child (slower; the RSS figures are
then inflated by the tracing itself) and prints the lines that hold the most per rollout.

Goals: 10,000 in flight in one process, under 100 KB per rollout, loop-lag p99 under 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from typing import Any

import httpx2
from _bench import ROOT, percentile, print_table, ratio, rss_bytes, verdict, write_results
from _servers import REPLY_BYTES, TurnsAgent
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from osmosis_rollout.protocol import CompletionsRequest, CompletionsResponse, RolloutRequest
from osmosis_rollout.testing import Harness, MockTrainGate, RolloutRecord

GOAL_IN_FLIGHT = 10_000
GOAL_KB = 100.0
GOAL_LAG_MS = 50.0
TICK_S = 0.005
INIT_CONCURRENCY = 64
SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 8}
USER = {"role": "user", "content": "What is 12 + 30? Show your work."}


class Parking:
    """Parks callers until released, oldest first."""

    def __init__(self) -> None:
        self.parked: collections.deque[asyncio.Future[None]] = collections.deque()
        self._target = 0
        self._reached = asyncio.Event()

    async def park(self) -> None:
        """Wait until :meth:`release` lets this caller go."""
        future = asyncio.get_running_loop().create_future()
        self.parked.append(future)
        if len(self.parked) >= self._target:
            self._reached.set()
        await future

    async def wait_for(self, count: int) -> None:
        """Return once at least ``count`` callers are parked."""
        self._target, self._reached = count, asyncio.Event()
        if len(self.parked) < count:
            await self._reached.wait()

    def release(self, count: int) -> int:
        """Let up to ``count`` callers go; returns how many."""
        released = 0
        while self.parked and released < count:
            future = self.parked.popleft()
            if not future.done():
                future.set_result(None)
                released += 1
        return released


class SlowLLM:
    """A mock-TrainGate backend whose every reply waits in the parking lot."""

    def __init__(self, parking: Parking) -> None:
        self.parking = parking
        self.reply = CompletionsResponse.model_validate_json(REPLY_BYTES)

    async def complete(
        self, request: CompletionsRequest, record: RolloutRecord
    ) -> CompletionsResponse:
        await self.parking.park()
        return self.reply


class LagMeter:
    """Samples event-loop lag into the current phase's list; also times full GC collections."""

    def __init__(self) -> None:
        self.phase = "setup"
        self.samples: dict[str, list[float]] = collections.defaultdict(list)
        self.full_gc_ms: dict[str, list[float]] = collections.defaultdict(list)
        self._gc_started = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self.full_gc_ms[self.phase].append((time.perf_counter() - self._gc_started) * 1000)

    async def run(self) -> None:
        """Sleep ``TICK_S`` forever; record how late each wake-up is, in ms."""
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await asyncio.sleep(TICK_S)
            self.samples[self.phase].append((loop.time() - started - TICK_S) * 1000)


async def _steady(parking: Parking, lag: LagMeter, seconds: float, rate: float) -> int:
    """Answer parked turns at ``rate``/s for ``seconds``; returns how many were answered."""
    lag.phase = "steady"
    loop = asyncio.get_running_loop()
    started = loop.time()
    answered = 0
    while (now := loop.time()) - started < seconds:
        due = int((now - started) * rate) - answered
        if due > 0:
            answered += parking.release(due)
        await asyncio.sleep(0.01)
    return answered


async def _measure(
    size: int,
    rate: float,
    start_one: Callable[[str], Awaitable[None]],
    parking: Parking,
    lag: LagMeter,
    warmup: Callable[[], Awaitable[None]],
) -> dict[str, Any]:
    """The phases shared by both variants; ``start_one(id)`` must return once its turn is parked
    or, for refills, as soon as the request is under way."""
    await warmup()
    gc.collect()
    rss0 = rss_bytes()
    before = tracemalloc.take_snapshot() if tracemalloc.is_tracing() else None
    lag.phase = "ramp"
    ramp_started = time.perf_counter()
    limiter = asyncio.Semaphore(INIT_CONCURRENCY)
    counter = iter(range(10**9))

    async def start(rid: str) -> None:
        async with limiter:
            await start_one(rid)
            # Over ASGITransport a whole init runs without yielding; a real one arrives as its
            # own socket event, so give the loop a turn after each.
            await asyncio.sleep(0)

    await asyncio.gather(*(start(f"r-{next(counter)}") for _ in range(size)))
    await parking.wait_for(size)
    ramp_s = time.perf_counter() - ramp_started
    lag.phase = "measuring"
    gc.collect()
    rss1 = rss_bytes()
    held = _held_by_line(before, size) if before is not None else None
    await asyncio.sleep(3 * TICK_S)  # the tick delayed by the collection lands in "measuring"
    lag.phase = "hold"
    await asyncio.sleep(1.0)
    answered = await _steady(parking, lag, 2.0, rate)
    lag.phase = "end"
    per_kb = (rss1 - rss0) / size / 1024
    return {
        "in_flight": size,
        "ramp_s": round(ramp_s, 3),
        "rss_before_mb": round(rss0 / 2**20, 1),
        "rss_in_flight_mb": round(rss1 / 2**20, 1),
        "kb_per_in_flight": round(per_kb, 2),
        "steady_answered": answered,
        "lag_ms": {
            phase: {
                "p50": round(percentile(values, 0.5), 3),
                "p99": round(percentile(values, 0.99), 3),
                "max": round(max(values), 3),
                "n": len(values),
            }
            for phase, values in lag.samples.items()
            if phase in ("ramp", "hold", "steady") and values
        },
        "full_gc": {
            phase: {"count": len(pauses), "max_ms": round(max(pauses), 1)}
            for phase, pauses in lag.full_gc_ms.items()
            if phase in ("ramp", "hold", "steady") and pauses
        },
        **({"tracemalloc": held} if held is not None else {}),
    }


#: Who holds an allocation: the first of these met walking its stack from the allocating frame
#: outwards (the in-process HTTP stack between two of them counts for the caller's side; the
#: wire models in ``protocol.py`` count for whoever parses or builds them).
_OWNERS = (
    ("/osmosis_rollout/protocol.py", ""),
    ("/osmosis_rollout/testing/", "mock TrainGate (in production: TrainGate)"),
    ("/osmosis_rollout/client.py", "TrainGate client + in-process HTTP to the gate"),
    ("/osmosis_rollout/transport/", "TrainGate client + in-process HTTP to the gate"),
    ("/osmosis_rollout/", "rollout server (registry, context, models, tasks)"),
    ("/benchmarks/_servers.py", "the agent"),
    ("/benchmarks/", "load generator"),
)


def _owner(traceback: tracemalloc.Traceback) -> str:
    for frame in reversed(traceback):  # from the allocating frame outwards
        owner = next((owner for marker, owner in _OWNERS if marker in frame.filename), "")
        if owner:
            return owner
    return "other (event loop, start-up)"


def _held_by_line(before: tracemalloc.Snapshot, size: int) -> dict[str, Any]:
    """Bytes per in-flight rollout allocated since ``before`` and still held: by owner, and by
    the source line that allocated them (the top 25)."""
    after = tracemalloc.take_snapshot()
    ignore = [tracemalloc.Filter(False, tracemalloc.__file__)]
    after, before = after.filter_traces(ignore), before.filter_traces(ignore)
    stats = after.compare_to(before, "traceback")
    owners: dict[str, int] = collections.defaultdict(int)
    lines: dict[str, int] = collections.defaultdict(int)
    for stat in stats:
        owners[_owner(stat.traceback)] += stat.size_diff
        frame = stat.traceback[-1]  # the allocating frame
        where = f"{frame.filename.replace(str(ROOT) + '/', '')}:{frame.lineno}"
        lines[where] += stat.size_diff

    def per_rollout(totals: dict[str, int], count: int) -> list[list[Any]]:
        ranked = sorted(totals.items(), key=lambda item: item[1], reverse=True)[:count]
        return [[name, round(total / size)] for name, total in ranked]

    return {
        "bytes_per_rollout": round(sum(stat.size_diff for stat in stats) / size),
        "by_owner": per_rollout(owners, len(owners)),
        "by_line": per_rollout(lines, 25),
    }


async def _sdk(size: int, rate: float) -> dict[str, Any]:
    parking, lag = Parking(), LagMeter()
    gate = MockTrainGate(SlowLLM(parking))
    agent = TurnsAgent(turns=1)
    ticker = asyncio.create_task(lag.run())
    async with Harness(agent, gate=gate, max_concurrent=size + 1000) as harness:
        assert harness.server_http is not None
        http = harness.server_http
        refills: set[asyncio.Task[None]] = set()

        async def start_one(rid: str) -> None:
            request = RolloutRequest(
                rollout_id=rid,
                server_url=gate.base_url,
                messages=[SYSTEM, USER],
                completion_params={"temperature": 1.0, "max_tokens": 512},
                api_key="bench-key",
            )
            record, response = await gate.init_rollout(http, request)
            if response.status_code != 202:
                raise RuntimeError(f"init {rid} got HTTP {response.status_code}")
            task = asyncio.create_task(refill(record))
            refills.add(task)
            task.add_done_callback(refills.discard)

        async def refill(record: RolloutRecord) -> None:
            """When a rollout ends during the steady phase, start another one."""
            await record.done.wait()
            if lag.phase == "steady":
                await start_one(f"{record.rollout_id}+")

        async def warmup() -> None:
            for i in range(20):
                await start_one(f"warm-{i}")
            await parking.wait_for(20)
            parking.release(20)
            for i in range(20):
                await gate.wait_completed(f"warm-{i}", 30.0)

        result = await _measure(size, rate, start_one, parking, lag, warmup)
        for task in list(refills):
            task.cancel()
        while parking.parked:  # let every rollout finish before the harness shuts down
            parking.release(len(parking.parked))
            await asyncio.sleep(0.05)
        await asyncio.gather(*refills, return_exceptions=True)
    ticker.cancel()
    return result


async def _baseline(size: int, rate: float) -> dict[str, Any]:
    parking, lag = Parking(), LagMeter()

    async def chat(request: Request) -> Response:
        await request.body()
        await parking.park()
        return Response(REPLY_BYTES, media_type="application/json")

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    ticker = asyncio.create_task(lag.run())
    tasks: set[asyncio.Task[None]] = set()
    async with httpx2.AsyncClient(
        transport=httpx2.ASGITransport(app=app), base_url="http://traingate.test", timeout=None
    ) as http:

        async def post(rid: str) -> None:
            body = json.dumps({"model": "default", "rollout_id": rid, "messages": [SYSTEM, USER]})
            response = await http.post("/v1/chat/completions", content=body)
            json.loads(response.content)
            if lag.phase == "steady":
                start_task(f"{rid}+")

        def start_task(rid: str) -> None:
            task = asyncio.create_task(post(rid))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        async def start_one(rid: str) -> None:
            start_task(rid)
            await asyncio.sleep(0)

        async def warmup() -> None:
            for i in range(20):
                start_task(f"warm-{i}")
            warm = list(tasks)
            await parking.wait_for(20)
            parking.release(20)
            await asyncio.gather(*warm)

        result = await _measure(size, rate, start_one, parking, lag, warmup)
        lag.phase = "end"
        while tasks:
            parking.release(len(parking.parked))
            await asyncio.sleep(0.05)
    ticker.cancel()
    return result


def _child(kind: str, size: int, rate: float, trace: bool) -> None:
    if trace:
        tracemalloc.start(32)
    run = _sdk if kind == "sdk" else _baseline
    print(json.dumps(asyncio.run(run(size, rate))), flush=True)


def _spawn(kind: str, size: int, rate: float, trace: bool) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", kind, "--sizes", str(size), "--rate", str(rate)]
    if trace:
        command.append("--tracemalloc")
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"{kind} M={size} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    """Run each (variant, M) in a child process, print the tables, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000,5000,10000", help="comma-separated M values")
    parser.add_argument("--rate", type=float, default=200.0, help="steady-phase replies per s")
    parser.add_argument(
        "--tracemalloc",
        action="store_true",
        help="also print what holds the memory, by source line (slower; inflates RSS)",
    )
    parser.add_argument("--child", choices=["sdk", "baseline"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [int(m) for m in args.sizes.split(",")]
    if args.child:
        _child(args.child, sizes[0], args.rate, args.tracemalloc)
        return

    results: dict[str, dict[str, Any]] = {}
    for size in sizes:
        results[str(size)] = {
            kind: _spawn(kind, size, args.rate, args.tracemalloc) for kind in ("baseline", "sdk")
        }
        for kind, run in results[str(size)].items():
            if "tracemalloc" in run:
                held = run["tracemalloc"]
                title = f"M={size} {kind}: {held['bytes_per_rollout']:,} B traced per rollout"
                print_table(f"{title}, by owner", ["held by", "B per rollout"], held["by_owner"])
                print_table(f"{title}, by line", ["allocated at", "B per rollout"], held["by_line"])
    rows = []
    for key, by_kind in results.items():
        base, sdk = by_kind["baseline"], by_kind["sdk"]
        for label, run in (("baseline", base), ("SDK", sdk)):
            lags = run["lag_ms"]
            rows.append(
                [
                    f"M={key} {label}",
                    run["rss_in_flight_mb"] - run["rss_before_mb"],
                    run["kb_per_in_flight"],
                    run["ramp_s"],
                    lags.get("ramp", {}).get("p99", float("nan")),
                    lags.get("hold", {}).get("p99", float("nan")),
                    lags.get("steady", {}).get("p99", float("nan")),
                    lags.get("steady", {}).get("max", float("nan")),
                ]
            )
        rows.append(
            [
                f"M={key} SDK / baseline",
                "",
                ratio(sdk["kb_per_in_flight"], base["kb_per_in_flight"]),
                ratio(sdk["ramp_s"], base["ramp_s"]),
                "",
                "",
                "",
                "",
            ]
        )
    print_table(
        f"M rollouts in flight in one process (steady phase: {args.rate:g} replies/s)",
        [
            "",
            "RSS +MB",
            "KB each",
            "ramp s",
            "lag p99 ramp",
            "p99 hold",
            "p99 steady",
            "max steady",
        ],
        rows,
    )
    largest = results[str(max(sizes))]["sdk"]
    steady_p99 = max(r["sdk"]["lag_ms"]["steady"]["p99"] for r in results.values())
    kb = max(r["sdk"]["kb_per_in_flight"] for r in results.values())
    goals = {
        "in_flight": max(sizes) >= GOAL_IN_FLIGHT and largest["in_flight"] >= GOAL_IN_FLIGHT,
        "kb_per_rollout": kb < GOAL_KB,
        "lag_p99_ms": steady_p99 < GOAL_LAG_MS,
    }
    print_table(
        "Goals (SDK)",
        ["goal", "measured", "verdict"],
        [
            [
                f"{GOAL_IN_FLIGHT:,} in flight",
                f"{largest['in_flight']:,}",
                verdict(goals["in_flight"]),
            ],
            [f"< {GOAL_KB:g} KB per rollout", f"{kb:.1f} KB", verdict(goals["kb_per_rollout"])],
            [
                f"loop lag p99 < {GOAL_LAG_MS:g} ms (steady)",
                f"{steady_p99:.1f} ms",
                verdict(goals["lag_p99_ms"]),
            ],
        ],
    )
    write_results(
        "concurrency",
        {"parameters": {"sizes": sizes, "rate": args.rate}, "results": results, "goals": goals},
    )


if __name__ == "__main__":
    main()
