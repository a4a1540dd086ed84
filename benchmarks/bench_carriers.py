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
  that answers at once, through ``httpx2`` (its carrier) and through ``Http1Transport`` (the
  same backend with only its POST swapped: the body, the reply's parsing and the usage
  estimate are the same code).

    python benchmarks/bench_carriers.py [--rounds 5] [--rollouts 1000] [--posts 2000]

Reported: each figure per round, the lean/httpx2 ratio of each round (its range and median).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from _bench import HOST, child_server, median, print_table, write_results
from bench_throughput import SYSTEM, USER, Gate, _round

from osmosis_rollout.protocol import CompletionsRequest
from osmosis_rollout.testing.openai_backend import OpenAICompatibleBackend
from osmosis_rollout.testing.records import RolloutRecord
from osmosis_rollout.transport import Http1Transport


class LeanBackend(OpenAICompatibleBackend):
    """The backend with its POST made through ``Http1Transport`` (the happy path only: what a
    turn costs when the server answers 200; the retries are the same loop either way)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lean = Http1Transport(attempt_timeout_s=self.timeout_s)

    async def _post(self, content: bytes) -> Any:
        headers = {"Content-Type": "application/json", **self.extra_headers}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        reply = await self._lean.post(self.url, content, headers)
        if reply.status_code != 200:
            raise RuntimeError(f"the stand-in answered HTTP {reply.status_code}")
        return reply  # Reply has what _parse reads: status_code, headers, json(), text

    async def aclose(self) -> None:
        await self._lean.aclose()
        await super().aclose()


async def _backend_round(port: int, lean: bool, posts: int, concurrency: int) -> dict[str, Any]:
    """This process's CPU per ``complete()`` over ``posts`` turns, ``concurrency`` at a time."""
    kind = LeanBackend if lean else OpenAICompatibleBackend
    backend = kind(f"http://{HOST}:{port}/v1", "bench-model", "bench-key")
    request = CompletionsRequest(rollout_id="r", messages=[SYSTEM, USER], max_tokens=64)
    record = RolloutRecord(rollout_id="r")
    try:
        for _ in range(20):  # warm: connections open, caches filled
            await backend.complete(request, record)
        left = iter(range(posts))

        async def worker() -> None:
            for _ in left:
                await backend.complete(request, record)

        cpu0, wall0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        cpu1, wall1 = time.process_time(), time.perf_counter()
    finally:
        await backend.aclose()
    return {
        "cpu_us_per_post": round((cpu1 - cpu0) * 1e6 / posts, 1),
        "posts_per_s": round(posts / (wall1 - wall0), 1),
    }


def _ratios(lean: list[float], general: list[float]) -> dict[str, Any]:
    each = [round(a / b, 3) for a, b in zip(lean, general, strict=True)]
    return {"per_round": each, "min": min(each), "max": max(each), "median": median(each)}


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    server: dict[str, list[dict[str, Any]]] = {"sdk": [], "sdk-httpx2": []}
    backend: dict[str, list[dict[str, Any]]] = {"lean": [], "httpx2": []}
    async with Gate().running() as gate:
        with child_server("standin") as (_proc, standin_port):
            for i in range(args.rounds):
                order = ["sdk", "sdk-httpx2"] if i % 2 == 0 else ["sdk-httpx2", "sdk"]
                for kind in order:
                    run = await _round(
                        gate, kind, "fast", args.concurrency, args.rollouts, args.warmup
                    )
                    server[kind].append(run)
                for carrier in ("lean", "httpx2") if i % 2 else ("httpx2", "lean"):
                    run = await _backend_round(
                        standin_port, carrier == "lean", args.posts, args.backend_concurrency
                    )
                    backend[carrier].append(run)
    server_cpu = {k: [r["server_cpu_ms_per_rollout"] for r in v] for k, v in server.items()}
    backend_cpu = {k: [r["cpu_us_per_post"] for r in v] for k, v in backend.items()}
    return {
        "server": server,
        "backend": backend,
        "server_cpu_ratio_lean_to_httpx2": _ratios(server_cpu["sdk"], server_cpu["sdk-httpx2"]),
        "backend_cpu_ratio_lean_to_httpx2": _ratios(backend_cpu["lean"], backend_cpu["httpx2"]),
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
    args = parser.parse_args()
    results = asyncio.run(_run(args))
    rows: list[list[Any]] = []
    for kind, runs in results["server"].items():
        cpu = [r["server_cpu_ms_per_rollout"] for r in runs]
        rate = [r["rollouts_per_s"] for r in runs]
        rows.append([f"server, {kind}", "ms CPU/rollout", median(cpu), cpu, median(rate)])
    for carrier, runs in results["backend"].items():
        cpu = [r["cpu_us_per_post"] for r in runs]
        rate = [r["posts_per_s"] for r in runs]
        rows.append([f"backend, {carrier}", "µs CPU/POST", median(cpu), cpu, median(rate)])
    for name in ("server", "backend"):
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
