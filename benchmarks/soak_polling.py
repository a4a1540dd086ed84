"""Soak on the polling wire: 10,000 tool rollouts through ``osmosis serve`` while the controller
drops or delays about 10% of its result polls.

The server is a child process with a short result wait (``--poll-wait``, 1 s), so a rollout
sees several long polls. The chat endpoint is ``_v2.Controller`` (raw ASGI under uvicorn on
127.0.0.1 in this process, no faults) answering each turn after a random model latency (up to
``--chat-latency``, 1.5 s), so most polls are parked when they are dropped. A trainer keeps
``--concurrency`` rollouts in flight, each ``POST /rollout`` then ``GET /rollout/{id}/result``
with its lease until the status is an end; before each poll it may, with ``--fault-rate``,
**drop** it (abandon the request mid-wait, after a random part of the wait: the connection is
closed under the server's parked poll, and the poll is sent again at once, as a reconnecting
controller does) or **delay** it (sleep up to ``--max-delay`` seconds first, well inside the
lease). Once a result is in it is read once more.
Everything is bounded: at most ``--max-polls`` polls a rollout and ``--max-seconds`` for the
whole run (then the rollouts still out count as lost, and it stops).

It prints: lost (accepted, but no finished result within the bounds, or the second read
missing), changed (the second read differs from the first), 5xx answers to any request, the
final statuses, the polls dropped and delayed, and the server's CPU per rollout.

    python benchmarks/soak_polling.py [--rollouts 10000] [--concurrency 128] [--fault-rate 0.1]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
from _bench import print_table, verdict, write_results
from _torture import SERVER_KEY, osmosis_serve
from _v2 import LLM_KEY, Controller, served

AGENT = "tests/assets/srv_agents.py:ToolAgent"
LEASE = "X-Osmosis-Rollout-Lease"
ENDS = ("success", "failure", "cancelled")
AUTH = {"Authorization": f"Bearer {SERVER_KEY}"}


def polling_body(url: str, rid: str) -> dict[str, Any]:
    """A polling start (osmosis-ai 0.3.3+'s): the chat URL, the key, no callbacks."""
    return {
        "rollout_id": rid,
        "initial_messages": [{"role": "user", "content": "What is 3 + 4?"}],
        "label": "7",
        "chat_completions_url": f"{url}/v1/rollouts/{rid}",
        "llm_api_key": LLM_KEY,
        "agent_timeout_sec": 600,
        "grader_timeout_sec": 60,
    }


@dataclass
class SlowChat(Controller):
    """``_v2.Controller`` with a model's latency: each chat answer waits up to ``latency_s``
    (random), so a rollout spans several long polls and a dropped poll is usually parked."""

    latency_s: float = 0.0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if self.latency_s > 0 and scope["type"] == "http":
            await anyio.sleep(self._rng.uniform(0.0, self.latency_s))
        await super().__call__(scope, receive, send)


@dataclass
class Tally:
    """What the trainer saw, over every rollout of a batch."""

    accepted: int = 0
    finished: int = 0
    lost: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    statuses: collections.Counter[int] = field(default_factory=collections.Counter)
    ends: collections.Counter[str] = field(default_factory=collections.Counter)
    polls: int = 0
    dropped: int = 0
    delayed: int = 0
    transport_errors: int = 0

    @property
    def fivexx(self) -> int:
        return sum(n for status, n in self.statuses.items() if status >= 500)


@dataclass
class Trainer:
    """The polling controller with faults (see the module docstring)."""

    http: httpx2.AsyncClient
    server_url: str
    chat_url: str
    fault_rate: float
    max_delay_s: float
    max_polls: int
    wait_s: float
    seed: int
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    async def _get(self, tally: Tally, url: str, headers: dict[str, str]) -> httpx2.Response | None:
        try:
            response = await self.http.get(url, headers=headers)
        except httpx2.TransportError:
            tally.transport_errors += 1
            return None
        tally.statuses[response.status_code] += 1
        return response

    async def one(self, tally: Tally, rid: str) -> None:
        try:
            started = await self.http.post(
                f"{self.server_url}/rollout", json=polling_body(self.chat_url, rid), headers=AUTH
            )
        except httpx2.TransportError:
            tally.transport_errors += 1
            return
        tally.statuses[started.status_code] += 1
        if started.status_code != 202:
            return
        tally.accepted += 1
        headers = {**AUTH, LEASE: started.json()["polling_lease_token"]}
        url = f"{self.server_url}/rollout/{rid}/result"
        first: dict[str, Any] | None = None
        for _ in range(self.max_polls):
            roll = self.rng.random()
            if roll < self.fault_rate / 2:  # drop: abandon the poll mid-wait, then reconnect
                tally.dropped += 1
                with anyio.move_on_after(self.rng.uniform(0.01, self.wait_s)):
                    response = await self._get(tally, url, headers)
                    if response is not None and response.status_code == 200:
                        body = response.json()
                        if body["status"] in ENDS:
                            first = body
                            break
                continue
            if roll < self.fault_rate:  # delay the next poll
                tally.delayed += 1
                await anyio.sleep(self.rng.uniform(0.0, self.max_delay_s))
            tally.polls += 1
            response = await self._get(tally, url, headers)
            if response is None or response.status_code in (429, 503):
                await anyio.sleep(0.2)
                continue
            if response.status_code != 200:
                break  # 404/403 for our own lease: lost
            body = response.json()
            if body["status"] in ENDS:
                first = body
                break
        if first is None:
            tally.lost.append(rid)
            return
        tally.finished += 1
        tally.ends[str(first["status"])] += 1
        again = await self._get(tally, url, headers)
        if again is None or again.status_code != 200:
            tally.lost.append(rid)
        elif again.json() != first:
            tally.changed.append(rid)


async def batch(trainer: Trainer, prefix: str, count: int, concurrency: int, until: float) -> Tally:
    """``count`` rollouts, ``concurrency`` in flight; stops starting new ones at ``until``."""
    tally = Tally()
    limiter = anyio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with limiter:
            if time.monotonic() > until:
                return
            await trainer.one(tally, f"{prefix}-{i}")
            if (i + 1) % 1000 == 0:
                print(f"  {prefix}: {i + 1:,} done ({tally.accepted:,} accepted)")

    with anyio.move_on_after(max(0.0, until - time.monotonic()) + 120):
        async with anyio.create_task_group() as tasks:
            for i in range(count):
                tasks.start_soon(one, i)
    return tally


async def run(args: argparse.Namespace, work: Path) -> dict[str, object]:
    controller = Controller(fault_rate=0.0, seed=args.seed)
    env = {"POLL_WAIT_S": str(args.poll_wait)}
    with osmosis_serve(
        AGENT, work, "--max-concurrent", "256", "--log-level", "info", **env
    ) as child:
        timeout = httpx2.Timeout(10.0, read=args.poll_wait + 30)
        limits = httpx2.Limits(max_connections=args.concurrency * 2)
        async with served(controller), httpx2.AsyncClient(timeout=timeout, limits=limits) as http:
            trainer = Trainer(
                http,
                child.url,
                controller.url,
                fault_rate=args.fault_rate,
                max_delay_s=args.max_delay,
                max_polls=args.max_polls,
                wait_s=args.poll_wait,
                seed=args.seed,
            )
            print(f"warm-up: {args.warmup:,} rollouts")
            await batch(trainer, "warm", args.warmup, 64, time.monotonic() + 120)
            cpu_before = child.cpu_s()
            print(f"soak: {args.rollouts:,} polling rollouts, {args.fault_rate:.0%} polls faulted")
            started = time.monotonic()
            tally = await batch(
                trainer, "soak", args.rollouts, args.concurrency, started + args.max_seconds
            )
            wall = time.monotonic() - started
            cpu = child.cpu_s() - cpu_before
        log = child.log.read_text(errors="replace")
    return {
        "rollouts_asked": args.rollouts,
        "accepted": tally.accepted,
        "finished": tally.finished,
        "lost": len(tally.lost),
        "lost_ids": tally.lost[:20],
        "changed": len(tally.changed),
        "changed_ids": tally.changed[:20],
        "fivexx": tally.fivexx,
        "statuses": {str(k): v for k, v in sorted(tally.statuses.items())},
        "ends": dict(sorted(tally.ends.items())),
        "polls": tally.polls,
        "polls_dropped": tally.dropped,
        "polls_delayed": tally.delayed,
        "transport_errors": tally.transport_errors,
        "poll_wait_s": args.poll_wait,
        "wall_s": round(wall, 1),
        "rollouts_per_s": round(tally.accepted / wall, 1) if wall else 0.0,
        "server_cpu_s": round(cpu, 1),
        "server_cpu_ms_per_rollout": round(cpu / max(1, tally.accepted) * 1000, 2),
        "tracebacks_in_log": log.count("Traceback"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=10_000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=128, help="rollouts in flight")
    parser.add_argument(
        "--chat-latency", type=float, default=1.5, help="longest wait of a chat answer, s"
    )
    parser.add_argument("--fault-rate", type=float, default=0.1, help="polls dropped or delayed")
    parser.add_argument("--max-delay", type=float, default=2.0, help="longest delay of a poll, s")
    parser.add_argument("--max-polls", type=int, default=200, help="polls a rollout at most")
    parser.add_argument("--poll-wait", type=float, default=1.0, help="the server's result wait")
    parser.add_argument("--max-seconds", type=float, default=900.0, help="the run's time bound")
    parser.add_argument("--seed", type=int, default=13)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="osmosis-soak-polling-") as tmp:
        figures = asyncio.run(run(args, Path(tmp)))
    print_table(
        f"Soak on the polling wire: {figures['accepted']:,} rollouts, "
        f"{args.fault_rate:.0%} of polls dropped or delayed",
        ["", "value", "goal"],
        [
            ["accepted / finished", f"{figures['accepted']} / {figures['finished']}", ""],
            ["lost", figures["lost"], f"0 {verdict(figures['lost'] == 0)}"],
            ["results changed on a second read", figures["changed"], f"0 {verdict(figures['changed'] == 0)}"],  # noqa: E501
            ["5xx answers", figures["fivexx"], f"0 {verdict(figures['fivexx'] == 0)}"],
            ["final statuses", figures["ends"], ""],
            ["polls (dropped / delayed)", f"{figures['polls']} ({figures['polls_dropped']} / {figures['polls_delayed']})", ""],  # noqa: E501
            ["HTTP statuses", figures["statuses"], ""],
            ["wall s (rollouts/s)", f"{figures['wall_s']} ({figures['rollouts_per_s']})", ""],
            ["server CPU s (ms/rollout)", f"{figures['server_cpu_s']} ({figures['server_cpu_ms_per_rollout']})", ""],  # noqa: E501
            ["tracebacks in the server log", figures["tracebacks_in_log"], f"0 {verdict(figures['tracebacks_in_log'] == 0)}"],  # noqa: E501
        ],
    )  # fmt: skip
    write_results("soak_polling", figures)


if __name__ == "__main__":
    main()
