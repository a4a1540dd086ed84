"""Throughput: rollouts per second through a real uvicorn on 127.0.0.1, ours vs. a bare baseline.

The server under test runs in its own process: either ``create_app`` under uvicorn (our
``serve()``, with a one-turn agent) or the baseline, a bare Starlette endpoint that answers the
init and posts the same chat turn and completion callback with ``httpx2``. This process plays
TrainGate: it keeps N inits in flight (each worker waits for its rollout's callback before
sending the next) and answers chat turns at once. Rounds alternate baseline and SDK; the best
round of each is reported, with the server process's CPU time per rollout (which does not depend
on how busy the rest of the machine is). Each (stack, N) pair runs ``--repeats`` rounds of each
server; the table reports the median round (by server CPU per rollout).

``--stacks`` lists the HTTP servers to run both apps on (see ``_servers.py``): ``fast`` (uvicorn
on uvloop + httptools: ``serve()``'s default when installed), ``h11`` (uvicorn on asyncio + h11,
the pure-Python fallback) and ``granian``. ``--kinds`` lists the servers (see ``KINDS``): the
baseline and the SDK each with ``httpx2`` and with the lean ``Http1Transport`` for the TrainGate
calls (``sdk-httpx2`` is the SDK as it was before ``Http1Transport`` became its default).

    python benchmarks/bench_throughput.py [--stacks fast,h11] [--concurrency 8,64]
        [--rollouts 1000] [--repeats 3] [--kinds baseline,baseline-lean,sdk-httpx2,sdk]

Goals: at least 70% of the baseline's rollouts/s; server CPU per one-turn rollout <= 2.4 ms on the
fast stack (issue 18).
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
    median,
    percentile,
    print_table,
    ratio,
    verdict,
    write_results,
)
from _servers import STACKS, StandIn

GOAL_RATIO = 0.70
GOAL_CPU_MS = 2.4
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


async def drive(
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


#: The servers compared (``_servers.py`` arguments): the SDK with its default TrainGate client
#: (``Http1Transport``) and with ``httpx2`` (what it used before), and the bare baseline with
#: ``httpx2`` and with the lean client (the floor each client allows).
KINDS: dict[str, list[str]] = {
    "baseline": ["baseline"],
    "baseline-lean": ["baseline", "--client", "lean"],
    "sdk-httpx2": ["sdk", "--client", "httpx2"],
    "sdk": ["sdk"],
}


async def _round(
    gate: Gate, kind: str, stack: str, concurrency: int, rollouts: int, warmup: int
) -> dict[str, Any]:
    args = [*KINDS[kind], "--turns", "1", "--max-concurrent", str(max(100, 2 * concurrency))]
    args += ["--stack", stack]
    with child_server(*args) as (proc, port):
        await drive(gate, port, f"{kind}-warm-{concurrency}", warmup, concurrency)
        cpu0, own0 = cpu_seconds(proc.pid), time.process_time()
        run = await drive(gate, port, f"{kind}-{concurrency}", rollouts, concurrency)
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


def _median_round(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the median server CPU per rollout, plus every round's figures."""
    ordered = sorted(runs, key=lambda r: float(r["server_cpu_ms_per_rollout"]))
    return {
        **ordered[(len(ordered) - 1) // 2],
        "median_rollouts_per_s": median([r["rollouts_per_s"] for r in runs]),
        "all_rollouts_per_s": [r["rollouts_per_s"] for r in runs],
        "all_server_cpu_ms": [r["server_cpu_ms_per_rollout"] for r in runs],
    }


async def _run(
    stacks: list[str],
    kinds: list[str],
    levels: list[int],
    rollouts: int,
    warmup: int,
    repeats: int,
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    async with Gate().running() as gate:
        for concurrency in levels:
            rounds: dict[str, list[dict[str, Any]]] = {
                f"{kind}@{stack}": [] for stack in stacks for kind in kinds
            }
            for _ in range(repeats):  # interleaved, so a busy spell hurts every variant alike
                for stack in stacks:
                    for kind in kinds:
                        run = await _round(gate, kind, stack, concurrency, rollouts, warmup)
                        rounds[f"{kind}@{stack}"].append(run)
            results[str(concurrency)] = {
                variant: _median_round(runs) for variant, runs in rounds.items()
            }
    return results


def main() -> None:
    """Run the rounds, print the tables, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", default="8,64", help="comma-separated N values")
    parser.add_argument("--rollouts", type=int, default=1000, help="measured rollouts per round")
    parser.add_argument("--warmup", type=int, default=100, help="unmeasured rollouts per round")
    parser.add_argument("--repeats", type=int, default=3, help="rounds per server and N")
    parser.add_argument("--stacks", default="fast,h11", help="comma-separated: fast, h11, granian")
    parser.add_argument(
        "--kinds", default=",".join(KINDS), help=f"comma-separated servers: {', '.join(KINDS)}"
    )
    args = parser.parse_args()
    levels = [int(n) for n in args.concurrency.split(",")]
    stacks = args.stacks.split(",")
    unknown = sorted(set(stacks) - set(STACKS))
    if unknown:
        parser.error(f"unknown stack(s) {', '.join(unknown)}; choose from {', '.join(STACKS)}")
    kinds = args.kinds.split(",")
    if set(kinds) - set(KINDS) or not {"baseline", "sdk"} <= set(kinds):
        parser.error(f"--kinds takes baseline, sdk and any of {', '.join(KINDS)}")

    results = asyncio.run(_run(stacks, kinds, levels, args.rollouts, args.warmup, args.repeats))

    rows = []
    goals = []
    for n, by_variant in results.items():
        ratios: dict[str, Any] = {}
        for stack in stacks:
            base, sdk = by_variant[f"baseline@{stack}"], by_variant[f"sdk@{stack}"]
            share = ratio(sdk["median_rollouts_per_s"], base["median_rollouts_per_s"])
            cpu = ratio(sdk["server_cpu_ms_per_rollout"], base["server_cpu_ms_per_rollout"])
            ratios[stack] = {"throughput_ratio": share, "cpu_ratio": cpu}
            for other in ("baseline-lean", "sdk-httpx2"):
                if f"{other}@{stack}" in by_variant:
                    theirs = by_variant[f"{other}@{stack}"]["server_cpu_ms_per_rollout"]
                    ratios[stack][f"cpu_ratio_to_{other}"] = ratio(
                        sdk["server_cpu_ms_per_rollout"], theirs
                    )
            for kind in kinds:
                run = by_variant[f"{kind}@{stack}"]
                rows.append(
                    [
                        f"N={n} {stack} {kind}",
                        run["median_rollouts_per_s"],
                        run["server_cpu_ms_per_rollout"],
                        run["driver_cpu_ms_per_rollout"],
                        run["latency_p50_ms"],
                        run["latency_p99_ms"],
                    ]
                )
            rows.append([f"N={n} {stack} sdk / baseline", share, cpu, "", "", ""])
            for other, value in ratios[stack].items():
                if other.startswith("cpu_ratio_to_"):
                    rows.append([f"N={n} {stack} sdk / {other[13:]}", "", value, "", "", ""])
            goals.append(
                [
                    f"N={n} {stack}: SDK >= {GOAL_RATIO:.0%} of baseline rollouts/s",
                    f"{share:.0%}",
                    verdict(share >= GOAL_RATIO),
                ]
            )
            if stack == "fast":
                measured = sdk["server_cpu_ms_per_rollout"]
                goals.append(
                    [
                        f"N={n} fast: server CPU per rollout <= {GOAL_CPU_MS} ms",
                        f"{measured:.2f} ms",
                        verdict(measured <= GOAL_CPU_MS),
                    ]
                )
        by_variant["ratios"] = ratios
    print_table(
        "Rollouts on 127.0.0.1 (1 LLM turn each; median of "
        f"{args.repeats} rounds by server CPU; SDK / baseline row: rollouts/s and CPU ratios)",
        ["", "rollouts/s", "server CPU ms/rollout", "driver CPU ms", "p50 ms", "p99 ms"],
        rows,
    )
    print_table("Goal", ["goal", "measured", "verdict"], goals)
    write_results(
        "throughput",
        {
            "parameters": vars(args),
            "results": results,
            "goal": {"ratio_at_least": GOAL_RATIO, "server_cpu_ms_at_most": GOAL_CPU_MS},
        },
    )


if __name__ == "__main__":
    main()
