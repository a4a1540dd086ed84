"""Per-turn overhead: what one ``await ctx.chat(messages)`` costs on top of a bare HTTP POST.

An agent runs K LLM turns against a TrainGate stand-in (a separate process on 127.0.0.1 that
answers at once). Each turn's latency as the agent sees it is compared with a bare ``httpx2``
POST of the same history to the same stand-in; SDK and baseline rollouts alternate so that drift
hits both alike. The SDK's added latency is the difference of the percentiles. A second table
runs the SDK with no network at all (an in-memory LLM), which is the SDK's own CPU per turn.

    python benchmarks/bench_turn_overhead.py [--turns 10] [--rollouts 300]

Goal: p99 overhead under 2 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import httpx2
from _bench import HOST, child_server, percentile, print_table, ratio, verdict, write_results
from _servers import NEXT_USER, REPLY_BYTES, TOOL

from osmosis_rollout import RolloutAgentLoop, RolloutContext, RolloutRequest, RolloutResult
from osmosis_rollout.agent import resolve_tools
from osmosis_rollout.client import RetryPolicy, TrainGateClient
from osmosis_rollout.protocol import CompletionsRequest, CompletionsResponse
from osmosis_rollout.rollout import run_rollout

GOAL_P99_MS = 2.0
SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 8}
USER = {"role": "user", "content": "What is 12 + 30? Show your work."}


class TimedAgent(RolloutAgentLoop):
    """Runs K turns and records each ``ctx.chat`` latency (ms) and its turn number."""

    name = "bench-timed"

    def __init__(self, turns: int) -> None:
        self.turns = turns
        self.samples: list[tuple[int, float]] = []

    def get_tools(self, request: RolloutRequest) -> list[dict[str, Any]]:
        return [TOOL]

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = list(ctx.request.messages)
        for turn in range(self.turns):
            if turn:
                messages.append(NEXT_USER)
            started = time.perf_counter()
            result = await ctx.chat(messages)
            self.samples.append((turn, (time.perf_counter() - started) * 1000))
            messages.append(result.message)
        return ctx.complete(messages, reward=1.0)


class InMemoryLLM:
    """A ``ChatBackend`` that returns one pre-parsed reply: no HTTP, no JSON."""

    def __init__(self) -> None:
        self.reply = CompletionsResponse.model_validate_json(REPLY_BYTES)

    async def chat_completions(
        self, request: CompletionsRequest, *, request_id: str
    ) -> CompletionsResponse:
        return self.reply


def _request(rid: str, url: str) -> RolloutRequest:
    return RolloutRequest(
        rollout_id=rid,
        server_url=url,
        messages=[SYSTEM, USER],
        completion_params={"temperature": 1.0, "max_tokens": 512, "logprobs": True},
        api_key="bench-key",
    )


async def _baseline_rollout(
    http: httpx2.AsyncClient, url: str, rid: str, turns: int, samples: list[tuple[int, float]]
) -> None:
    """K bare POSTs of the growing history; the reply is appended as parsed JSON."""
    messages: list[dict[str, Any]] = [SYSTEM, USER]
    headers = {"Content-Type": "application/json", "Authorization": "Bearer bench-key"}
    reply_message = json.loads(REPLY_BYTES)["choices"][0]["message"]
    for turn in range(turns):
        if turn:
            messages.append(NEXT_USER)
        body = json.dumps(
            {
                "model": "default",
                "rollout_id": rid,
                "messages": messages,
                "temperature": 1.0,
                "max_tokens": 512,
                "logprobs": True,
            }
        )
        started = time.perf_counter()
        response = await http.post(f"{url}/v1/chat/completions", content=body, headers=headers)
        _ = response.content
        samples.append((turn, (time.perf_counter() - started) * 1000))
        messages.append(reply_message)


def _stats(samples: list[tuple[int, float]], turns: int) -> dict[str, float]:
    values = [ms for _, ms in samples]
    return {
        "n": len(values),
        "p50_ms": round(percentile(values, 0.5), 4),
        "p90_ms": round(percentile(values, 0.9), 4),
        "p99_ms": round(percentile(values, 0.99), 4),
        "max_ms": round(max(values), 4),
        "first_turn_p50_ms": round(percentile([ms for t, ms in samples if t == 0], 0.5), 4),
        "last_turn_p50_ms": round(percentile([ms for t, ms in samples if t == turns - 1], 0.5), 4),
    }


async def _over_tcp(port: int, turns: int, rollouts: int, warmup: int) -> dict[str, Any]:
    url = f"http://{HOST}:{port}"
    agent = TimedAgent(turns)
    tools = await resolve_tools(agent, _request("tools", url))
    baseline: list[tuple[int, float]] = []
    cpu = {"sdk": 0.0, "baseline": 0.0}
    timeout = httpx2.Timeout(300.0, connect=10.0)
    limits = httpx2.Limits(max_connections=None, max_keepalive_connections=200)
    async with (
        TrainGateClient(retry=RetryPolicy()) as client,
        httpx2.AsyncClient(timeout=timeout, limits=limits) as http,
    ):
        for i in range(warmup + rollouts):
            if i == warmup:
                agent.samples.clear()
                baseline.clear()
                cpu = {"sdk": 0.0, "baseline": 0.0}
            request = _request(f"r-{i}", url)
            started = time.process_time()
            await run_rollout(agent, request, client.channel(request), tools=tools, deadline_s=60)
            middle = time.process_time()
            await _baseline_rollout(http, url, f"b-{i}", turns, baseline)
            cpu["sdk"] += middle - started
            cpu["baseline"] += time.process_time() - middle
    per_turn = {k: round(v * 1000 / (rollouts * turns), 4) for k, v in cpu.items()}
    return {
        "sdk": {**_stats(agent.samples, turns), "cpu_ms_per_turn": per_turn["sdk"]},
        "baseline": {**_stats(baseline, turns), "cpu_ms_per_turn": per_turn["baseline"]},
    }


async def _in_memory(turns: int, rollouts: int) -> dict[str, float]:
    agent = TimedAgent(turns)
    llm = InMemoryLLM()
    tools = await resolve_tools(agent, _request("tools", "http://traingate.test"))
    for i in range(rollouts):
        if i == rollouts // 10:
            agent.samples.clear()
        request = _request(f"m-{i}", "http://traingate.test")
        await run_rollout(agent, request, llm, tools=tools, deadline_s=60)
    return _stats(agent.samples, turns)


def main() -> None:
    """Run both measurements, print the tables, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=10, help="LLM turns per rollout (K)")
    parser.add_argument("--rollouts", type=int, default=300, help="measured rollouts per side")
    parser.add_argument("--warmup", type=int, default=30, help="unmeasured rollouts per side")
    args = parser.parse_args()

    with child_server("standin") as (_, port):
        tcp = asyncio.run(_over_tcp(port, args.turns, args.rollouts, args.warmup))
    memory = asyncio.run(_in_memory(args.turns, args.rollouts))

    sdk, base = tcp["sdk"], tcp["baseline"]
    overhead = {
        key: round(sdk[key] - base[key], 4)
        for key in (
            "p50_ms",
            "p90_ms",
            "p99_ms",
            "first_turn_p50_ms",
            "last_turn_p50_ms",
            "cpu_ms_per_turn",
        )
    }
    met = overhead["p99_ms"] < GOAL_P99_MS
    print_table(
        f"Per-turn latency over TCP, {args.rollouts} rollouts x {args.turns} turns per side",
        ["", "p50 ms", "p90 ms", "p99 ms", "turn 1 p50", f"turn {args.turns} p50", "CPU ms"],
        [
            ["bare httpx2 POST (baseline)", *(base[k] for k in overhead)],
            ["SDK ctx.chat", *(sdk[k] for k in overhead)],
            ["SDK overhead", *overhead.values()],
            ["ratio SDK / baseline", *(ratio(sdk[k], base[k]) for k in overhead)],
        ],
    )
    print_table(
        "SDK CPU per turn with an in-memory LLM (no HTTP)",
        ["", "p50 ms", "p90 ms", "p99 ms", "turn 1 p50", f"turn {args.turns} p50"],
        [["ctx.chat, in memory", *(memory[k] for k in list(overhead)[:-1])]],
    )
    print_table(
        "Goal",
        ["goal", "measured", "verdict"],
        [[f"p99 overhead < {GOAL_P99_MS} ms", f"{overhead['p99_ms']:.3f} ms", verdict(met)]],
    )
    write_results(
        "turn_overhead",
        {
            "parameters": vars(args),
            "baseline": base,
            "sdk": sdk,
            "overhead_ms": overhead,
            "sdk_in_memory": memory,
            "goal": {"p99_overhead_ms_below": GOAL_P99_MS, "met": met},
        },
    )


if __name__ == "__main__":
    main()
