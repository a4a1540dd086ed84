"""Soak on protocol v2: 10,000 tool rollouts through ``osmosis serve`` while the controller fails
about 10% of chat calls and callbacks.

The server is a child process (its default retry policy); the controller (``_v2.Controller``,
raw ASGI under uvicorn on 127.0.0.1 in this process) answers v2's per-rollout chat, completion and
grader URLs, fails ~10% of calls (500, 429, or a 400 that is not retried), and counts each part
it accepted. A trainer keeps ``--concurrency`` rollouts in flight, each until its grader
callback arrives or a callback is refused for good. At the end it prints, per part (completion,
grader): lost (accepted, but neither delivered nor pending in the outbox), duplicated (more than
one), 5xx answers to inits, the server's CPU per rollout, and whether either key leaked into
the server's log or its outbox files.

    python benchmarks/soak_v2.py [--rollouts 10000] [--concurrency 64] [--fault-rate 0.1]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import tempfile
import time
from pathlib import Path

import anyio
import httpx2
from _bench import print_table, verdict, write_results
from _torture import SERVER_KEY, osmosis_serve
from _v2 import CONTROLLER_KEY, LLM_KEY, Controller, outbox_parts, served, v2_body

from osmosis_rollout.redaction import secret_forms

AGENT = "tests/assets/srv_agents.py:ToolAgent"
PARTS = ("completion", "grader")


async def batch(
    http: httpx2.AsyncClient,
    server_url: str,
    controller: Controller,
    prefix: str,
    count: int,
    concurrency: int,
) -> tuple[list[str], collections.Counter[int]]:
    """Run ``count`` rollouts, ``concurrency`` in flight; the accepted ids and init statuses."""
    accepted: list[str] = []
    statuses: collections.Counter[int] = collections.Counter()
    limiter = anyio.Semaphore(concurrency)
    headers = {"Authorization": f"Bearer {SERVER_KEY}"}

    async def one(i: int) -> None:
        async with limiter:
            rid = f"{prefix}-{i}"
            ended = controller.waiter(rid)
            try:
                response = await http.post(
                    f"{server_url}/rollout", json=v2_body(controller.url, rid), headers=headers
                )
            except httpx2.TransportError:
                statuses[0] += 1
                return
            statuses[response.status_code] += 1
            if response.status_code != 202:
                return
            accepted.append(rid)
            if len(accepted) % 1000 == 0:
                print(f"  {prefix}: {len(accepted):,} accepted")
            with anyio.move_on_after(60):  # a result lost for good shows in the tally
                await ended.wait()

    async with anyio.create_task_group() as tasks:
        for i in range(count):
            tasks.start_soon(one, i)
    return accepted, statuses


def tally(
    accepted: list[str], controller: Controller, outbox: Path
) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """Per part: lost, duplicated, and kept in the outbox."""
    pending = outbox_parts(outbox)
    lost = dict.fromkeys(PARTS, 0)
    duplicated = dict.fromkeys(PARTS, 0)
    kept = dict.fromkeys(PARTS, 0)
    for rid in accepted:
        for part in PARTS:
            ends = controller.delivered[(rid, part)] + pending[(rid, part)]
            kept[part] += pending[(rid, part)]
            lost[part] += ends == 0
            duplicated[part] += ends > 1
    return lost, duplicated, kept


async def settle(accepted: list[str], controller: Controller, outbox: Path, limit: float) -> None:
    """Wait until nothing is lost (every part delivered or in the outbox), ``limit`` at most."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        lost, _, _ = tally(accepted, controller, outbox)
        if not any(lost.values()):
            return
        await anyio.sleep(0.5)


async def run(args: argparse.Namespace, work: Path) -> dict[str, object]:
    controller = Controller(fault_rate=args.fault_rate, seed=args.seed)
    outbox = work / "outbox"
    with osmosis_serve(AGENT, work, "--max-concurrent", "256", "--log-level", "info") as child:
        async with served(controller), httpx2.AsyncClient(timeout=60) as http:
            print(f"warm-up: {args.warmup:,} rollouts")
            warm, _ = await batch(http, child.url, controller, "warm", args.warmup, 64)
            await settle(warm, controller, outbox, 120)
            cpu_before = child.cpu_s()
            print(f"soak: {args.rollouts:,} v2 rollouts, {args.fault_rate:.0%} faults")
            started = time.monotonic()
            accepted, statuses = await batch(
                http, child.url, controller, "soak", args.rollouts, args.concurrency
            )
            await settle(accepted, controller, outbox, 600)
            wall = time.monotonic() - started
            cpu = child.cpu_s() - cpu_before
        lost, duplicated, kept = tally(accepted, controller, outbox)
        texts = [child.log.read_text(errors="replace")]
        texts += [p.read_text(errors="replace") for p in outbox.glob("*.json")]
    forms = {f for key in (LLM_KEY, CONTROLLER_KEY) for f in secret_forms(key)}
    leaks = sorted({form for form in forms for text in texts if form in text})
    fivexx = sum(n for status, n in statuses.items() if status >= 500)
    return {
        "rollouts": args.rollouts,
        "accepted": len(accepted),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "lost": lost,
        "duplicated": duplicated,
        "kept_in_outbox": kept,
        "init_5xx": fivexx,
        "faults_injected": dict(sorted(controller.faults.items())),
        "wall_s": round(wall, 1),
        "rollouts_per_s": round(len(accepted) / wall, 1),
        "server_cpu_s": round(cpu, 1),
        "server_cpu_ms_per_rollout": round(cpu / max(1, len(accepted)) * 1000, 2),
        "key_forms_found": leaks,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=10_000)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=64, help="rollouts in flight")
    parser.add_argument("--fault-rate", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=13)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="osmosis-soak-v2-") as tmp:
        figures = asyncio.run(run(args, Path(tmp)))
    lost, dup = figures["lost"], figures["duplicated"]
    assert isinstance(lost, dict)
    assert isinstance(dup, dict)
    print_table(
        f"Soak on v2: {args.rollouts:,} rollouts, {args.fault_rate:.0%} controller faults",
        ["", "value", "goal"],
        [
            ["accepted", figures["accepted"], ""],
            [
                "lost (completion / grader)",
                f"{lost['completion']} / {lost['grader']}",
                f"0 {verdict(not any(lost.values()))}",
            ],
            [
                "duplicated (completion / grader)",
                f"{dup['completion']} / {dup['grader']}",
                f"0 {verdict(not any(dup.values()))}",
            ],
            ["5xx answers to inits", figures["init_5xx"], f"0 {verdict(figures['init_5xx'] == 0)}"],
            ["kept in the outbox", figures["kept_in_outbox"], ""],
            ["faults injected", figures["faults_injected"], ""],
            ["wall s (rollouts/s)", f"{figures['wall_s']} ({figures['rollouts_per_s']})", ""],
            [
                "server CPU s (ms/rollout)",
                f"{figures['server_cpu_s']} ({figures['server_cpu_ms_per_rollout']})",
                "",
            ],
            [
                "key forms found",
                len(figures["key_forms_found"]),  # type: ignore[arg-type]
                f"0 {verdict(not figures['key_forms_found'])}",
            ],
        ],
    )
    write_results("soak_v2", figures)


if __name__ == "__main__":
    main()
