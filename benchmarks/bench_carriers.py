"""The two HTTP carriers side by side, for the two clients that could use the lean one.

The SDK keeps a second HTTP client (``Http1Transport``, beside ``httpx2``) only while it moves a
user-visible figure by 10% or more. This script measures both candidates in one run, rounds
alternating (the order flipped each round) so a busy spell on the shared machine hurts both:

- **the server's TrainGate client**: server CPU per one-turn rollout (``bench_throughput.py``'s
  round: ``serve()`` on the fast stack, a TrainGate stand-in, N inits in flight), the SDK with
  its default carrier (``sdk``: ``Http1Transport``) against ``OSMOSIS_HTTP_CLIENT=httpx2``
  (``sdk-httpx2``); the figure ``Http1Transport`` was kept for (docs/benchmarks.md, 11.);
- **the real-model backend** (``OpenAICompatibleBackend``, what ``osmosis test --llm-url``
  posts through): this process's CPU per ``complete()`` against an OpenAI-compatible stand-in
  that answers at once, its default carrier (``Http1Transport``) against
  ``OSMOSIS_HTTP_CLIENT=httpx2``; and what a user sees of it: ``osmosis test --llm-url`` of
  the calculator example in process (``run_test``), CPU per row, the same two ways.

    python benchmarks/bench_carriers.py [--rounds 5] [--rollouts 1000] [--posts 2000] [--rows 200]

Reported: each figure per round, the lean/httpx2 ratio of each round (its range and median).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from _bench import HOST, ROOT, child_server, median, print_table, write_results
from bench_throughput import SYSTEM, USER, Gate, _round

from osmosis_rollout.evaluation import RunObserver, TestOptions, run_test
from osmosis_rollout.protocol import CompletionsRequest
from osmosis_rollout.testing.openai_backend import OpenAICompatibleBackend
from osmosis_rollout.testing.records import RolloutRecord
from osmosis_rollout.transport import Http1Transport, Httpx2Transport

CALCULATOR = f"{ROOT}/examples/calculator/agent.py:CalculatorAgent"


def _carrier(name: str) -> None:
    """Make the backends built from now on use ``name``: ``OSMOSIS_HTTP_CLIENT`` is read when
    a backend makes its carrier (``client.default_transport``), as in ``osmosis test``."""
    if name == "httpx2":
        os.environ["OSMOSIS_HTTP_CLIENT"] = "httpx2"
    else:
        os.environ.pop("OSMOSIS_HTTP_CLIENT", None)


async def _backend_round(port: int, carrier: str, posts: int, concurrency: int) -> dict[str, Any]:
    """This process's CPU per ``complete()`` over ``posts`` turns, ``concurrency`` at a time."""
    _carrier(carrier)
    backend = OpenAICompatibleBackend(f"http://{HOST}:{port}/v1", "bench-model", "bench-key")
    expected = Http1Transport if carrier == "lean" else Httpx2Transport
    request = CompletionsRequest(rollout_id="r", messages=[SYSTEM, USER], max_tokens=64)
    record = RolloutRecord(rollout_id="r")
    try:
        for _ in range(20):  # warm: connections open, caches filled
            await backend.complete(request, record)
        assert isinstance(backend.carrier, expected), backend.carrier
        left = iter(range(posts))

        async def worker() -> None:
            for _ in left:
                await backend.complete(request, record)

        cpu0, wall0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        cpu1, wall1 = time.process_time(), time.perf_counter()
    finally:
        await backend.aclose()
        _carrier("lean")
    return {
        "cpu_us_per_post": round((cpu1 - cpu0) * 1e6 / posts, 1),
        "posts_per_s": round(posts / (wall1 - wall0), 1),
    }


async def _test_round(port: int, carrier: str, dataset: Path, rows: int) -> dict[str, Any]:
    """``osmosis test --llm-url`` in this process (``run_test``, the calculator example, 8
    rows at a time): CPU per row, everything included (server, mock TrainGate, backend)."""
    _carrier(carrier)
    options = TestOptions(
        target=CALCULATOR,
        dataset=dataset,
        llm_url=f"http://{HOST}:{port}/v1",
        model="bench-model",
        concurrency=8,
    )
    try:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        report = await run_test(options, RunObserver())
        cpu1, wall1 = time.process_time(), time.perf_counter()
    finally:
        _carrier("lean")
    failed = [row for row in report.rows if row.error_message]
    if failed:
        raise RuntimeError(f"{len(failed)} rows failed: {failed[0].error_message}")
    return {
        "cpu_ms_per_row": round((cpu1 - cpu0) * 1e3 / rows, 3),
        "rows_per_s": round(rows / (wall1 - wall0), 1),
    }


