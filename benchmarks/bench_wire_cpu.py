"""Server CPU per rollout, v2 and polling against v1: the same agent, the same two chat turns.

One ``osmosis serve`` child runs ``tests/assets/srv_agents.py:ToolAgent`` (an ``add`` tool call,
then the answer); ``_v2.Controller`` (raw ASGI under uvicorn in this process) answers both wires
without faults. Batches of ``--rollouts`` alternate between the wires, ``--rounds`` times each,
``--concurrency`` rollouts in flight; the server's CPU time (user + system, from /proc) is read
around each batch. A v2 rollout sends the tools with each chat call and two callbacks where v1
sends one: that is the protocol's cost, and what the ratio shows. A polling rollout sends no
callback: the benchmark reads its result with ``GET /rollout/{id}/result`` long polls, as the
SDK's ``RolloutClient`` does (one poll parked from the 202 on, then one more per status change).
Goal: v2 / v1 and polling / v1 <= 1.2.

    python benchmarks/bench_wire_cpu.py [--rollouts 1000] [--rounds 3] [--concurrency 32]
        [--no-grader]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

import anyio
import httpx2
from _bench import median, print_table, ratio, verdict, write_results
from _torture import SERVER_KEY, Served, osmosis_serve
from _v2 import Controller, served, v1_body, v2_body

AGENT = "tests/assets/srv_agents.py:ToolAgent"
GOAL = 1.2
PATHS = {"v1": "/v1/rollout/init", "v2": "/rollout", "polling": "/rollout"}
WIRES = tuple(PATHS)
FINISHED = {"success", "failure", "cancelled"}


def polling_body(url: str, rid: str) -> dict[str, object]:
    """What ``RolloutClient.run_rollout`` posts: no callback URL, no controller key."""
    body = v2_body(url, rid)
    for name in ("completion_callback_url", "grader_callback_url", "controller_api_key"):
        del body[name]
    return body


async def batch(
    http: httpx2.AsyncClient,
    child: Served,
    controller: Controller,
    wire: str,
    prefix: str,
    count: int,
    concurrency: int,
    no_grader: bool = False,
) -> float:
    """Run ``count`` rollouts on ``wire``; the server CPU seconds they took."""
    limiter = anyio.Semaphore(concurrency)
    headers = {"Authorization": f"Bearer {SERVER_KEY}"}
    grader = not no_grader

    def build(url: str, rid: str) -> dict[str, object]:
        if wire == "polling":
            return polling_body(url, rid)
        return v1_body(url, rid) if wire == "v1" else v2_body(url, rid, grader=grader)

    async def one(i: int) -> None:
        async with limiter:
            rid = f"{prefix}-{i}"
            ended = controller.waiter(rid)
            url = f"{child.url}{PATHS[wire]}"
            response = await http.post(url, json=build(controller.url, rid), headers=headers)
            assert response.status_code == 202, response.text
            with anyio.fail_after(60):
                if wire == "polling":
                    await read_result(rid, response.json()["polling_lease_token"])
                else:
                    await ended.wait()

    async def read_result(rid: str, lease: str) -> None:
        polled = {**headers, "X-Osmosis-Rollout-Lease": lease}
        while True:
            answer = await http.get(f"{child.url}/rollout/{rid}/result", headers=polled)
            assert answer.status_code == 200, answer.text
            if answer.json()["status"] in FINISHED:
                assert answer.json()["sample"]["reward"] == 1.0, answer.text
                return

    before = child.cpu_s()
    async with anyio.create_task_group() as tasks:
        for i in range(count):
            tasks.start_soon(one, i)
    return child.cpu_s() - before


async def run(args: argparse.Namespace, work: Path) -> dict[str, object]:
    controller = Controller()
    per: dict[str, list[float]] = {wire: [] for wire in WIRES}
    with osmosis_serve(AGENT, work, "--max-concurrent", "256") as child:
        async with served(controller), httpx2.AsyncClient(timeout=60) as http:
            for wire in WIRES:  # warm-up: imports, pools, caches
                await batch(http, child, controller, wire, f"warm-{wire}", 200, args.concurrency)
            for round_ in range(args.rounds):
                for wire in WIRES if round_ % 2 == 0 else WIRES[::-1]:
                    cpu = await batch(
                        http,
                        child,
                        controller,
                        wire,
                        f"{wire}-{round_}",
                        args.rollouts,
                        args.concurrency,
                        args.no_grader,
                    )
                    per[wire].append(cpu / args.rollouts * 1000)
                    print(f"  round {round_ + 1} {wire}: {per[wire][-1]:.3f} ms CPU per rollout")
    v1, v2, polling = median(per["v1"]), median(per["v2"]), median(per["polling"])
    return {
        "rollouts_per_batch": args.rollouts,
        "rounds": args.rounds,
        "concurrency": args.concurrency,
        "v2_grader_callback": not args.no_grader,
        "v1_cpu_ms_per_rollout": [round(x, 3) for x in per["v1"]],
        "v2_cpu_ms_per_rollout": [round(x, 3) for x in per["v2"]],
        "polling_cpu_ms_per_rollout": [round(x, 3) for x in per["polling"]],
        "v1_median_ms": round(v1, 3),
        "v2_median_ms": round(v2, 3),
        "polling_median_ms": round(polling, 3),
        "v2_over_v1": ratio(v2, v1),
        "polling_over_v1": ratio(polling, v1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument(
        "--no-grader", action="store_true", help="v2 without a grader URL: one callback, as v1"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="osmosis-wire-cpu-") as tmp:
        figures = asyncio.run(run(args, Path(tmp)))
    v2_ratio = float(figures["v2_over_v1"])  # type: ignore[arg-type]
    polling_ratio = float(figures["polling_over_v1"])  # type: ignore[arg-type]
    print_table(
        f"Server CPU per rollout, 2 chat turns: {args.rounds} x {args.rollouts:,} per wire",
        ["", "v1", "v2", "polling", "v2 / v1", "polling / v1", "goal"],
        [
            [
                "median ms CPU / rollout",
                figures["v1_median_ms"],
                figures["v2_median_ms"],
                figures["polling_median_ms"],
                v2_ratio,
                polling_ratio,
                f"<= {GOAL} {verdict(max(v2_ratio, polling_ratio) <= GOAL)}",
            ]
        ],
    )
    write_results("wire_cpu", figures)


if __name__ == "__main__":
    main()
