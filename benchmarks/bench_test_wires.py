"""``osmosis test`` over each wire: the same rows in process on v1 (the baseline) and on v2.

The calculator example (two LLM turns and four tool calls a row) runs over generated
arithmetic rows through the pipeline of ``osmosis test`` in process (``Harness`` +
``run_batch`` with the built-in mock LLM). On v2 the mock TrainGate does what a v2 controller
does for each row on top of v1's work: ``POST /rollout``, two callbacks instead of one, and a
``GET /rollout/{id}/status`` after the grader callback. Rounds alternate v1 and v2; the best
round of each is reported (rows/s by wall time, the lowest CPU time a row).

    python benchmarks/bench_test_wires.py [--rows 1000] [--concurrency 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from _bench import print_table, ratio, write_results
from bench_test_throughput import TARGET, write_dataset

from osmosis_rollout.evaluation.datasets import load_dataset
from osmosis_rollout.evaluation.runner import RowInput, RunOptions, run_batch
from osmosis_rollout.loader import load_agent
from osmosis_rollout.testing import Harness, MockLLMBackend


async def _timed_batch(rows: list[RowInput], concurrency: int, protocol: str) -> dict[str, Any]:
    agent = load_agent(TARGET)
    options = RunOptions(concurrency=concurrency)
    wall, cpu = time.perf_counter(), time.process_time()
    async with Harness(
        agent, backend=MockLLMBackend(), max_concurrent=concurrency, protocol=protocol
    ) as harness:
        report = await run_batch(harness, rows, options)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "rows_per_s": round(len(rows) / wall, 1),
        "cpu_ms_per_row": round(cpu * 1000 / len(rows), 3),
        "passed": sum(r.passed for r in report.rows),
    }


def main() -> None:
    """Alternate v1 and v2 rounds over the same rows; print and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1000, help="dataset rows")
    parser.add_argument("--concurrency", type=int, default=8, help="rollouts at once")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of each")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        dataset = Path(tmp) / "rows.jsonl"
        write_dataset(dataset, args.rows)
        rows = [
            RowInput(index=r.number, messages=r.messages, metadata=r.metadata)
            for r in load_dataset(dataset)
        ]
        rounds: dict[str, list[dict[str, Any]]] = {"v1": [], "v2": []}
        for _ in range(args.repeats):
            for protocol in ("v1", "v2"):
                rounds[protocol].append(asyncio.run(_timed_batch(rows, args.concurrency, protocol)))
    best = {way: max(runs, key=lambda r: r["rows_per_s"]) for way, runs in rounds.items()}
    for way, runs in rounds.items():
        best[way] = best[way] | {"cpu_ms_per_row": min(r["cpu_ms_per_row"] for r in runs)}
    v1, v2 = best["v1"], best["v2"]
    print_table(
        f"{args.rows} rows of {TARGET}, concurrency {args.concurrency}, mock LLM, in process",
        ["", "rows/s", "vs v1", "CPU ms/row", "CPU vs v1", "passed"],
        [
            ["--protocol v1 (baseline)", v1["rows_per_s"], 1.0, v1["cpu_ms_per_row"], 1.0,
             v1["passed"]],
            ["--protocol v2", v2["rows_per_s"], ratio(v2["rows_per_s"], v1["rows_per_s"]),
             v2["cpu_ms_per_row"], ratio(v2["cpu_ms_per_row"], v1["cpu_ms_per_row"]),
             v2["passed"]],
        ],
    )  # fmt: skip
    write_results("test_wires", {"parameters": vars(args), "results": rounds})


if __name__ == "__main__":
    main()
