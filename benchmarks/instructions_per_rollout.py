"""Instructions the server executes per one-turn v1 rollout, counted by valgrind: a figure the
machine's load does not move (two runs of one checkout agree within 0.2%), for changes smaller
than the noise of CPU time on a shared machine (``compare_installs.py`` rounds vary by 1.5x).

    python benchmarks/instructions_per_rollout.py [--baseline /path/to/old-checkout]

The server (``_servers.py sdk``, fast stack) runs under ``valgrind --tool=cachegrind
--cache-sim=no`` and this process drives it as ``bench_throughput.py`` does: 50 rollouts to
warm up, then none or ``--rollouts``; the difference of the two runs' instruction counts over
``--rollouts`` leaves the start-up out. Each checkout runs with its own ``src`` first on
``PYTHONPATH``. Needs ``valgrind``; about a minute per checkout.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from _bench import ROOT, console, print_table, ratio, write_results
from _bench import _read_port as read_port
from bench_throughput import Gate, drive


def _count(root: Path, rollouts: int) -> int:
    """Instructions of one server run at ``root`` serving 50 + ``rollouts`` rollouts."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "valgrind.log"
        command = [
            "valgrind",
            "--tool=cachegrind",
            "--cache-sim=no",
            f"--cachegrind-out-file={tmp}/out",
            f"--log-file={log}",
            sys.executable,
            str(root / "benchmarks" / "_servers.py"),
            "sdk",
            "--stack",
            "fast",
            "--turns",
            "1",
        ]
        env = {**os.environ, "PYTHONPATH": str(root / "src")}
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=root, env=env)

        async def load(port: int) -> None:
            async with Gate().running() as gate:
                await drive(gate, port, "warm", 50, 16)
                if rollouts:
                    await drive(gate, port, "counted", rollouts, 16)

        try:
            asyncio.run(load(read_port(proc, 600.0)))
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(600)
            if proc.stdout is not None:
                proc.stdout.close()
        found = re.search(r"I\s+refs:\s+([\d,]+)", log.read_text())
        if found is None:
            sys.exit(f"valgrind gave no instruction count:\n{log.read_text()[-2000:]}")
        return int(found.group(1).replace(",", ""))


def per_rollout(root: Path, rollouts: int) -> float:
    """Instructions per rollout at ``root``: two runs, their difference over ``rollouts``."""
    console.print(f"[dim]{root}: start-up run, then {rollouts} rollouts[/]")
    return (_count(root, rollouts) - _count(root, 0)) / rollouts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, help="checkout of an older commit to compare")
    parser.add_argument("--rollouts", type=int, default=500)
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        parser.error("valgrind is not installed")
    results = {"after": per_rollout(ROOT, args.rollouts)}
    rows = [["this checkout", f"{results['after']:,.0f}", ""]]
    if args.baseline is not None:
        results["before"] = per_rollout(args.baseline.resolve(), args.rollouts)
        change = ratio(results["after"], results["before"])
        rows.insert(0, ["baseline", f"{results['before']:,.0f}", ""])
        rows[-1][2] = f"{change:.3f}x"
        results["ratio"] = change
    print_table(
        "instructions per one-turn v1 rollout (server)", ["", "instructions", "ratio"], rows
    )
    write_results(
        "instructions_per_rollout",
        {
            "parameters": {"rollouts": args.rollouts, "baseline": str(args.baseline)},
            "results": results,
        },
    )


if __name__ == "__main__":
    main()
