"""``osmosis test`` throughput: rows per second on a generated 1,000-row dataset, mock LLM.

The calculator example (``examples/calculator``) runs over generated arithmetic rows with the
built-in mock LLM with ``--mock-policy all`` (one tool-call turn, then an answer: two LLM turns
and four tool calls a row, as the mock did before it walked the agent).
Three ways, same rows, same concurrency:

- ``osmosis test`` as users run it (a subprocess; its own wall time and the batch time it
  reports), with the results file;
- the batch runner in-process (``Harness`` + ``run_batch``: the real server app and mock
  TrainGate over ASGI, no CLI, no progress bar);
- the baseline: the same agent and mock LLM called directly through ``run_rollout`` with an
  in-memory LLM channel: no HTTP, no server, no mock TrainGate.

Each way runs ``--repeats`` times, alternating; the table shows the best rows/s (wall) and the
lowest CPU time a row (the in-process ways: this process's CPU; ``osmosis test``: the child's).

    python benchmarks/bench_test_throughput.py [--rows 1000] [--concurrency 8,32] [--repeats 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _bench import ROOT, print_table, ratio, write_results

from osmosis_rollout.evaluation.datasets import load_dataset
from osmosis_rollout.evaluation.runner import RowInput, RunOptions, run_batch, summarise
from osmosis_rollout.loader import load_agent
from osmosis_rollout.protocol import CompletionsRequest, CompletionsResponse, RolloutRequest
from osmosis_rollout.rollout import run_rollout
from osmosis_rollout.testing import Harness, RolloutRecord
from osmosis_rollout.testing.backends import MockLLMBackend
from osmosis_rollout.tools.tool_set import resolve_tools

TARGET = "examples/calculator/agent.py:CalculatorAgent"
SYSTEM = (
    "You are a careful calculator. Use the tools for every arithmetic step, then answer with "
    "the number only."
)
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def write_dataset(path: Path, rows: int, seed: int = 7) -> None:
    """``rows`` arithmetic questions in the calculator example's JSONL shape."""
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as out:
        for _ in range(rows):
            a, b, op = rng.randint(1, 999), rng.randint(1, 999), rng.choice(list(OPS))
            row = {
                "system_prompt": SYSTEM,
                "user_prompt": f"What is {a} {op} {b}?",
                "ground_truth": str(OPS[op](a, b)),
            }
            out.write(json.dumps(row) + "\n")


class DirectLLM:
    """A ``ChatBackend`` that hands each turn straight to the mock LLM (no HTTP)."""

    def __init__(self, backend: MockLLMBackend, record: RolloutRecord) -> None:
        self.backend = backend
        self.record = record

    async def chat_completions(
        self, request: CompletionsRequest, *, request_id: str
    ) -> CompletionsResponse:
        self.record.chats.append(request)
        reply = await self.backend.complete(request, self.record)
        self.record.replies.append(reply)
        return reply


def _cli(dataset: Path, concurrency: int, out: Path) -> dict[str, Any]:
    osmosis = Path(sys.executable).parent / "osmosis"
    command = [str(osmosis)] if osmosis.exists() else [sys.executable, "-m", "osmosis_rollout"]
    command += [
        "test",
        TARGET,
        "--dataset",
        str(dataset),
        "--concurrency",
        str(concurrency),
        "--output",
        str(out),
        "--json",
        "--mock-policy",
        "all",  # the figures below are of one tool-call turn a row
    ]
    started = time.perf_counter()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - children.ru_utime) + (after.ru_stime - children.ru_stime)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"osmosis test exited {done.returncode}:\n{done.stderr[-3000:]}")
    summary = json.loads(done.stdout[done.stdout.index("{") :])
    return {
        "process_wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "batch_wall_s": summary["wall_s"],
        "completed": summary["completed"],
        "passed": summary["passed"],
    }


