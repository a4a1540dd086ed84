"""Per-turn overhead: what one ``await ctx.chat(messages)`` costs on top of a bare HTTP POST.

An agent runs K LLM turns against a TrainGate stand-in (a separate process on 127.0.0.1 that
answers at once). Each turn's latency as the agent sees it is compared with a bare POST of the
same history to the same stand-in through the same HTTP client; SDK and baseline rollouts
alternate so that drift hits them alike. The SDK's added latency is the difference of the
percentiles. Both are run over the SDK's default ``Http1Transport`` and over ``httpx2`` (what
the SDK used before). A second table
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

from _bench import HOST, child_server, percentile, print_table, ratio, verdict, write_results
from _servers import NEXT_USER, REPLY_BYTES, TOOL

from osmosis_rollout import RolloutAgentLoop, RolloutContext, RolloutRequest, RolloutResult
from osmosis_rollout.client import RetryPolicy, TrainGateClient, default_http_client
from osmosis_rollout.protocol import CompletionsRequest, CompletionsResponse
from osmosis_rollout.rollout import run_rollout
from osmosis_rollout.tools.tool_set import resolve_tools
from osmosis_rollout.transport import Http1Transport, Httpx2Transport, PostTransport

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
    http: PostTransport, url: str, rid: str, turns: int, samples: list[tuple[int, float]]
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
        response = await http.post(f"{url}/v1/chat/completions", body.encode(), headers)
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


#: The four sides, run in turn for every rollout so that drift hits them alike: the bare POST
#: and the SDK, each over ``httpx2`` and over the lean ``Http1Transport`` (the SDK's default;
#: ``sdk-httpx2`` is the SDK as it was before that).
SIDES = ("baseline", "sdk-httpx2", "baseline-lean", "sdk")


async def _over_tcp(port: int, turns: int, rollouts: int, warmup: int) -> dict[str, Any]:
    url = f"http://{HOST}:{port}"
    retry = RetryPolicy()
    agents = {side: TimedAgent(turns) for side in SIDES if side.startswith("sdk")}
    tools = await resolve_tools(agents["sdk"], _request("tools", url))
    samples: dict[str, list[tuple[int, float]]] = {
        side: agents[side].samples if side in agents else [] for side in SIDES
    }
    carriers: dict[str, PostTransport] = {
        "httpx2": Httpx2Transport(default_http_client(retry, None), owned=True),
        "lean": Http1Transport(max_connections=None),
    }
    clients = {
        "sdk": TrainGateClient(transport=carriers["lean"], retry=retry),
        "sdk-httpx2": TrainGateClient(transport=carriers["httpx2"], retry=retry),
    }
    cpu = dict.fromkeys(SIDES, 0.0)
    try:
        for i in range(warmup + rollouts):
            if i == warmup:
                for side in SIDES:
                    samples[side].clear()
                cpu = dict.fromkeys(SIDES, 0.0)
            for side in SIDES:
                started = time.process_time()
                if side in clients:
                    request = _request(f"{side}-{i}", url)
                    channel = clients[side].channel(request)
                    await run_rollout(agents[side], request, channel, tools=tools, deadline_s=60)
                else:
                    carrier = carriers["lean" if side.endswith("lean") else "httpx2"]
                    await _baseline_rollout(carrier, url, f"{side}-{i}", turns, samples[side])
                cpu[side] += time.process_time() - started
    finally:
        for carrier in carriers.values():
            await carrier.aclose()
    per_turn = {k: round(v * 1000 / (rollouts * turns), 4) for k, v in cpu.items()}
    return {
        side: {**_stats(samples[side], turns), "cpu_ms_per_turn": per_turn[side]} for side in SIDES
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

    keys = (
        "p50_ms",
        "p90_ms",
        "p99_ms",
        "first_turn_p50_ms",
        "last_turn_p50_ms",
        "cpu_ms_per_turn",
    )

    def minus(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
        return {key: round(a[key] - b[key], 4) for key in keys}

    sdk, base = tcp["sdk"], tcp["baseline-lean"]
    # The SDK's own overhead: over a bare POST through the same HTTP client.
    overhead = minus(sdk, base)
    before = minus(tcp["sdk-httpx2"], tcp["baseline"])
    met = overhead["p99_ms"] < GOAL_P99_MS
    names = {
        "baseline": "bare httpx2 POST",
        "sdk-httpx2": "SDK ctx.chat over httpx2 (before)",
        "baseline-lean": "bare Http1Transport POST",
        "sdk": "SDK ctx.chat (default: Http1Transport)",
    }
    print_table(
        f"Per-turn latency over TCP, {args.rollouts} rollouts x {args.turns} turns per side",
        ["", "p50 ms", "p90 ms", "p99 ms", "turn 1 p50", f"turn {args.turns} p50", "CPU ms"],
        [
            *([names[side], *(tcp[side][k] for k in keys)] for side in SIDES),
            ["SDK overhead over httpx2 (before)", *before.values()],
            ["SDK overhead over Http1Transport", *overhead.values()],
            ["SDK default / bare httpx2 POST", *(ratio(sdk[k], tcp["baseline"][k]) for k in keys)],
        ],
    )
    print_table(
        "SDK CPU per turn with an in-memory LLM (no HTTP)",
        ["", "p50 ms", "p90 ms", "p99 ms", "turn 1 p50", f"turn {args.turns} p50"],
        [["ctx.chat, in memory", *(memory[k] for k in keys[:-1])]],
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
            "sides": tcp,
            "baseline": base,
            "sdk": sdk,
            "overhead_ms": overhead,
            "overhead_ms_over_httpx2_before": before,
            "sdk_in_memory": memory,
            "goal": {"p99_overhead_ms_below": GOAL_P99_MS, "met": met},
        },
    )


if __name__ == "__main__":
    main()
