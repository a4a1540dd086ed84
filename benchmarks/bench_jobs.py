"""``osmosis test --jobs``: a 1,000-row cassette replayed by 1, 2 and ``auto`` worker processes.

The calculator example over generated rows is recorded once (``osmosis test --record`` with the
mock LLM), then replayed by ``osmosis test TARGET --replay CASSETTE --json`` as users run it (a
subprocess): ``--jobs 1`` (the baseline: one process, as before), ``--jobs 2`` and ``--jobs
auto``. Rounds alternate the three; the best round of each (by process wall) is reported with
its rows/s, the batch time the command reports, and the CPU time of the whole process tree
(the command and its workers). Start-up: the same commands over the first 10 rows only, which
is what each run pays before its rows (spawning and importing the workers included).

    python benchmarks/bench_jobs.py [--rows 1000] [--concurrency 8] [--repeats 2]
        [--baseline-osmosis OTHER/.venv/bin/osmosis]

``--baseline-osmosis`` also runs the same replays with another install of the command (an
earlier version, in its own venv), alternating with this one: before/after in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _bench import ROOT, print_table, ratio, write_results
from bench_test_throughput import TARGET, write_dataset

from osmosis_rollout.evaluation.cpus import auto_jobs, cpu_count, machine_load

JOBS = ("1", "2", "auto")


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _osmosis_test(*args: str, osmosis: str | None = None) -> tuple[dict[str, Any], float, float]:
    """One ``osmosis test TARGET ... --json`` process: its summary, wall and tree's CPU."""
    here = Path(sys.executable).parent / "osmosis"
    if osmosis is not None:
        command = [osmosis]
    else:
        command = [str(here)] if here.exists() else [sys.executable, "-m", "osmosis_rollout"]
    command += ["test", TARGET, *args, "--json"]
    cpu, started = _children_cpu_s(), time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)
    wall, cpu = time.perf_counter() - started, _children_cpu_s() - cpu
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout[done.stdout.index("{") :]), wall, cpu


def _replay(
    cassette: Path, jobs: str, concurrency: int, limit: int | None, osmosis: str | None = None
) -> dict[str, Any]:
    """One ``osmosis test --replay --jobs JOBS`` run, as a user runs it."""
    args = ["--replay", str(cassette), "--concurrency", str(concurrency), "--jobs", jobs]
    limited = ["--limit", str(limit)] if limit else []
    summary, wall, cpu = _osmosis_test(*args, *limited, osmosis=osmosis)
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
    parser.add_argument(
        "--baseline-osmosis", help="another install's osmosis command, run alternately"
    )
    args = parser.parse_args()
    ways = [(jobs, None) for jobs in JOBS]
    if args.baseline_osmosis:
        ways += [(jobs, args.baseline_osmosis) for jobs in JOBS]

    with tempfile.TemporaryDirectory() as tmp:
        dataset, cassette = Path(tmp) / "rows.jsonl", Path(tmp) / "cassette.jsonl"
        write_dataset(dataset, args.rows)
        summary, wall, cpu = _osmosis_test("-d", str(dataset), "--record", str(cassette))
        recorded = {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "passed": summary["passed"]}
        recorded["cassette_bytes"] = cassette.stat().st_size
        rounds: dict[str, list[dict[str, Any]]] = {_name(*way): [] for way in ways}
        startup: dict[str, list[dict[str, Any]]] = {_name(*way): [] for way in ways}
        for _ in range(args.repeats):
            for jobs, osmosis in ways:
                name = _name(jobs, osmosis)
                rounds[name].append(_replay(cassette, jobs, args.concurrency, None, osmosis))
                startup[name].append(_replay(cassette, jobs, args.concurrency, 10, osmosis))

    best = {name: min(runs, key=lambda r: r["process_wall_s"]) for name, runs in rounds.items()}
    first = {name: min(r["process_wall_s"] for r in runs) for name, runs in startup.items()}
    base = best["--jobs 1"]
    table = []
    for name in rounds:
        run = best[name]
        table.append(
            [
                name + (" (baseline)" if name == "--jobs 1" else ""),
                run["process_wall_s"],
                run["rows_per_s"],
                ratio(run["rows_per_s"], base["rows_per_s"]),
                round(args.rows / run["batch_wall_s"], 1),
                run["cpu_s"],
                round(run["cpu_s"] * 1000 / args.rows, 2),
                first[name],
            ]
        )
    print_table(
        f"osmosis test --replay, {args.rows} rows of {TARGET}, concurrency {args.concurrency} "
        f"per process; auto = {_auto(args.rows)} here at the end; best of {args.repeats}",
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
    if args.baseline_osmosis:
        for jobs in JOBS:
            now, before = best[f"--jobs {jobs}"], best[_name(jobs, args.baseline_osmosis)]
            print(
                f"--jobs {jobs}: this install / the baseline install, process wall "
                f"{ratio(now['process_wall_s'], before['process_wall_s'])}, "
                f"CPU {ratio(now['cpu_s'], before['cpu_s'])}"
            )
    assert all(r["passed"] == r["rows"] for runs in rounds.values() for r in runs)
    results = {"record": recorded, "rounds": rounds, "startup_10_rows": startup}
    write_results("jobs", {"parameters": vars(args), "results": results})


def _auto(rows: int) -> str:
    """What ``--jobs auto`` chooses now, and why (the load changes while the benchmark runs)."""
    chosen = auto_jobs(cpu_count(), machine_load(), rows, machine_cpus=os.cpu_count())
    return f"{chosen.count} ({chosen.reason})"


def _name(jobs: str, osmosis: str | None) -> str:
    return f"--jobs {jobs}" + (" @baseline" if osmosis else "")


if __name__ == "__main__":
    main()
