"""The toolkit's CPU per judged rollout (issue 40) beside an unjudged one, in one process.

The same one-turn agent over the same rows through the pipeline of ``osmosis test`` in process
(``Harness`` + ``run_batch``, the built-in mock LLM, protocol v1), three ways:

- **unjudged** (the baseline): ``run()`` rewards the answer against ``ground_truth`` itself;
- **mock judge**: ``grade()`` returns ``MockJudge().score(...)`` over a three-criterion rubric,
  so the grader phase, the prompt, the verdict, ``reward_components`` and the ``judge_*``
  metrics are all paid for, with no model;
- **HTTP judge**: ``grade()`` returns ``Judge(...).score(...)`` through ``AsgiTransport`` into
  an in-process fake OpenAI-compatible judge answering a fixed verdict: the client's own work
  (the request body, the strict parse) on top; the fake's CPU counts too (it is small: one
  ``json.dumps`` a call).

After one warm-up round of each (imports, first-use caches: not counted), rounds alternate the
three; the lowest CPU time a row of each is reported.

    python benchmarks/bench_judge.py [--rows 500] [--concurrency 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from _bench import print_table, ratio, write_results

from osmosis_rollout.agent import RolloutAgentLoop, RolloutContext
from osmosis_rollout.evaluation.runner import RowInput, RunOptions, run_batch
from osmosis_rollout.judging import Criterion, Judge, JudgeSettings, MockJudge, Rubric, Verdict
from osmosis_rollout.results import RolloutResult
from osmosis_rollout.testing import Harness, MockLLMBackend
from osmosis_rollout.transport import AsgiTransport

RUBRIC = Rubric(
    [
        Criterion("accurate", "States the same facts as the reference answer.", 3),
        Criterion("complete", "Covers every key point of the reference answer.", 2),
        Criterion("clear", "Short, plain and easy to follow."),
    ]
)
_VERDICT = json.dumps(
    {"criteria": [{"name": n, "score": 0.5, "reason": "partly"} for n in RUBRIC.names]}
)
_REPLY = json.dumps(
    {
        "choices": [{"message": {"role": "assistant", "content": _VERDICT}}],
        "usage": {"prompt_tokens": 300, "completion_tokens": 40},
    }
).encode()


async def fake_judge(scope: Any, receive: Any, send: Any) -> None:
    """An OpenAI-compatible judge answering the same verdict to every call."""
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": _REPLY})


class Unjudged(RolloutAgentLoop):
    name = "unjudged"

    def get_tools(self, request: Any) -> list[Any]:
        return []

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = list(ctx.request.messages)
        reply = await ctx.chat(messages)
        truth = str(ctx.request.metadata.get("ground_truth"))
        return ctx.complete([*messages, reply.message], reward=float(truth in reply.content))


class Judged(Unjudged):
    name = "judged"

    def __init__(self, judge: Any) -> None:
        self.judge = judge

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = list(ctx.request.messages)
        reply = await ctx.chat(messages)
        return ctx.complete([*messages, reply.message])

    async def grade(self, ctx: RolloutContext, result: RolloutResult) -> Verdict:
        truth = ctx.request.metadata.get("ground_truth")
        verdict: Verdict = await self.judge.score(RUBRIC, result.final_messages, reference=truth)
        return verdict


def _agent(way: str) -> RolloutAgentLoop:
    if way == "unjudged":
        return Unjudged()
    if way == "mock judge":
        return Judged(MockJudge())
    settings = JudgeSettings(url="http://judge.bench/v1", model="judge")
    return Judged(Judge(settings, transport=AsgiTransport(fake_judge)))


async def _timed_batch(rows: list[RowInput], concurrency: int, way: str) -> dict[str, Any]:
    agent = _agent(way)
    wall, cpu = time.perf_counter(), time.process_time()
    async with Harness(agent, backend=MockLLMBackend(), max_concurrent=concurrency) as harness:
        report = await run_batch(harness, rows, RunOptions(concurrency=concurrency))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {
        "wall_s": round(wall, 3),
        "cpu_ms_per_row": round(cpu * 1000 / len(rows), 3),
        "rows_per_s": round(len(rows) / wall, 1),
        "completed": sum(r.status == "COMPLETED" for r in report.rows),
        "judge_calls": sum(int(r.metrics.get("judge_calls") or 0) for r in report.rows),
    }


def _rows(count: int) -> list[RowInput]:
    return [
        RowInput(
            index=i,
            messages=[{"role": "user", "content": f"Explain fact number {i} in one sentence."}],
            metadata={"ground_truth": f"Fact {i} is explained by a short plain sentence."},
        )
        for i in range(1, count + 1)
    ]


def main() -> None:
    """Alternate the three ways over the same rows; print and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=500, help="dataset rows")
    parser.add_argument("--concurrency", type=int, default=8, help="rollouts at once")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of each")
    args = parser.parse_args()
    rows = _rows(args.rows)
    ways = ("unjudged", "mock judge", "HTTP judge")
    rounds: dict[str, list[dict[str, Any]]] = {way: [] for way in ways}
    for way in ways:  # warm-up, not counted
        asyncio.run(_timed_batch(rows[:50], args.concurrency, way))
    for _ in range(args.repeats):
        for way in ways:
            rounds[way].append(asyncio.run(_timed_batch(rows, args.concurrency, way)))
    best = {way: min(runs, key=lambda r: r["cpu_ms_per_row"]) for way, runs in rounds.items()}
    base = best["unjudged"]["cpu_ms_per_row"]
    print_table(
        f"{args.rows} one-turn rows, concurrency {args.concurrency}, mock LLM, in process (v1)",
        ["", "CPU ms/row", "vs unjudged", "+ms/row", "rows/s", "completed", "judge calls"],
        [
            [way, b["cpu_ms_per_row"], ratio(b["cpu_ms_per_row"], base),
             round(b["cpu_ms_per_row"] - base, 3), b["rows_per_s"], b["completed"],
             b["judge_calls"]]
            for way, b in best.items()
        ],
    )  # fmt: skip
    write_results("judge", {"parameters": vars(args), "results": rounds})


if __name__ == "__main__":
    main()
