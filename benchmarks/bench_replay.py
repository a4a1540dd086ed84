"""Replay throughput: a 1,000-row cassette replayed, against the mock LLM run of the same rows.

The calculator example (two LLM turns and four tool calls a row) runs over generated arithmetic
rows through the real pipeline of ``osmosis test`` in process (``Harness`` + ``run_batch``: the
server app and the mock TrainGate over ASGI):

- the baseline: the built-in mock LLM answers (what ``osmosis test`` does offline);
- the same run recording a cassette (``CassetteRecorder``), which the next two replay;
- the replay: ``ReplayBackend`` answers from the cassette, checking every request, and each
  result is compared with the recording (the cassette is read inside the timed part);
- ``osmosis test --replay`` as users run it (a subprocess: whole process and its batch time).

Rounds alternate baseline and replay; the best round of each is reported (rows/s by wall time,
the lowest CPU time a row).

    python benchmarks/bench_replay.py [--rows 1000] [--concurrency 8] [--repeats 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _bench import ROOT, print_table, ratio, write_results
from bench_test_throughput import TARGET, write_dataset

from osmosis_rollout.evaluation.datasets import load_dataset
from osmosis_rollout.evaluation.recording import CassetteRecorder
from osmosis_rollout.evaluation.runner import RowInput, RunOptions, run_batch
from osmosis_rollout.loader import load_agent
from osmosis_rollout.testing import Harness, MockLLMBackend, MockTrainGate, ReplayBackend


async def _timed_batch(
    rows: list[RowInput], concurrency: int, *, backend: Any = None, cassette: Path | None = None
) -> dict[str, Any]:
    """One in-process batch; with ``cassette`` the backend is a replay of it (read while timed)."""
    agent = load_agent(TARGET)
    options = RunOptions(concurrency=concurrency)
    wall, cpu = time.perf_counter(), time.process_time()
    loaded_s = loaded_cpu_s = 0.0
    if cassette is not None:
        backend = ReplayBackend(cassette)
        loaded_s = time.perf_counter() - wall
        loaded_cpu_s = time.process_time() - cpu
    async with Harness(agent, backend=backend, max_concurrent=concurrency) as harness:
        report = await run_batch(harness, rows, options)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "read_cassette_s": round(loaded_s, 3),
        "read_cassette_cpu_s": round(loaded_cpu_s, 3),
        "rows_per_s": round(len(rows) / wall, 1),
        "cpu_ms_per_row": round(cpu * 1000 / len(rows), 3),
        "passed": sum(r.passed for r in report.rows),
    }


async def _record(rows: list[RowInput], concurrency: int, cassette: Path) -> dict[str, Any]:
    agent = load_agent(TARGET)
    options = RunOptions(concurrency=concurrency)
    gate = MockTrainGate(MockLLMBackend(policy="all"))
    wall, cpu = time.perf_counter(), time.process_time()
    recorder = CassetteRecorder(cassette, gate, options, agent=TARGET, protocol="v1")
    async with Harness(agent, gate=gate, max_concurrent=concurrency) as harness:
        report = await run_batch(harness, rows, options, on_result=recorder.row_finished)
    recorder.close()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "rows_per_s": round(len(rows) / wall, 1),
        "cpu_ms_per_row": round(cpu * 1000 / len(rows), 3),
        "passed": sum(r.passed for r in report.rows),
    }


def _cli_replay(cassette: Path, concurrency: int) -> dict[str, Any]:
    osmosis = Path(sys.executable).parent / "osmosis"
    command = [str(osmosis)] if osmosis.exists() else [sys.executable, "-m", "osmosis_rollout"]
    command += ["test", TARGET, "--replay", str(cassette), "--concurrency", str(concurrency)]
    started = time.perf_counter()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [*command, "--json"], capture_output=True, text=True, cwd=ROOT, check=False
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - children.ru_utime) + (after.ru_stime - children.ru_stime)
    if done.returncode != 0:
        raise RuntimeError(
            f"osmosis test --replay exited {done.returncode}:\n{done.stderr[-3000:]}"
        )
    summary = json.loads(done.stdout[done.stdout.index("{") :])
    return {
        "process_wall_s": round(wall, 3),
        "process_cpu_s": round(cpu, 3),
        "batch_wall_s": summary["wall_s"],
        "passed": summary["passed"],
    }


def main() -> None:
    """Record once, then alternate baseline and replay rounds; print and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1000, help="dataset rows")
    parser.add_argument("--concurrency", type=int, default=8, help="rollouts at once")
    parser.add_argument("--repeats", type=int, default=2, help="rounds of each")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        dataset, cassette = Path(tmp) / "rows.jsonl", Path(tmp) / "cassette.jsonl"
        write_dataset(dataset, args.rows)
        rows = [
            RowInput(index=r.number, messages=r.messages, metadata=r.metadata)
            for r in load_dataset(dataset)
        ]
        recorded = asyncio.run(_record(rows, args.concurrency, cassette))
        recorded["cassette_bytes"] = cassette.stat().st_size
        rounds: dict[str, list[dict[str, Any]]] = {"mock": [], "replay": []}
        for _ in range(args.repeats):
            rounds["mock"].append(
                asyncio.run(
                    _timed_batch(rows, args.concurrency, backend=MockLLMBackend(policy="all"))
                )
            )
            rounds["replay"].append(
                asyncio.run(_timed_batch(rows, args.concurrency, cassette=cassette))
            )
        cli = _cli_replay(cassette, args.concurrency)

    best = {way: max(runs, key=lambda r: r["rows_per_s"]) for way, runs in rounds.items()}
    for way, runs in rounds.items():  # CPU per row: the least disturbed round's
        best[way] = best[way] | {"cpu_ms_per_row": min(r["cpu_ms_per_row"] for r in runs)}
    base = best["mock"]
    cli_batch = args.rows / cli["batch_wall_s"]
    cli_process = args.rows / cli["process_wall_s"]
    table = [
        ["baseline: mock LLM, in process", base["rows_per_s"], 1.0, base["cpu_ms_per_row"]],
        [
            "mock LLM + recording the cassette",
            recorded["rows_per_s"],
            ratio(recorded["rows_per_s"], base["rows_per_s"]),
            recorded["cpu_ms_per_row"],
        ],
        [
            "replay, in process (cassette read included)",
            best["replay"]["rows_per_s"],
            ratio(best["replay"]["rows_per_s"], base["rows_per_s"]),
            best["replay"]["cpu_ms_per_row"],
        ],
        [
            "osmosis test --replay, batch",
            round(cli_batch, 1),
            ratio(cli_batch, base["rows_per_s"]),
            "",
        ],
        [
            "osmosis test --replay, whole process",
            round(cli_process, 1),
            ratio(cli_process, base["rows_per_s"]),
            round(cli["process_cpu_s"] * 1000 / args.rows, 3),
        ],
    ]
    print_table(
        f"{args.rows} rows of {TARGET}, concurrency {args.concurrency}; "
        f"cassette {recorded['cassette_bytes'] / 1e6:.1f} MB, read in "
        f"{best['replay']['read_cassette_s']:.2f} s "
        f"({best['replay']['read_cassette_cpu_s']:.2f} s CPU)",
        ["", "rows/s", "vs mock", "CPU ms/row"],
        table,
    )
    results = {"record": recorded, "rounds": rounds, "cli_replay": cli}
    write_results("replay", {"parameters": vars(args), "results": results})


if __name__ == "__main__":
    main()