def _ratios(lean: list[float], general: list[float]) -> dict[str, Any]:
    each = [round(a / b, 3) for a, b in zip(lean, general, strict=True)]
    return {"per_round": each, "min": min(each), "max": max(each), "median": median(each)}


async def _run(args: argparse.Namespace, dataset: Path) -> dict[str, Any]:
    server: dict[str, list[dict[str, Any]]] = {"sdk": [], "sdk-httpx2": []}
    backend: dict[str, list[dict[str, Any]]] = {"lean": [], "httpx2": []}
    test: dict[str, list[dict[str, Any]]] = {"lean": [], "httpx2": []}
    async with Gate().running() as gate:
        with child_server("standin") as (_proc, standin_port):
            await _test_round(standin_port, "lean", dataset, args.rows)  # warm: imports, caches
            for i in range(args.rounds):
                order = ["sdk", "sdk-httpx2"] if i % 2 == 0 else ["sdk-httpx2", "sdk"]
                for kind in order:
                    run = await _round(
                        gate, kind, "fast", args.concurrency, args.rollouts, args.warmup
                    )
                    server[kind].append(run)
                carriers = ("lean", "httpx2") if i % 2 else ("httpx2", "lean")
                for carrier in carriers:
                    found = await _backend_round(
                        standin_port, carrier, args.posts, args.backend_concurrency
                    )
                    backend[carrier].append(found)
                for carrier in carriers:
                    rows = await _test_round(standin_port, carrier, dataset, args.rows)
                    test[carrier].append(rows)
    server_cpu = {k: [r["server_cpu_ms_per_rollout"] for r in v] for k, v in server.items()}
    backend_cpu = {k: [r["cpu_us_per_post"] for r in v] for k, v in backend.items()}
    test_cpu = {k: [r["cpu_ms_per_row"] for r in v] for k, v in test.items()}
    return {
        "server": server,
        "backend": backend,
        "test": test,
        "server_cpu_ratio_lean_to_httpx2": _ratios(server_cpu["sdk"], server_cpu["sdk-httpx2"]),
        "backend_cpu_ratio_lean_to_httpx2": _ratios(backend_cpu["lean"], backend_cpu["httpx2"]),
        "test_cpu_ratio_lean_to_httpx2": _ratios(test_cpu["lean"], test_cpu["httpx2"]),
    }


def main() -> None:
    """Run the rounds, print the tables, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds")
    parser.add_argument("--rollouts", type=int, default=1000, help="rollouts per server round")
    parser.add_argument("--warmup", type=int, default=100, help="unmeasured rollouts per round")
    parser.add_argument("--concurrency", type=int, default=16, help="inits in flight")
    parser.add_argument("--posts", type=int, default=2000, help="backend turns per round")
    parser.add_argument("--backend-concurrency", type=int, default=8, help="turns in flight")
    parser.add_argument("--rows", type=int, default=200, help="osmosis test rows per round")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dataset = Path(tmp) / "rows.jsonl"
        row = {"messages": [{"role": "user", "content": "What is 12 + 30?"}]}
        dataset.write_text((json.dumps(row) + "\n") * args.rows)
        results = asyncio.run(_run(args, dataset))
    rows: list[list[Any]] = []
    for kind, runs in results["server"].items():
        cpu = [r["server_cpu_ms_per_rollout"] for r in runs]
        rate = [r["rollouts_per_s"] for r in runs]
        rows.append([f"server, {kind}", "ms CPU/rollout", median(cpu), cpu, median(rate)])
    for carrier, runs in results["backend"].items():
        cpu = [r["cpu_us_per_post"] for r in runs]
        rate = [r["posts_per_s"] for r in runs]
        rows.append([f"backend, {carrier}", "µs CPU/POST", median(cpu), cpu, median(rate)])
    for carrier, runs in results["test"].items():
        cpu = [r["cpu_ms_per_row"] for r in runs]
        rate = [r["rows_per_s"] for r in runs]
        rows.append([f"osmosis test, {carrier}", "ms CPU/row", median(cpu), cpu, median(rate)])
    for name in ("server", "backend", "test"):
        found = results[f"{name}_cpu_ratio_lean_to_httpx2"]
        rows.append(
            [
                f"{name}: lean / httpx2",
                "ratio",
                found["median"],
                found["per_round"],
                f"{found['min']}-{found['max']}",
            ]
        )
    print_table(
        f"Carriers, {args.rounds} alternating rounds (fast stack, N={args.concurrency})",
        ["", "unit", "median", "every round", "per s (median) / range"],
        rows,
    )
    write_results("carriers", {"parameters": vars(args), "results": results})


if __name__ == "__main__":
    main()
