"""Throughput: rollouts per second through a real uvicorn on 127.0.0.1, ours vs. a bare baseline.

The server under test runs in its own process: either ``create_app`` under uvicorn (our
``serve()``, with a one-turn agent) or the baseline, a bare Starlette endpoint that answers the
init and posts the same chat turn and completion callback with ``httpx2``. This process plays
TrainGate: it keeps N inits in flight (each worker waits for its rollout's callback before
sending the next) and answers chat turns at once. Rounds alternate baseline and SDK; the best
round of each is reported, with the server process's CPU time per rollout (which does not depend
on how busy the rest of the machine is).

    python benchmarks/bench_throughput.py [--concurrency 8,64] [--rollouts 1000] [--repeats 2]

Goal: at least 70% of the baseline's rollouts/s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import uvicorn
from _bench import (
    HOST,
    child_server,
    cpu_seconds,
    percentile,
    print_table,
    ratio,
    verdict,
    write_results,
)
from _servers import StandIn

GOAL_RATIO = 0.70
SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 8}
USER = {"role": "user", "content": "What is 12 + 30? Show your work."}


class _QuietServer(uvicorn.Server):
    """uvicorn inside our loop: leave the process's signal handlers alone."""

    def capture_signals(self) -> contextlib.AbstractContextManager[None]:  # type: ignore[override]
        return contextlib.nullcontext()


