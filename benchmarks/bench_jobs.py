"""``osmosis test --jobs``: a 1,000-row cassette replayed by 1, 2 and ``auto`` worker processes.

The calculator example over generated rows is recorded once (``osmosis test --record`` with the
mock LLM), then replayed by ``osmosis test TARGET --replay CASSETTE --json`` as users run it (a
subprocess): ``--jobs 1`` (the baseline: one process, as before), ``--jobs 2`` and ``--jobs
auto``. Rounds alternate the three; the best round of each (by process wall) is reported with
its rows/s, the batch time the command reports, and the CPU time of the whole process tree
(the command and its workers). Start-up: the same commands over the first 10 rows only, which
is what each run pays before its rows (spawning and importing the workers included).

    python benchmarks/bench_jobs.py [--rows 1000] [--concurrency 8] [--repeats 2]
"""

from __future__ import annotations

import argparse
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

from osmosis_rollout.testing.parallel import cpu_count

JOBS = ("1", "2", "auto")


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _osmosis_test(*args: str) -> tuple[dict[str, Any], float, float]:
    """One ``osmosis test TARGET ... --json`` process: its summary, wall and tree's CPU."""
    osmosis = Path(sys.executable).parent / "osmosis"
    command = [str(osmosis)] if osmosis.exists() else [sys.executable, "-m", "osmosis_rollout"]
    command += ["test", TARGET, *args, "--json"]
    cpu, started = _children_cpu_s(), time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)
    wall, cpu = time.perf_counter() - started, _children_cpu_s() - cpu
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout[done.stdout.index("{") :]), wall, cpu


def _replay(cassette: Path, jobs: str, concurrency: int, limit: int | None) -> dict[str, Any]:
    """One ``osmosis test --replay --jobs JOBS`` run, as a user runs it."""
    args = ["--replay", str(cassette), "--concurrency", str(concurrency), "--jobs", jobs]
    summary, wall, cpu = _osmosis_test(*args, *(["--limit", str(limit)] if limit else []))
    return {
        "process_wall_s": round(wall, 3),
        "batch_wall_s": summary["wall_s"],
        "cpu_s": round(cpu, 3),
        "rows": summary["rows"],
        "passed": summary["passed"],
        "rows_per_s": round(summary["rows"] / wall, 1),
    }


def main() -> None:
    """Record once, then alternate the three ways, full and 10-row; print and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1000, help="dataset rows")
    parser.add_argument("--concurrency", type=int, default=8, help="rollouts at once per process")
    parser.add_argument("--repeats", type=int, default=2, help="rounds of each")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        dataset, cassette = Path(tmp) / "rows.jsonl", Path(tmp) / "cassette.jsonl"
        write_dataset(dataset, args.rows)
        summary, wall, cpu = _osmosis_test("-d", str(dataset), "--record", str(cassette))
        recorded = {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "passed": summary["passed"]}
        recorded["cassette_bytes"] = cassette.stat().st_size
        rounds: dict[str, list[dict[str, Any]]] = {jobs: [] for jobs in JOBS}
        startup: dict[str, list[dict[str, Any]]] = {jobs: [] for jobs in JOBS}
        for _ in range(args.repeats):
            for jobs in JOBS:
                rounds[jobs].append(_replay(cassette, jobs, args.concurrency, None))
                startup[jobs].append(_replay(cassette, jobs, args.concurrency, 10))

    best = {jobs: min(runs, key=lambda r: r["process_wall_s"]) for jobs, runs in rounds.items()}
    first = {jobs: min(r["process_wall_s"] for r in runs) for jobs, runs in startup.items()}
    base = best["1"]
    table = []
    for jobs in JOBS:
        run = best[jobs]
        table.append(
            [
                f"--jobs {jobs}" + (" (baseline)" if jobs == "1" else ""),
                run["process_wall_s"],
                run["rows_per_s"],
                ratio(run["rows_per_s"], base["rows_per_s"]),
                round(args.rows / run["batch_wall_s"], 1),
                run["cpu_s"],
                round(run["cpu_s"] * 1000 / args.rows, 2),
                first[jobs],
            ]
        )
    print_table(
        f"osmosis test --replay, {args.rows} rows of {TARGET}, concurrency {args.concurrency} "
        f"per process; auto = {cpu_count()} on this machine; best of {args.repeats}",
        [
            "",
            "process wall s",
            "rows/s",
            "vs --jobs 1",
            "rows/s (batch)",
            "CPU s (tree)",
            "CPU ms/row",
            "10 rows: wall s",
        ],
        table,
    )
    assert all(r["passed"] == r["rows"] for runs in rounds.values() for r in runs)
    results = {"record": recorded, "rounds": rounds, "startup_10_rows": startup}
    write_results("jobs", {"parameters": vars(args), "results": results})


if __name__ == "__main__":
    main()
