"""``osmosis test --samples N``: rollouts per second with groups against the same number of
rollouts as plain rows, mock LLM.

The calculator example runs two ways, alternating, with the same number of rollouts:

- the baseline: ``--rows * --samples`` distinct rows, one rollout each (``--samples 1``);
- ``--rows`` rows with ``--samples N``: N rollouts a row, the group figures (pass@k, spread,
  no-signal share) in the summary and a group line per row in the results file;
- for reference, the baseline's rows with ``--mock-policy all`` (the mock before it walked the
  agent: every tool at once, so 2 LLM turns a row instead of 5).

All are ``osmosis test`` subprocesses writing ``--output``, alternating round by round; the
table shows the best rollouts/s of the batch (the time ``osmosis test`` reports) and of the
whole process, the lowest CPU time a rollout (the child's), and their ratios to the baseline:
the groups must keep them within 10%. On a shared machine the rates move with its load; CPU
per rollout is the steadier figure.

    python benchmarks/bench_samples.py [--rows 1000] [--samples 16] [--repeats 2]
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

from _bench import ROOT, console, print_table, ratio, verdict, write_results
from bench_test_throughput import TARGET, write_dataset


def _cli(dataset: Path, samples: int, out: Path, policy: str = "walk") -> dict[str, Any]:
    osmosis = Path(sys.executable).parent / "osmosis"
    command = [str(osmosis)] if osmosis.exists() else [sys.executable, "-m", "osmosis_rollout"]
    command += ["test", TARGET, "-d", str(dataset), "--samples", str(samples)]
    command += ["--mock-policy", policy]
    command += ["--output", str(out), "--json"]
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
        "rollouts": summary["rows"],
        "completed": summary["completed"],
        "groups": summary["groups"]["groups"],
    }


def main() -> None:
    """Generate both datasets, run both ways, print, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1000, help="rows of the --samples run")
    parser.add_argument("--samples", type=int, default=16, help="--samples N")
    parser.add_argument("--repeats", type=int, default=2, help="rounds of each way")
    args = parser.parse_args()
    rollouts = args.rows * args.samples
    rounds: dict[str, list[dict[str, Any]]] = {"baseline": [], "samples": [], "all": []}
    with tempfile.TemporaryDirectory() as tmp:
        plain, grouped = Path(tmp) / "plain.jsonl", Path(tmp) / "grouped.jsonl"
        write_dataset(plain, rollouts)
        write_dataset(grouped, args.rows)
        for _ in range(args.repeats):
            rounds["baseline"].append(_cli(plain, 1, Path(tmp) / "plain-out.jsonl"))
            rounds["samples"].append(_cli(grouped, args.samples, Path(tmp) / "grouped-out.jsonl"))
            rounds["all"].append(_cli(plain, 1, Path(tmp) / "all-out.jsonl", policy="all"))
    best = {way: min(runs, key=lambda r: r["batch_wall_s"]) for way, runs in rounds.items()}
    table = []
    rates: dict[str, dict[str, float]] = {}
    for way, label in (
        ("baseline", f"{rollouts} rows, --samples 1"),
        ("samples", f"{args.rows} rows, --samples {args.samples}"),
        ("all", f"{rollouts} rows, --mock-policy all (2 turns a row, not 5)"),
    ):
        run = best[way]
        cpu = min(r["cpu_s"] for r in rounds[way])
        rates[way] = {
            "batch": round(run["rollouts"] / run["batch_wall_s"], 1),
            "process": round(run["rollouts"] / run["process_wall_s"], 1),
            "cpu_ms": round(cpu * 1000 / run["rollouts"], 3),
        }
        table.append(
            [
                label,
                run["rollouts"],
                rates[way]["batch"],
                ratio(rates[way]["batch"], rates["baseline"]["batch"]),
                rates[way]["process"],
                ratio(rates[way]["process"], rates["baseline"]["process"]),
                rates[way]["cpu_ms"],
                ratio(rates[way]["cpu_ms"], rates["baseline"]["cpu_ms"]),
            ]
        )
    kept = ratio(rates["samples"]["batch"], rates["baseline"]["batch"])
    # The rates move with the shared machine's load; CPU per rollout does not, much.
    cpu_ratio = ratio(rates["samples"]["cpu_ms"], rates["baseline"]["cpu_ms"])
    print_table(
        f"osmosis test --samples over {TARGET} (mock LLM)",
        [
            "",
            "rollouts",
            "rollouts/s (batch)",
            "vs baseline",
            "rollouts/s (process)",
            "vs baseline",
        ],
        table,
    )
    console.print(
        f"within 10% per rollout: rollouts/s {verdict(kept >= 0.9)} ({kept}), "
        f"CPU per rollout {verdict(cpu_ratio <= 1.1)} ({cpu_ratio})"
    )
    write_results(
        "samples",
        {
            "parameters": vars(args),
            "rates": rates,
            "ratio": kept,
            "cpu_ratio": cpu_ratio,
            "rounds": rounds,
        },
    )


if __name__ == "__main__":
    main()