class Gate:
    """The TrainGate side: the stand-in under uvicorn, and a future per rollout for its callback."""

    def __init__(self) -> None:
        self.waiting: dict[str, asyncio.Future[float]] = {}
        self.app = StandIn(on_completed=self._completed)
        self.url = ""

    def _completed(self, body: bytes) -> None:
        future = self.waiting.pop(json.loads(body)["rollout_id"], None)
        if future is not None and not future.done():
            future.set_result(time.perf_counter())

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Gate]:
        """Serve on 127.0.0.1 until the block ends."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind((HOST, 0))
        self.url = f"http://{HOST}:{sock.getsockname()[1]}"
        config = uvicorn.Config(self.app, log_level="warning", lifespan="off", access_log=False)
        server = _QuietServer(config)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        try:
            while not server.started:
                if task.done():
                    task.result()
                await asyncio.sleep(0.01)
            yield self
        finally:
            server.should_exit = True
            await task
            sock.close()


def _init_body(rid: str, gate_url: str) -> bytes:
    return json.dumps(
        {
            "rollout_id": rid,
            "server_url": gate_url,
            "messages": [SYSTEM, USER],
            "completion_params": {"temperature": 1.0, "max_tokens": 512},
            "api_key": "bench-key",
        }
    ).encode()


async def _drive(
    gate: Gate, server_port: int, prefix: str, count: int, concurrency: int
) -> dict[str, Any]:
    """Run ``count`` rollouts with ``concurrency`` workers; return timings."""
    ids = iter(range(count))
    latencies: list[float] = []
    loop = asyncio.get_running_loop()
    limits = httpx2.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx2.AsyncClient(
        base_url=f"http://{HOST}:{server_port}", limits=limits, timeout=60.0
    ) as http:

        async def worker() -> None:
            for i in ids:
                rid = f"{prefix}-{i}"
                done = loop.create_future()
                gate.waiting[rid] = done
                started = time.perf_counter()
                response = await http.post(
                    "/v1/rollout/init",
                    content=_init_body(rid, gate.url),
                    headers={"Content-Type": "application/json"},
                )
                if response.status_code != 202:
                    raise RuntimeError(f"init {rid} got HTTP {response.status_code}")
                latencies.append((await asyncio.wait_for(done, 60.0)) - started)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - started
    return {"wall_s": wall, "latencies": latencies}


async def _round(
    gate: Gate, kind: str, concurrency: int, rollouts: int, warmup: int
) -> dict[str, Any]:
    args = [kind, "--turns", "1", "--max-concurrent", str(max(100, 2 * concurrency))]
    with child_server(*args) as (proc, port):
        await _drive(gate, port, f"{kind}-warm-{concurrency}", warmup, concurrency)
        cpu0, own0 = cpu_seconds(proc.pid), time.process_time()
        run = await _drive(gate, port, f"{kind}-{concurrency}", rollouts, concurrency)
        cpu1, own1 = cpu_seconds(proc.pid), time.process_time()
    latencies = run["latencies"]
    return {
        "rollouts_per_s": round(rollouts / run["wall_s"], 1),
        "server_cpu_ms_per_rollout": round((cpu1 - cpu0) * 1000 / rollouts, 3),
        "driver_cpu_ms_per_rollout": round((own1 - own0) * 1000 / rollouts, 3),
        "latency_p50_ms": round(percentile(latencies, 0.5) * 1000, 3),
        "latency_p99_ms": round(percentile(latencies, 0.99) * 1000, 3),
        "wall_s": round(run["wall_s"], 3),
    }


async def _run(levels: list[int], rollouts: int, warmup: int, repeats: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    async with Gate().running() as gate:
        for concurrency in levels:
            rounds: dict[str, list[dict[str, Any]]] = {"baseline": [], "sdk": []}
            for _ in range(repeats):
                for kind in ("baseline", "sdk"):
                    rounds[kind].append(await _round(gate, kind, concurrency, rollouts, warmup))
            results[str(concurrency)] = {
                kind: {
                    **max(runs, key=lambda r: float(r["rollouts_per_s"])),
                    "all_rollouts_per_s": [r["rollouts_per_s"] for r in runs],
                }
                for kind, runs in rounds.items()
            }
    return results


def main() -> None:
    """Run the rounds, print the tables, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", default="8,64", help="comma-separated N values")
    parser.add_argument("--rollouts", type=int, default=1000, help="measured rollouts per round")
    parser.add_argument("--warmup", type=int, default=100, help="unmeasured rollouts per round")
    parser.add_argument("--repeats", type=int, default=2, help="rounds per server and N")
    args = parser.parse_args()
    levels = [int(n) for n in args.concurrency.split(",")]

    results = asyncio.run(_run(levels, args.rollouts, args.warmup, args.repeats))

    rows = []
    goals = []
    for n, by_kind in results.items():
        base, sdk = by_kind["baseline"], by_kind["sdk"]
        share = ratio(sdk["rollouts_per_s"], base["rollouts_per_s"])
        cpu_share = ratio(base["server_cpu_ms_per_rollout"], sdk["server_cpu_ms_per_rollout"])
        by_kind["throughput_ratio"] = share
        by_kind["cpu_ratio"] = cpu_share
        for kind, run in (("baseline", base), ("SDK create_app", sdk)):
            rows.append(
                [
                    f"N={n} {kind}",
                    run["rollouts_per_s"],
                    run["server_cpu_ms_per_rollout"],
                    run["driver_cpu_ms_per_rollout"],
                    run["latency_p50_ms"],
                    run["latency_p99_ms"],
                ]
            )
        rows.append(
            [f"N={n} SDK / baseline", share, 1 / cpu_share if cpu_share else 0.0, "", "", ""]
        )
        goals.append(
            [
                f"N={n}: SDK >= {GOAL_RATIO:.0%} of baseline",
                f"{share:.0%}",
                verdict(share >= GOAL_RATIO),
            ]
        )
        goals.append(
            [
                f"N={n}: same, by server CPU per rollout",
                f"{cpu_share:.0%}",
                verdict(cpu_share >= GOAL_RATIO),
            ]
        )
    print_table(
        f"Rollouts through uvicorn on 127.0.0.1 (1 LLM turn each, best of {args.repeats} rounds)",
        ["", "rollouts/s", "server CPU ms/rollout", "driver CPU ms", "p50 ms", "p99 ms"],
        rows,
    )
    print_table("Goal", ["goal", "measured", "verdict"], goals)
    write_results(
        "throughput",
        {
            "parameters": vars(args),
            "results": results,
            "goal": {
                "ratio_at_least": GOAL_RATIO,
                "met": all(r["throughput_ratio"] >= GOAL_RATIO for r in results.values()),
            },
        },
    )


if __name__ == "__main__":
    main()
