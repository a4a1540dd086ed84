"""A replica that dies loses nothing: 1,000 rollouts over two replicas on one Redis, one of them
killed with SIGKILL while about half of its rollouts are still running.

Two ``osmosis serve --state redis://...`` processes (the agent sleeps 0.5-6 s per rollout) and a
TrainGate stand-in in this process that records every completion callback. After the kill, the
survivor must send each orphan's ERROR callback once its lease lapses. Printed: rollouts accepted,
ended (callback or outbox stream entry), lost, duplicated, orphans, and how long after the kill
the orphans' callbacks arrived, beside the lease TTL.

    python benchmarks/bench_replica_kill.py [--rollouts 1000] [--lease-ttl 5]

The test suite runs the same scenario with 200 rollouts (tests/test_replicas.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
from _bench import (
    ROOT,
    percentile,
    print_table,
    redis_server,
    stop_process,
    wait_until_serving,
    write_results,
)
from _servers import StandIn
from bench_throughput import Gate

from osmosis_rollout.server.state import open_state

AGENT = f"{ROOT / 'benchmarks' / '_servers.py'}:SleepAgent"


@contextlib.contextmanager
def replica(redis_url: str, lease_ttl: float, workdir: Path, name: str) -> Iterator[Any]:
    """One ``osmosis serve`` on a free port; yields (process, base URL)."""
    log = workdir / f"{name}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OSMOSIS_")}
    command = [sys.executable, "-m", "osmosis_rollout", "serve", AGENT, "--port", "0"]
    command += ["--no-validate", "--state", redis_url, "--lease-ttl", str(lease_ttl)]
    command += ["--outbox-dir", str(workdir / f"outbox-{name}"), "--log-level", "warning"]
    with log.open("wb") as sink:
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env, text=True)
    try:
        yield proc, wait_until_serving(proc, log, f"replica {name}")
    finally:
        stop_process(proc)


async def _run(rollouts: int, lease_ttl: float, concurrency: int) -> dict[str, Any]:
    callbacks: dict[str, list[tuple[str, float]]] = {}

    def completed(body: bytes) -> None:
        data = json.loads(body)
        callbacks.setdefault(data["rollout_id"], []).append((data["status"], time.monotonic()))

    gate = Gate()
    gate.app = StandIn(on_completed=completed)
    rng = random.Random(14)
    with (
        redis_server() as (_, redis_url),
        tempfile.TemporaryDirectory() as tmp,
        replica(redis_url, lease_ttl, Path(tmp), "a") as (_, url_a),
        replica(redis_url, lease_ttl, Path(tmp), "b") as (proc_b, url_b),
    ):
        async with gate.running(), httpx2.AsyncClient(timeout=60) as http:
            accepted: dict[str, str] = {}
            queue = iter(range(rollouts))
            started = time.monotonic()

            async def sender() -> None:
                for i in queue:
                    rid, target = f"kill-{i}", (url_a if i % 2 else url_b)
                    body = {
                        "rollout_id": rid,
                        "server_url": gate.url,
                        "messages": [{"role": "user", "content": f"task {i}"}],
                        "completion_params": {},
                        "metadata": {"sleep_s": round(rng.uniform(0.5, 6.0), 2)},
                        "api_key": "bench-key",
                    }
                    response = await http.post(f"{target}/v1/rollout/init", json=body)
                    if response.status_code == 202:
                        accepted[rid] = target

            await asyncio.gather(*(sender() for _ in range(concurrency)))
            accepted_s = time.monotonic() - started
            await asyncio.sleep(1.0)
            done_on_b = sum(1 for rid, u in accepted.items() if u == url_b and rid in callbacks)
            os.kill(proc_b.pid, signal.SIGKILL)
            killed = time.monotonic()
            proc_b.wait()

            state = open_state(redis_url, outbox_dir=Path(tmp))
            try:
                deadline = killed + 3 * lease_ttl + 60
                while time.monotonic() < deadline:
                    kept = {e.rollout_id for e in await state.outbox_list()}
                    if set(accepted) <= set(callbacks) | kept:
                        break
                    await asyncio.sleep(0.1)
                await asyncio.sleep(lease_ttl)  # a late duplicate would arrive about now
                kept_ids = [e.rollout_id for e in await state.outbox_list()]
            finally:
                await state.close()

    ends = {rid: len(callbacks.get(rid, [])) for rid in accepted}
    for rid in kept_ids:
        ends[rid] = ends.get(rid, 0) + 1
    orphan_delays = [
        calls[0][1] - killed
        for rid, calls in callbacks.items()
        if accepted.get(rid) == url_b and calls[0][0] == "ERROR"
    ]
    return {
        "rollouts": rollouts,
        "accepted": len(accepted),
        "accepted_in_s": round(accepted_s, 2),
        "on_killed_replica": sum(1 for u in accepted.values() if u == url_b),
        "finished_on_it_before_kill": done_on_b,
        "orphans_ended_with_error": len(orphan_delays),
        "ended_once": sum(1 for n in ends.values() if n == 1),
        "lost": sum(1 for n in ends.values() if n == 0),
        "duplicated": sum(1 for n in ends.values() if n > 1),
        "outbox_stream_entries": len(kept_ids),
        "lease_ttl_s": lease_ttl,
        "orphan_callback_after_kill_s": {
            "min": round(min(orphan_delays, default=0.0), 2),
            "p50": round(percentile(orphan_delays, 0.5), 2),
            "max": round(max(orphan_delays, default=0.0), 2),
        },
    }


def main() -> None:
    """Run the scenario once, print and record it."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=1000)
    parser.add_argument("--lease-ttl", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=64, help="inits sent at once")
    args = parser.parse_args()
    result = asyncio.run(_run(args.rollouts, args.lease_ttl, args.concurrency))
    delays = result["orphan_callback_after_kill_s"]
    print_table(
        f"{args.rollouts} rollouts over two replicas on Redis, one killed with SIGKILL",
        ["", "value"],
        [
            ["accepted", result["accepted"]],
            ["on the killed replica", result["on_killed_replica"]],
            ["  finished before the kill", result["finished_on_it_before_kill"]],
            ["  orphans ended with ERROR by the survivor", result["orphans_ended_with_error"]],
            ["ended exactly once (callback or stream entry)", result["ended_once"]],
            ["lost", result["lost"]],
            ["duplicated", result["duplicated"]],
            ["lease TTL (s)", result["lease_ttl_s"]],
            ["orphan callbacks after the kill, min/p50/max (s)", str(list(delays.values()))],
        ],
    )
    write_results("replica_kill", {"parameters": vars(args), "result": result})


if __name__ == "__main__":
    main()
