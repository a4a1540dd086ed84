"""A replica that dies loses nothing on protocol v2: 1,000 v2 rollouts over two replicas on one
Redis, one of them killed with SIGKILL while about half of its rollouts are still running.

``bench_replica_kill.py``'s scenario (two ``osmosis serve --state redis://...`` processes, the
agent sleeping 0.5-6 s per rollout) with a v2 controller (``_v2.Controller``) that records every
callback part. After the kill, the survivor must send each orphan's completion and grader
callbacks (both ``failure``) once its lease lapses. Printed: rollouts accepted, ended (both
parts delivered, or pending in the outbox stream), lost and duplicated per part, orphans, and
how long after the kill the orphans' grader callbacks arrived, beside the lease TTL.

    python benchmarks/bench_replica_kill_v2.py [--rollouts 1000] [--lease-ttl 5]

The test suite runs the same scenario with 60 rollouts (tests/test_replicas.py).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import random
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2
from _bench import percentile, print_table, redis_server, write_results
from _v2 import Controller, served, v2_body
from bench_replica_kill import replica

from osmosis_rollout.server.state import open_state

PARTS = ("completion", "grader")


async def _run(rollouts: int, lease_ttl: float, concurrency: int) -> dict[str, Any]:
    controller = Controller(record=True)
    rng = random.Random(14)
    with (
        redis_server() as (_, redis_url),
        tempfile.TemporaryDirectory() as tmp,
        replica(redis_url, lease_ttl, Path(tmp), "a") as (_, url_a),
        replica(redis_url, lease_ttl, Path(tmp), "b") as (proc_b, url_b),
    ):
        async with served(controller), httpx2.AsyncClient(timeout=60) as http:
            accepted: dict[str, str] = {}
            queue = iter(range(rollouts))

            async def sender() -> None:
                for i in queue:
                    rid, target = f"kill-{i}", (url_a if i % 2 else url_b)
                    body = v2_body(controller.url, rid)
                    body["metadata"] = {"sleep_s": round(rng.uniform(0.5, 6.0), 2)}
                    response = await http.post(f"{target}/rollout", json=body)
                    if response.status_code == 202:
                        accepted[rid] = target

            await asyncio.gather(*(sender() for _ in range(concurrency)))
            await asyncio.sleep(1.0)
            on_b = [rid for rid, url in accepted.items() if url == url_b]
            done_on_b = sum(1 for rid in on_b if controller.delivered[(rid, "grader")])
            os.kill(proc_b.pid, signal.SIGKILL)
            killed = time.monotonic()
            proc_b.wait()

            state = open_state(redis_url, outbox_dir=Path(tmp))
            try:
                deadline = killed + 3 * lease_ttl + 60
                while time.monotonic() < deadline:
                    kept = {e.rollout_id for e in await state.outbox_list()}
                    if all(controller.delivered[(r, "grader")] or r in kept for r in accepted):
                        break
                    await asyncio.sleep(0.1)
                await asyncio.sleep(lease_ttl)  # a late duplicate would arrive about now
                entries = await state.outbox_list()
            finally:
                await state.close()

    pending: collections.Counter[tuple[str, str]] = collections.Counter()
    for entry in entries:
        for part in (entry.route or {}).get("pending", PARTS):
            pending[(entry.rollout_id, part)] += 1
    ends = {
        (rid, part): controller.delivered[(rid, part)] + pending[(rid, part)]
        for rid in accepted
        for part in PARTS
    }
    orphan_delays = [
        at - killed
        for rid in on_b
        for part, status, at in controller.seen.get(rid, [])
        if part == "grader" and at > killed
    ]
    return {
        "rollouts": rollouts,
        "accepted": len(accepted),
        "on_killed_replica": len(on_b),
        "finished_on_it_before_kill": done_on_b,
        "orphans_ended_by_the_survivor": len(orphan_delays),
        "lost": {p: sum(1 for (_, q), n in ends.items() if q == p and n == 0) for p in PARTS},
        "duplicated": {p: sum(1 for (_, q), n in ends.items() if q == p and n > 1) for p in PARTS},
        "outbox_stream_entries": len(entries),
        # Each duplicate's deliveries as (part, status): the same status twice is the same body
        # sent again (a replica killed between a callback's 2xx and its lease update).
        "duplicates": {
            f"{rid} {part}": [(p, st) for p, st, _ in controller.seen.get(rid, []) if p == part]
            for (rid, part), n in ends.items()
            if n > 1
        },
        "lease_ttl_s": lease_ttl,
        "orphan_grader_callback_after_kill_s": {
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
    delays = result["orphan_grader_callback_after_kill_s"]
    lost, dup = result["lost"], result["duplicated"]
    print_table(
        f"{args.rollouts} v2 rollouts over two replicas on Redis, one killed with SIGKILL",
        ["", "value"],
        [
            ["accepted", result["accepted"]],
            ["on the killed replica", result["on_killed_replica"]],
            ["  finished before the kill", result["finished_on_it_before_kill"]],
            ["  orphans ended by the survivor", result["orphans_ended_by_the_survivor"]],
            ["lost (completion / grader)", f"{lost['completion']} / {lost['grader']}"],
            ["duplicated (completion / grader)", f"{dup['completion']} / {dup['grader']}"],
            ["outbox stream entries", result["outbox_stream_entries"]],
            ["lease TTL (s)", result["lease_ttl_s"]],
            ["orphan grader callbacks after the kill, min/p50/max (s)", str(list(delays.values()))],
        ],
    )
    write_results("replica_kill_v2", {"parameters": vars(args), "result": result})


if __name__ == "__main__":
    main()
