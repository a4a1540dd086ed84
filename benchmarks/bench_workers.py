"""Throughput beyond one process: ``--workers 2`` on memory and on Redis, and what
``uvicorn[standard]`` changes, each beside the single-process figure from the same run.

The server runs as a child process (``_servers.py sdk``) with a one-turn agent; this process plays
TrainGate (the same stand-in and driver as ``bench_throughput.py``) and keeps N inits in flight.
Server CPU is the CPU time of the server's whole process tree per rollout (and, on Redis, of the
redis-server too), so it does not depend on how busy the rest of the machine is.

    python benchmarks/bench_workers.py [--concurrency 64] [--rollouts 1000] [--repeats 2]

Configurations (``single`` is the baseline every ratio is against):

- ``single``: one process, memory state, httptools, asyncio loop (today's default install);
- ``h11``: the same without ``uvicorn[standard]``'s HTTP parser (what a plain install got);
- ``uvloop``: the same on uvloop (which ``uvicorn[standard]`` installs);
- ``workers2``: ``--workers 2``, memory state;
- ``workers2-redis``: ``--workers 2`` on a local redis-server;
- ``single-redis``: one process on Redis (the cost of shared state alone).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

from _bench import (
    child_server,
    cpu_seconds,
    percentile,
    print_table,
    ratio,
    redis_server,
    tree_cpu_seconds,
    write_results,
)
from bench_throughput import Gate, _drive

CONFIGS: dict[str, list[str]] = {
    "single": [],
    "h11": ["--http", "h11"],
    "uvloop": ["--loop", "uvloop"],
    "workers2": ["--workers", "2"],
    "workers2-redis": ["--workers", "2", "--state", "{redis}"],
    "single-redis": ["--state", "{redis}"],
}


@contextlib.contextmanager
def _maybe_redis(needed: bool) -> Iterator[tuple[int | None, str]]:
    if not needed:
        yield None, ""
        return
    with redis_server() as (proc, url):
        yield proc.pid, url


async def _round(gate: Gate, name: str, concurrency: int, rollouts: int, warmup: int) -> Any:
    extra = CONFIGS[name]
    with _maybe_redis(any("{redis}" in a for a in extra)) as (redis_pid, url):
        args = ["sdk", "--turns", "1", "--max-concurrent", str(max(100, 2 * concurrency))]
        args += [a.replace("{redis}", url) for a in extra]
        with child_server(*args) as (proc, port):
            if "--workers" in extra:
                await asyncio.sleep(1.0)  # the forked workers start after the port is printed
            await _drive(gate, port, f"{name}-warm", warmup, concurrency)
            cpu0 = tree_cpu_seconds(proc.pid)
            redis0 = cpu_seconds(redis_pid) if redis_pid else 0.0
            run = await _drive(gate, port, name, rollouts, concurrency)
            cpu1 = tree_cpu_seconds(proc.pid)
            redis1 = cpu_seconds(redis_pid) if redis_pid else 0.0
    return {
        "rollouts_per_s": round(rollouts / run["wall_s"], 1),
        "server_cpu_ms_per_rollout": round((cpu1 - cpu0) * 1000 / rollouts, 3),
        "redis_cpu_ms_per_rollout": round((redis1 - redis0) * 1000 / rollouts, 3),
        "latency_p50_ms": round(percentile(run["latencies"], 0.5) * 1000, 3),
        "latency_p99_ms": round(percentile(run["latencies"], 0.99) * 1000, 3),
    }


async def _run(names: list[str], concurrency: int, rollouts: int, warmup: int, repeats: int) -> Any:
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    async with Gate().running() as gate:
        for _ in range(repeats):  # interleaved, so drift in the machine's load hits all alike
            for name in names:
                rounds[name].append(await _round(gate, name, concurrency, rollouts, warmup))
    return {
        name: {
            **max(runs, key=lambda r: float(r["rollouts_per_s"])),
            "all_rollouts_per_s": [r["rollouts_per_s"] for r in runs],
        }
        for name, runs in rounds.items()
    }


def main() -> None:
    """Run every configuration, print the table with ratios to ``single``, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", type=int, default=64, help="inits kept in flight")
    parser.add_argument("--rollouts", type=int, default=1000, help="measured rollouts per round")
    parser.add_argument("--warmup", type=int, default=100, help="unmeasured rollouts per round")
    parser.add_argument("--repeats", type=int, default=2, help="rounds per configuration")
    parser.add_argument("--only", default=",".join(CONFIGS), help="comma-separated configs")
    args = parser.parse_args()
    names = ["single", *[n for n in args.only.split(",") if n != "single"]]
    started = time.perf_counter()
    results = asyncio.run(_run(names, args.concurrency, args.rollouts, args.warmup, args.repeats))
    base = results["single"]
    rows = []
    for name, run in results.items():
        run["throughput_ratio"] = ratio(run["rollouts_per_s"], base["rollouts_per_s"])
        run["cpu_ratio"] = ratio(
            run["server_cpu_ms_per_rollout"] + run["redis_cpu_ms_per_rollout"],
            base["server_cpu_ms_per_rollout"],
        )
        rows.append(
            [
                name,
                run["rollouts_per_s"],
                run["throughput_ratio"],
                run["server_cpu_ms_per_rollout"],
                run["redis_cpu_ms_per_rollout"],
                run["cpu_ratio"],
                run["latency_p50_ms"],
                run["latency_p99_ms"],
            ]
        )
    print_table(
        f"N={args.concurrency} in flight, 1 LLM turn each, best of {args.repeats} "
        f"({time.perf_counter() - started:.0f} s)",
        [
            "config",
            "rollouts/s",
            "x single",
            "server CPU ms/rollout",
            "redis CPU ms",
            "CPU x single",
            "p50 ms",
            "p99 ms",
        ],
        rows,
    )
    write_results("workers", {"parameters": vars(args), "results": results})


if __name__ == "__main__":
    main()
