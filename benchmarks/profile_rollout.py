"""Profile the server side of one-turn rollouts with py-spy: a flame graph of where CPU goes.

The server under test (``_servers.py KIND``) runs under ``py-spy record`` in its own process;
this process plays TrainGate exactly as ``bench_throughput.py`` does (init, one chat turn, one
completion callback per rollout). Only on-CPU samples are kept (py-spy leaves idle frames out).

    python benchmarks/profile_rollout.py [--kind sdk] [--stack fast] [--rollouts 2000]
        [--format flamegraph|speedscope|raw] [-o docs/img/rollout-flamegraph.svg]

Needs ``py-spy`` (``pip install -e '.[bench]'``) and permission to trace a child process.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from _bench import ROOT, SERVERS, console
from _bench import _read_port as read_port
from bench_throughput import Gate, drive


async def _load(port: int, args: argparse.Namespace) -> None:
    async with Gate().running() as gate:
        await drive(gate, port, "warm", args.warmup, args.concurrency)
        started = time.perf_counter()
        await drive(gate, port, "profiled", args.rollouts, args.concurrency)
        wall = time.perf_counter() - started
    console.print(f"{args.rollouts} rollouts in {wall:.1f} s under py-spy")


def _profile(args: argparse.Namespace, pyspy: str) -> None:
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    server = [sys.executable, str(SERVERS), args.kind, "--stack", args.stack, "--turns", "1"]
    command = [pyspy, "record", "--format", args.format, "--rate", str(args.rate)]
    command += ["--output", str(out), "--", *server]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        asyncio.run(_load(read_port(proc, 30.0), args))
    finally:
        # py-spy writes its output when interrupted; the server is its child and stops with it.
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    size = out.stat().st_size if out.exists() else 0
    console.print(f"profile written to {out} ({size / 1024:.0f} KB)")


def main() -> None:
    """Parse the options, find py-spy, profile."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kind", default="sdk", choices=["sdk", "baseline"])
    parser.add_argument("--stack", default="fast", help="h11, fast or granian (see _servers.py)")
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    formats = ["flamegraph", "speedscope", "raw"]
    parser.add_argument("--format", default="flamegraph", choices=formats)
    parser.add_argument("-o", "--output", default=str(ROOT / "docs/img/rollout-flamegraph.svg"))
    args = parser.parse_args()
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not os.path.exists(pyspy):
        parser.error("py-spy is not installed: pip install -e '.[bench]'")
    _profile(args, pyspy)


if __name__ == "__main__":
    main()
