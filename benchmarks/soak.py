"""Soak: 10,000 tool rollouts through ``osmosis serve`` while TrainGate fails about 10% of calls.

The server is a child process (the toolkit's default retry policy, a short record TTL); the
TrainGate side is a ``MockTrainGate`` behind a ``FaultyGate`` (chat 500/429, callback 500 or
400, every error body echoing the bearer key) on 127.0.0.1 in this process. Every init carries a
canary key full of escapes. At the end it prints:

- lost (accepted, but neither a callback nor an outbox file), duplicated (more than one), 5xx
  answers to inits;
- the server's RSS at start, after a warm-up batch (the baseline), right after the run, and once
  the run's finished-rollout records have expired (goal: at most 1.2x the baseline);
- whether any form of the canary key is in the server's log or its outbox files.

    python benchmarks/soak.py [--rollouts 10000] [--concurrency 64] [--fault-rate 0.1]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import tempfile
import time
from pathlib import Path

import anyio
import httpx2
from _bench import print_table, ratio, verdict, write_results
from _torture import SERVER_KEY, FaultyGate, Served, osmosis_serve, tally, valid_init

from osmosis_rollout.protocol import RolloutRequest
from osmosis_rollout.redaction import secret_forms
from osmosis_rollout.testing import Harness, MockTrainGate, ScriptedBackend

AGENT = "tests/assets/srv_agents.py:ToolAgent"
CANARY = 'canary-"7f3a"\\b/%2F+key\'9'
ADD_CALL = {
    "content": None,
    "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a":3,"b":4}'}}
    ],
}
ANSWER = {"content": "3 + 4 = 7"}
GOAL_RSS_RATIO = 1.2


async def batch(
    harness: Harness,
    gate: MockTrainGate,
    faulty: FaultyGate,
    prefix: str,
    count: int,
    concurrency: int,
) -> tuple[list[str], collections.Counter[int]]:
    """Run ``count`` rollouts, ``concurrency`` in flight at a time as a trainer keeps them (a
    slot frees when the rollout's callback arrives or is refused for good); the accepted ids
    and the init statuses."""
    assert harness.server_http is not None
    http = harness.server_http
    accepted: list[str] = []
    statuses: collections.Counter[int] = collections.Counter()
    limiter = anyio.Semaphore(concurrency)
    started = time.monotonic()

    async def one(i: int) -> None:
        async with limiter:
            rid = f"{prefix}-{i}"
            request = RolloutRequest.model_validate(valid_init(rid, gate.base_url, CANARY))
            try:
                _, response = await gate.init_rollout(http, request, server_key=SERVER_KEY)
            except httpx2.TransportError:
                statuses[0] += 1
                return
            statuses[response.status_code] += 1
            if response.status_code == 202:
                accepted.append(rid)
                if len(accepted) % 1000 == 0:
                    print(
                        f"  {prefix}: {len(accepted):,} accepted,"
                        f" {time.monotonic() - started:.0f} s"
                    )
                record = gate.records[rid]
                with anyio.move_on_after(60):  # a result lost for good shows in the tally
                    while not record.done.is_set() and rid not in faulty.refused:  # noqa: ASYNC110
                        await anyio.sleep(0.05)

    async with anyio.create_task_group() as tasks:
        for i in range(count):
            tasks.start_soon(one, i)
    return accepted, statuses


async def settle(gate: MockTrainGate, outbox: Path, accepted: list[str], timeout_s: float) -> None:
    """Wait until every accepted rollout has ended (callback or outbox file)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not tally(accepted, gate, outbox).lost:
            return
        await anyio.sleep(0.5)


async def run(args: argparse.Namespace, work: Path) -> dict[str, object]:
    gate = MockTrainGate(ScriptedBackend([ADD_CALL, ANSWER]))
    faulty = FaultyGate(gate.app, rate=args.fault_rate, seed=args.seed)
    gate.app = faulty  # type: ignore[assignment]  # any ASGI app will do for the listener
    outbox = work / "outbox"
    ttl = args.record_ttl
    with osmosis_serve(
        AGENT,
        work,
        "--max-concurrent",
        "256",
        "--log-level",
        "info",
        RECORD_TTL_S=str(ttl),
    ) as served:
        rss_start = served.rss_mb()
        peaks: dict[str, float] = {"rss_mb": 0.0, "threads": 0, "in_flight": 0}
        async with Harness(server_url=served.url, gate=gate, server_key=SERVER_KEY) as harness:
            print(f"warm-up: {args.warmup:,} rollouts")
            warm, _ = await batch(harness, gate, faulty, "warm", args.warmup, args.concurrency)
            await settle(gate, outbox, warm, 120)
            await anyio.sleep(ttl + ttl / 2 + 1)  # the warm-up's records expire too
            rss_before = served.rss_mb()
            cpu_before = served.cpu_s()
            print(f"soak: {args.rollouts:,} rollouts, {args.fault_rate:.0%} faults")
            started = time.monotonic()
            async with anyio.create_task_group() as sampler:
                sampler.start_soon(sample, served, harness, peaks)
                accepted, statuses = await batch(
                    harness, gate, faulty, "soak", args.rollouts, args.concurrency
                )
                sampler.cancel_scope.cancel()
            await settle(gate, outbox, accepted, 600)
            wall = time.monotonic() - started
            cpu = served.cpu_s() - cpu_before
            rss_peak_now = served.rss_mb()
            print(f"waiting {ttl * 1.5 + 1:.0f} s for the records to expire")
            await anyio.sleep(ttl + ttl / 2 + 1)
            rss_after = served.rss_mb()
            health = (await harness.server_http.get("/health")).json()  # type: ignore[union-attr]
        result = tally(accepted, gate, outbox)
        leaks = _canary_leaks(served, outbox)
    duplicate_findings = [f for f in gate.findings if f.code == "duplicate_completion"]
    fivexx = sum(n for status, n in statuses.items() if status >= 500)
    return {
        "rollouts": args.rollouts,
        "accepted": len(accepted),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "lost": len(result.lost),
        "duplicated": len(result.duplicated) + len(duplicate_findings),
        "init_5xx": fivexx,
        "delivered": result.delivered,
        "outboxed": result.outboxed,
        "faults_injected": dict(sorted(faulty.injected.items())),
        "wall_s": round(wall, 1),
        "rollouts_per_s": round(len(accepted) / wall, 1),
        "server_cpu_s": round(cpu, 1),
        "server_cpu_ms_per_rollout": round(cpu / max(1, len(accepted)) * 1000, 2),
        "rss_start_mb": round(rss_start, 1),
        "rss_before_mb": round(rss_before, 1),
        "rss_end_of_run_mb": round(rss_peak_now, 1),
        "rss_after_expiry_mb": round(rss_after, 1),
        "rss_after_over_before": ratio(rss_after, rss_before),
        "completed_rollouts_health": health.get("completed_rollouts"),
        "peak_rss_mb_during_run": round(peaks["rss_mb"], 1),
        "peak_threads_during_run": peaks["threads"],
        "peak_rollouts_in_flight": peaks["in_flight"],
        "canary_forms_found": leaks,
    }


async def sample(served: Served, harness: Harness, peaks: dict[str, float]) -> None:
    """Every second: the server's RSS, threads and rollouts in flight; keep the peaks."""
    assert harness.server_http is not None
    while True:
        peaks["rss_mb"] = max(peaks["rss_mb"], served.rss_mb())
        peaks["threads"] = max(peaks["threads"], served.threads())
        with contextlib.suppress(httpx2.HTTPError, ValueError):
            health = (await harness.server_http.get("/health")).json()
            in_flight = health["active_rollouts"] + health["queued_rollouts"]
            peaks["in_flight"] = max(peaks["in_flight"], in_flight)
        await anyio.sleep(1)


def _canary_leaks(served: Served, outbox: Path) -> list[str]:
    texts = [served.log.read_text(errors="replace")]
    texts += [p.read_text(errors="replace") for p in outbox.glob("*.json")]
    found = set()
    for text in texts:
        found |= {form for form in secret_forms(CANARY) if form in text}
    return sorted(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=10_000)
    parser.add_argument("--warmup", type=int, default=1_000)
    parser.add_argument("--concurrency", type=int, default=64, help="inits in flight")
    parser.add_argument("--fault-rate", type=float, default=0.1)
    parser.add_argument("--record-ttl", type=float, default=10.0, help="server record TTL, s")
    parser.add_argument("--seed", type=int, default=13)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="osmosis-soak-") as tmp:
        figures = asyncio.run(run(args, Path(tmp)))
    ok_ratio = float(figures["rss_after_over_before"]) <= GOAL_RSS_RATIO  # type: ignore[arg-type]
    print_table(
        f"Soak: {args.rollouts:,} rollouts, {args.fault_rate:.0%} TrainGate faults",
        ["", "value", "goal"],
        [
            ["accepted", figures["accepted"], ""],
            ["lost", figures["lost"], f"0 {verdict(figures['lost'] == 0)}"],
            ["duplicated", figures["duplicated"], f"0 {verdict(figures['duplicated'] == 0)}"],
            ["5xx answers to inits", figures["init_5xx"], f"0 {verdict(figures['init_5xx'] == 0)}"],
            ["delivered / outbox", f"{figures['delivered']} / {figures['outboxed']}", ""],
            ["faults injected", figures["faults_injected"], ""],
            ["wall s (rollouts/s)", f"{figures['wall_s']} ({figures['rollouts_per_s']})", ""],
            [
                "server CPU s (ms/rollout)",
                f"{figures['server_cpu_s']} ({figures['server_cpu_ms_per_rollout']})",
                "",
            ],
            ["RSS at start MB", figures["rss_start_mb"], ""],
            ["RSS before (after warm-up) MB", figures["rss_before_mb"], ""],
            ["RSS at the end of the run MB", figures["rss_end_of_run_mb"], ""],
            [
                "peak RSS MB / threads / rollouts in flight",
                f"{figures['peak_rss_mb_during_run']} / {figures['peak_threads_during_run']}"
                f" / {figures['peak_rollouts_in_flight']}",
                "",
            ],
            ["RSS after records expired MB", figures["rss_after_expiry_mb"], ""],
            [
                "after / before",
                figures["rss_after_over_before"],
                f"<= {GOAL_RSS_RATIO} {verdict(ok_ratio)}",
            ],
            [
                "canary key forms found",
                len(figures["canary_forms_found"]),
                f"0 {verdict(not figures['canary_forms_found'])}",
            ],  # type: ignore[arg-type]
        ],
    )
    write_results("soak", figures)


if __name__ == "__main__":
    main()