async def _runner(rows: list[RowInput], concurrency: int) -> dict[str, Any]:
    agent = load_agent(TARGET)
    cpu = time.process_time()
    async with Harness(
        agent, backend=MockLLMBackend(policy="all"), max_concurrent=concurrency
    ) as harness:
        report = await run_batch(harness, rows, RunOptions(concurrency=concurrency))
    summary = summarise(report)
    return {
        "cpu_s": round(time.process_time() - cpu, 3),
        "batch_wall_s": summary["wall_s"],
        "completed": summary["completed"],
        "passed": summary["passed"],
    }


async def _direct(rows: list[RowInput], concurrency: int) -> dict[str, Any]:
    agent = load_agent(TARGET)
    backend = MockLLMBackend(policy="all")
    limiter = asyncio.Semaphore(concurrency)
    completed = 0

    async def one(row: RowInput) -> None:
        nonlocal completed
        async with limiter:
            request = RolloutRequest(
                rollout_id=f"row-{row.index}",
                server_url="http://traingate.test",
                messages=row.messages,
                completion_params={},
                metadata=row.metadata,
            )
            tools = await resolve_tools(agent, request)
            record = RolloutRecord(rollout_id=request.rollout_id, tools=tools)
            response = await run_rollout(agent, request, DirectLLM(backend, record), tools=tools)
            completed += response.status.value == "COMPLETED"

    started, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(one(row) for row in rows))
    return {
        "batch_wall_s": round(time.perf_counter() - started, 3),
        "cpu_s": round(time.process_time() - cpu, 3),
        "completed": completed,
    }


def main() -> None:
    """Generate the dataset, run the three ways per concurrency, print, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1000, help="dataset rows")
    parser.add_argument("--concurrency", default="8,32", help="comma-separated --concurrency")
    parser.add_argument("--repeats", type=int, default=2, help="rounds of each way")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]

    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        dataset = Path(tmp) / "rows.jsonl"
        write_dataset(dataset, args.rows)
        rows = [
            RowInput(index=r.index, messages=r.messages, metadata=r.metadata)
            for r in load_dataset(dataset)
        ]
        rounds: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for _ in range(args.repeats):
            for level in levels:
                by_way = rounds.setdefault(str(level), {"direct": [], "runner": [], "cli": []})
                by_way["direct"].append(asyncio.run(_direct(rows, level)))
                by_way["runner"].append(asyncio.run(_runner(rows, level)))
                by_way["cli"].append(_cli(dataset, level, Path(tmp) / f"results-{level}.jsonl"))

    table = []
    results: dict[str, dict[str, Any]] = {}
    for key, by_way in rounds.items():
        best = results[key] = {}
        for way, runs in by_way.items():
            best[way] = min(runs, key=lambda r: r["batch_wall_s"]) | {
                "cpu_s": min(r["cpu_s"] for r in runs),
                "rounds": runs,
            }
        base = args.rows / best["direct"]["batch_wall_s"]
        for way, label, wall_key in (
            ("direct", "baseline: agent + mock LLM, no HTTP", "batch_wall_s"),
            ("runner", "run_batch in-process (server + mock TrainGate)", "batch_wall_s"),
            ("cli", "osmosis test, batch only", "batch_wall_s"),
            ("cli", "osmosis test, whole process", "process_wall_s"),
        ):
            run = best[way]
            rate = args.rows / run[wall_key]
            run[f"rows_per_s_{wall_key.removesuffix('_wall_s')}"] = round(rate, 1)
            cpu = "" if label.endswith("batch only") else round(run["cpu_s"] * 1000 / args.rows, 3)
            table.append(
                [f"c={key} {label}", round(rate, 1), ratio(rate, base), cpu, run["completed"]]
            )
    print_table(
        f"osmosis test over {args.rows} rows of {TARGET} (mock LLM)",
        ["", "rows/s", "vs baseline", "CPU ms/row", "completed"],
        table,
    )
    write_results("test_throughput", {"parameters": vars(args), "results": results})


if __name__ == "__main__":
    main()
