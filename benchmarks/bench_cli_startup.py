"""CLI start-up: wall time of ``osmosis --help`` and ``osmosis validate`` vs. ``python -c pass``.

Each command runs ``--runs`` times in a fresh process, round-robin with the others (after one
unmeasured warm-up run each, which fills the OS file cache and ``__pycache__``); the median wall
time is reported with its difference from bare Python, and so is the child's CPU time (user +
system), which a busy machine disturbs less. The slowest imports of ``osmosis --help``
(``python -X importtime``) are listed so that a regression shows where it comes from.

    python benchmarks/bench_cli_startup.py [--runs 10]

Goal: ``osmosis --help`` within 300 ms of bare Python.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time
from pathlib import Path

from _bench import ROOT, median, print_table, verdict, write_results

GOAL_MS = 300.0
EXAMPLE = "examples/calculator/agent.py:CalculatorAgent"


def _osmosis() -> list[str]:
    script = Path(sys.executable).parent / "osmosis"
    return [str(script)] if script.exists() else [sys.executable, "-m", "osmosis_rollout"]


def _run_once(command: list[str]) -> tuple[float, float]:
    """Wall ms and CPU ms (user + system of the child) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, cwd=ROOT, check=False)
    wall = (time.perf_counter() - started) * 1000
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr!r}")
    cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000
    return wall, cpu


def _time_all(commands: dict[str, list[str]], runs: int) -> dict[str, list[tuple[float, float]]]:
    """Round-robin over the commands (after one warm-up each) so load hits all alike."""
    for command in commands.values():
        _run_once(command)
    timings: dict[str, list[tuple[float, float]]] = {label: [] for label in commands}
    for _ in range(runs):
        for label, command in commands.items():
            timings[label].append(_run_once(command))
    return timings


def _slowest_imports(command: list[str], top: int = 12) -> list[dict[str, object]]:
    """Top-level packages of ``-X importtime`` by cumulative time (us)."""
    args = [sys.executable, "-X", "importtime", *command[1:]]
    if command[0] != sys.executable:
        args = [sys.executable, "-X", "importtime", "-m", "osmosis_rollout", *command[1:]]
    done = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, check=False)
    rows: dict[str, int] = {}
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = line.split("|")
        if name.startswith("  ") or not cumulative.strip().isdigit():
            continue  # keep only top-level imports (no indentation beyond one space)
        rows[name.strip()] = int(cumulative)
    ordered = sorted(rows.items(), key=lambda kv: kv[1], reverse=True)[:top]
    return [{"module": name, "cumulative_ms": round(us / 1000, 1)} for name, us in ordered]


def main() -> None:
    """Time each command, print the table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="measured runs per command")
    args = parser.parse_args()
    osmosis = _osmosis()
    commands = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "python -c 'import osmosis_rollout'": [sys.executable, "-c", "import osmosis_rollout"],
        "osmosis --version": [*osmosis, "--version"],
        "osmosis --help": [*osmosis, "--help"],
        "osmosis validate --help": [*osmosis, "validate", "--help"],
        f"osmosis validate {EXAMPLE}": [*osmosis, "validate", EXAMPLE],
    }
    timings = _time_all(commands, args.runs)
    bare = median([wall for wall, _ in timings["python -c pass"]])
    bare_cpu = median([cpu for _, cpu in timings["python -c pass"]])
    results = {}
    for label, samples in timings.items():
        walls, cpus = [w for w, _ in samples], [c for _, c in samples]
        results[label] = {
            "median_ms": round(median(walls), 1),
            "min_ms": round(min(walls), 1),
            "max_ms": round(max(walls), 1),
            "over_bare_python_ms": round(median(walls) - bare, 1),
            "cpu_median_ms": round(median(cpus), 1),
            "cpu_over_bare_python_ms": round(median(cpus) - bare_cpu, 1),
        }
    help_gap = results["osmosis --help"]["over_bare_python_ms"]
    met = help_gap < GOAL_MS
    print_table(
        f"Wall and CPU time, median of {args.runs} runs",
        [
            "command",
            "median ms",
            "min ms",
            "max ms",
            "over bare",
            "CPU ms",
            "CPU over bare",
            "ratio",
        ],
        [
            [
                label,
                r["median_ms"],
                r["min_ms"],
                r["max_ms"],
                r["over_bare_python_ms"],
                r["cpu_median_ms"],
                r["cpu_over_bare_python_ms"],
                f"{r['median_ms'] / bare:.1f}x",
            ]
            for label, r in results.items()
        ],
    )
    imports = _slowest_imports([*osmosis, "--help"])
    print_table(
        "Slowest top-level imports of `osmosis --help` (-X importtime, cumulative)",
        ["module", "ms"],
        [[row["module"], row["cumulative_ms"]] for row in imports],
    )
    print_table(
        "Goal",
        ["goal", "measured", "verdict"],
        [[f"--help within {GOAL_MS:g} ms of bare Python", f"{help_gap:.0f} ms", verdict(met)]],
    )
    write_results(
        "cli_startup",
        {
            "parameters": vars(args),
            "results": results,
            "help_imports": imports,
            "goal": {"help_over_bare_python_ms_below": GOAL_MS, "met": met},
        },
    )


if __name__ == "__main__":
    main()
