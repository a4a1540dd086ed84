"""Memory per parked result poll on the polling wire: ``--polls`` long polls waiting at once.

One ``osmosis serve`` child runs ``tests/assets/srv_agents.py:ToolAgent`` with rollouts that
sleep (no chat call). ``--polls`` rollouts are started; once they are all running the server's
RSS is the baseline; then one ``GET /rollout/{id}/result`` per rollout is sent, each on its own
connection, and left waiting (the result wait is two minutes). The RSS growth over the baseline,
divided by the polls, is what one parked poll costs, its connection included. Then every
rollout is cancelled: each parked poll must answer at once with ``cancelled``.

    python benchmarks/bench_parked_polls.py [--polls 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import anyio
import httpx2
from _bench import print_table, rss_bytes, write_results
from _torture import SERVER_KEY, Served, osmosis_serve

AGENT = "tests/assets/srv_agents.py:ToolAgent"
AUTH = {"Authorization": f"Bearer {SERVER_KEY}"}


def init(rid: str) -> dict[str, object]:
    return {
        "rollout_id": rid,
        "initial_messages": [{"role": "user", "content": "wait"}],
        "metadata": {"no_chat": True, "sleep_s": 600},
        "chat_completions_url": "http://127.0.0.1:9/v1",
    }


async def settle_rss(pid: int, quiet_s: float = 2.0) -> int:
    """The RSS once it stopped growing for ``quiet_s``."""
    last, since = rss_bytes(pid), time.monotonic()
    while time.monotonic() - since < quiet_s:
        await asyncio.sleep(0.25)
        now = rss_bytes(pid)
        if abs(now - last) > 64 * 1024:
            last, since = now, time.monotonic()
    return last


async def run(polls: int, child: Served) -> dict[str, object]:
    limits = httpx2.Limits(max_connections=polls + 16, max_keepalive_connections=polls + 16)
    async with httpx2.AsyncClient(timeout=180, limits=limits) as http:
        leases: dict[str, str] = {}
        for i in range(polls):
            rid = f"parked-{i}"
            response = await http.post(f"{child.url}/rollout", json=init(rid), headers=AUTH)
            assert response.status_code == 202, response.text
            leases[rid] = response.json()["polling_lease_token"]
        baseline = await settle_rss(child.proc.pid)
        answers: dict[str, str] = {}

        async def poll(rid: str) -> None:
            headers = {**AUTH, "X-Osmosis-Rollout-Lease": leases[rid]}
            response = await http.get(f"{child.url}/rollout/{rid}/result", headers=headers)
            answers[rid] = f"{response.status_code} {response.json().get('status')}"

        async with anyio.create_task_group() as tasks:
            for rid in leases:
                tasks.start_soon(poll, rid)
            await asyncio.sleep(1.0)
            parked = await settle_rss(child.proc.pid)
            early = len(answers)
            started = time.monotonic()
            everything = {"all": True}
            cancel = await http.post(f"{child.url}/rollout/cancel", json=everything, headers=AUTH)
            assert cancel.status_code == 200, cancel.text
        woke_s = time.monotonic() - started
    outcomes: dict[str, int] = {}
    for answer in answers.values():
        outcomes[answer] = outcomes.get(answer, 0) + 1
    return {
        "polls": polls,
        "rss_baseline_mb": round(baseline / 2**20, 1),
        "rss_parked_mb": round(parked / 2**20, 1),
        "kb_per_parked_poll": round((parked - baseline) / polls / 1024, 2),
        "answered_before_cancel": early,
        "all_answered_after_cancel_s": round(woke_s, 2),
        "answers": outcomes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--polls", type=int, default=2000)
    args = parser.parse_args()
    slots = str(args.polls + 10)
    with (
        tempfile.TemporaryDirectory(prefix="osmosis-parked-") as tmp,
        osmosis_serve(
            AGENT,
            Path(tmp),
            "--max-concurrent",
            slots,
            MAX_CONNECTIONS=str(2 * args.polls + 100),
            POLL_WAIT_S="120",
            POLL_LEASE_S="300",
        ) as child,
    ):
        figures = asyncio.run(run(args.polls, child))
    print_table(
        f"{args.polls:,} result polls parked at once",
        ["RSS before", "RSS parked", "KB / parked poll", "answered after cancel"],
        [
            [
                f"{figures['rss_baseline_mb']} MB",
                f"{figures['rss_parked_mb']} MB",
                figures["kb_per_parked_poll"],
                f"{figures['all_answered_after_cancel_s']} s: {figures['answers']}",
            ]
        ],
    )
    write_results("parked_polls", figures)


if __name__ == "__main__":
    main()
