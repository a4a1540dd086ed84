"""Before/after in one run: the headline figures of two checkouts, measured alternately.

A refactor must not cost speed (issue 23: every figure within 10%). This machine's speed drifts
by up to 1.6x within minutes, so two runs made an hour apart prove nothing: this script runs each
benchmark under the baseline checkout and under this one in turn, round after round, and reports
the median of each side and their ratio.

    python benchmarks/compare_installs.py --baseline /path/to/old-checkout

``--baseline`` is a checkout of the older commit. Both sides run on this interpreter and its
installed dependencies, each with its own ``src`` first on ``PYTHONPATH``, so only our code
differs (two virtualenvs with the same packages measured up to 25% apart here, both ways);
``--baseline-python`` runs the baseline on another interpreter instead, for when the
dependencies differ. Each side runs its own copy of the benchmark scripts, so a script that
imports a module that moved still measures the same thing on both sides.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _bench import ROOT, console, median, print_table, ratio, write_results


@dataclass(frozen=True)
class Figure:
    """One user-visible figure: which script makes it, with what arguments, read from where."""

    label: str
    script: str
    args: tuple[str, ...]
    results: str  # the name the script writes under benchmarks/results/
    read: Callable[[dict[str, Any]], float]
    better: str  # "lower" or "higher"


def _replay_rows_per_s(data: dict[str, Any]) -> float:
    return median([r["rows_per_s"] for r in data["results"]["rounds"]["replay"]])


def _replay_cpu_ms_per_row(data: dict[str, Any]) -> float:
    return median([r["cpu_ms_per_row"] for r in data["results"]["rounds"]["replay"]])


def _test_rows_per_s(protocol: str) -> Callable[[dict[str, Any]], float]:
    return lambda d: median([r["rows_per_s"] for r in d["results"][protocol]])


FIGURES = (
    Figure(
        "server CPU per rollout (ms)",
        "bench_throughput.py",
        ("--stacks", "fast", "--kinds", "baseline,sdk", "--concurrency", "16", "--rollouts", "300"),
        "throughput",
        lambda d: d["results"]["16"]["sdk@fast"]["server_cpu_ms_per_rollout"],
        "lower",
    ),
    Figure(
        "rollouts/s through uvicorn",
        "bench_throughput.py",
        ("--stacks", "fast", "--kinds", "baseline,sdk", "--concurrency", "16", "--rollouts", "300"),
        "throughput",
        lambda d: d["results"]["16"]["sdk@fast"]["rollouts_per_s"],
        "higher",
    ),
    Figure(
        "server CPU per v2 rollout (ms)",
        "bench_wire_cpu.py",
        ("--rollouts", "1000", "--rounds", "1"),
        "wire_cpu",
        lambda d: d["v2_median_ms"],
        "lower",
    ),
    Figure(
        "osmosis test rows/s, protocol v1 (in process)",
        "bench_test_wires.py",
        ("--rows", "300", "--repeats", "1"),
        "test_wires",
        _test_rows_per_s("v1"),
        "higher",
    ),
    Figure(
        "osmosis test rows/s, protocol v2 (in process)",
        "bench_test_wires.py",
        ("--rows", "300", "--repeats", "1"),
        "test_wires",
        _test_rows_per_s("v2"),
        "higher",
    ),
    Figure(
        "SDK CPU per LLM turn (ms)",
        "bench_turn_overhead.py",
        ("--rollouts", "100"),
        "turn_overhead",
        lambda d: d["sides"]["sdk"]["cpu_ms_per_turn"],
        "lower",
    ),
    Figure(
        "memory per in-flight rollout (KB)",
        "bench_concurrency.py",
        ("--sizes", "2000"),
        "concurrency",
        lambda d: d["results"]["2000"]["sdk"]["kb_per_in_flight"],
        "lower",
    ),
    Figure(
        "replay rows/s (in process)",
        "bench_replay.py",
        ("--rows", "500", "--repeats", "1"),
        "replay",
        _replay_rows_per_s,
        "higher",
    ),
    Figure(
        "replay CPU per row (ms)",
        "bench_replay.py",
        ("--rows", "500", "--repeats", "1"),
        "replay",
        _replay_cpu_ms_per_row,
        "lower",
    ),
)


def _run(root: Path, python: str, figure: Figure) -> dict[str, Any]:
    """Run one script of the checkout at ``root`` (its ``src`` first on the path) and return
    the results it wrote."""
    cmd = [python, str(root / "benchmarks" / figure.script), *figure.args]
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return json.loads((root / "benchmarks" / "results" / f"{figure.results}.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, required=True, help="checkout of the old commit")
    parser.add_argument("--baseline-python", help="run the baseline on this python instead")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per script")
    parser.add_argument(
        "--only",
        action="append",
        metavar="LABEL",
        help="measure only the figures whose label contains LABEL (repeatable), e.g. 'server CPU'",
    )
    args = parser.parse_args()
    figures_run = tuple(
        f for f in FIGURES if not args.only or any(part in f.label for part in args.only)
    )
    if not figures_run:
        sys.exit(f"--only matches no figure; the labels: {', '.join(f.label for f in FIGURES)}")
    base_root = args.baseline.resolve()
    base_python = args.baseline_python or sys.executable
    sides = {"before": (base_root, base_python), "after": (ROOT, sys.executable)}

    by_script: dict[tuple[str, tuple[str, ...]], list[Figure]] = {}
    for figure in figures_run:
        by_script.setdefault((figure.script, figure.args), []).append(figure)
    values: dict[str, dict[str, list[float]]] = {
        f.label: {"before": [], "after": []} for f in figures_run
    }
    for (script, _), figures in by_script.items():
        for round_no in range(args.rounds):
            order = ("before", "after") if round_no % 2 == 0 else ("after", "before")
            for side in order:
                console.print(f"[dim]{script} round {round_no + 1}: {side}[/]")
                data = _run(*sides[side], figures[0])
                for figure in figures:
                    values[figure.label][side].append(figure.read(data))

    rows = []
    summary: dict[str, Any] = {}
    for figure in figures_run:
        before = median(values[figure.label]["before"])
        after = median(values[figure.label]["after"])
        change = ratio(after, before)
        summary[figure.label] = {**values[figure.label], "ratio": change, "better": figure.better}
        rows.append([figure.label, before, after, f"{change:.2f}x", figure.better])
    print_table(
        "before (baseline checkout) vs after (this checkout), medians",
        ["figure", "before", "after", "after/before", "better"],
        rows,
    )
    write_results(
        "compare_installs",
        {
            "parameters": {"baseline": str(base_root), "rounds": args.rounds, "only": args.only},
            "results": summary,
        },
    )


if __name__ == "__main__":
    main()
