"""The OpenAI-compatible endpoint's cost per turn, side by side with ``ctx.chat``.

Four agents run the same K-turn rollouts (the history grows each turn) on an in-memory LLM (no
HTTP, no JSON: what is left is the SDK's own work): ``ctx.chat`` (the baseline); the
endpoint's in-process transport driven by a bare ``httpx2`` client (the endpoint alone: the
body parsed, the turn run through ``ctx.chat``, the reply written back); ``ctx.openai_client()``
(the same plus the ``openai`` package's own request building and response models); and the
loopback listener over a real 127.0.0.1 socket (what a subprocess harness pays, less its
process). Sides alternate rollout by rollout so that drift hits them alike; each turn is timed
inside the agent. The added latency is each side's percentile minus the baseline's.

    python benchmarks/bench_openai_endpoint.py [--turns 10] [--rollouts 200]

Goal: the endpoint adds at most 0.5 ms p50 per turn in process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import httpx2
from _bench import percentile, print_table, verdict, write_results
from _servers import NEXT_USER, REPLY_BYTES, TOOL

from osmosis_rollout import RolloutAgentLoop, RolloutContext, RolloutRequest, RolloutResult
from osmosis_rollout.endpoint.inprocess import IN_PROCESS_BASE_URL, InProcessTransport
from osmosis_rollout.protocol import CompletionsRequest, CompletionsResponse
from osmosis_rollout.rollout import run_rollout
from osmosis_rollout.tools.tool_set import resolve_tools

GOAL_P50_MS = 0.5
SIDES = ("ctx.chat", "endpoint", "openai client", "loopback")
SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 8}
USER = {"role": "user", "content": "What is 12 + 30? Show your work."}


class InMemoryLLM:
    """A ``ChatBackend`` that returns one pre-parsed reply."""

    def __init__(self) -> None:
        self.reply = CompletionsResponse.model_validate_json(REPLY_BYTES)

    async def chat_completions(
        self, request: CompletionsRequest, *, request_id: str
    ) -> CompletionsResponse:
        return self.reply


class TimedAgent(RolloutAgentLoop):
    """K turns on one side; records each turn's latency in ms."""

    name = "bench-endpoint"

    def __init__(self, turns: int) -> None:
        self.turns = turns
        self.side = "ctx.chat"
        self.samples: dict[str, list[float]] = {side: [] for side in SIDES}

    def get_tools(self, request: RolloutRequest) -> list[dict[str, Any]]:
        return [TOOL]

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages: list[dict[str, Any]] = list(ctx.request.messages)
        turn = await self._turner(ctx)
        out = self.samples[self.side]
        for index in range(self.turns):
            if index:
                messages.append(NEXT_USER)
            started = time.perf_counter()
            reply = await turn(messages)
            out.append((time.perf_counter() - started) * 1000)
            messages.append(reply)
        return ctx.complete(messages, reward=1.0)

    async def _turner(self, ctx: RolloutContext) -> Any:
        if self.side == "ctx.chat":

            async def chat(messages: list[dict[str, Any]]) -> dict[str, Any]:
                return (await ctx.chat(messages)).message

            return chat
        if self.side == "openai client":
            client = ctx.openai_client()

            async def sdk(messages: list[dict[str, Any]]) -> dict[str, Any]:
                done = await client.chat.completions.create(
                    model="policy", messages=messages, tools=[TOOL]
                )
                return done.choices[0].message.model_dump(exclude_none=True)  # type: ignore[no-any-return]

            return sdk
        if self.side == "endpoint":
            http = httpx2.AsyncClient(transport=InProcessTransport(ctx._openai_door().endpoint()))
            url = f"{IN_PROCESS_BASE_URL}/chat/completions"
            headers: dict[str, str] = {}
        else:
            http = self.loopback
            url = f"{ctx.openai_base_url}/chat/completions"
            headers = {"authorization": f"Bearer {ctx.openai_api_key}"}

        async def post(messages: list[dict[str, Any]]) -> dict[str, Any]:
            body = json.dumps({"model": "policy", "messages": messages, "tools": [TOOL]})
            reply = await http.post(url, content=body, headers=headers)
            return reply.json()["choices"][0]["message"]  # type: ignore[no-any-return]

        return post


def _request(rid: str) -> RolloutRequest:
    return RolloutRequest(
        rollout_id=rid,
        server_url="http://traingate.test",
        messages=[SYSTEM, USER],
        completion_params={"temperature": 1.0},
    )


async def _measure(turns: int, rollouts: int, warmup: int) -> dict[str, list[float]]:
    agent = TimedAgent(turns)
    llm = InMemoryLLM()
    tools = await resolve_tools(agent, _request("tools"))
    async with httpx2.AsyncClient() as loopback:
        agent.loopback = loopback  # type: ignore[attr-defined]
        for i in range(warmup + rollouts):
            if i == warmup:
                for samples in agent.samples.values():
                    samples.clear()
            for side in SIDES:
                agent.side = side
                await run_rollout(agent, _request(f"r-{i}-{side}"), llm, tools=tools)
    return agent.samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=10, help="LLM turns per rollout")
    parser.add_argument("--rollouts", type=int, default=200, help="measured rollouts per side")
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured rollouts per side")
    args = parser.parse_args()
    samples = asyncio.run(_measure(args.turns, args.rollouts, args.warmup))
    base = {q: percentile(samples["ctx.chat"], q) for q in (0.5, 0.9, 0.99)}
    rows = []
    results: dict[str, Any] = {"turns": args.turns, "rollouts": args.rollouts, "sides": {}}
    for side in SIDES:
        figures = {q: percentile(samples[side], q) for q in (0.5, 0.9, 0.99)}
        added = {q: figures[q] - base[q] for q in figures}
        rows.append([side, figures[0.5], figures[0.9], figures[0.99], added[0.5], added[0.99]])
        results["sides"][side] = {
            "p50_ms": round(figures[0.5], 4),
            "p90_ms": round(figures[0.9], 4),
            "p99_ms": round(figures[0.99], 4),
            "added_p50_ms": round(added[0.5], 4),
            "added_p99_ms": round(added[0.99], 4),
        }
    print_table(
        f"per turn, {args.turns} turns x {args.rollouts} rollouts a side (in-memory LLM)",
        ["side", "p50 ms", "p90 ms", "p99 ms", "added p50", "added p99"],
        rows,
    )
    endpoint = results["sides"]["endpoint"]["added_p50_ms"]
    print(f"endpoint added p50 {endpoint:.3f} ms (goal <= {GOAL_P50_MS} ms): ", end="")
    from _bench import console

    console.print(verdict(endpoint <= GOAL_P50_MS))
    results["goal_added_p50_ms"] = GOAL_P50_MS
    write_results("openai_endpoint", results)


if __name__ == "__main__":
    main()
