"""Shared by ``soak.py`` and ``fuzz_inits.py``: ``osmosis serve`` as a child process on 127.0.0.1,
and the torture parts from ``tests/torture.py``.

The child is a real server (uvicorn, its own lifespan, the default retry policy), so RSS and CPU
are the server's alone; the TrainGate side runs in the benchmark's own event loop
(``Harness(server_url=...)``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from _bench import ROOT, cpu_seconds, rss_bytes, stop_process, wait_until_serving

# The torture parts (hostile inits, the faulty TrainGate, the tally) live with their other
# user, the test suite: tests/torture.py, importable once the repository root is on the path.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from tests.torture import (
    FaultyGate,
    HostileRequest,
    hostile_inits,
    hostile_requests,
    tally,
    valid_init,
)

__all__ = [
    "SERVER_KEY",
    "FaultyGate",
    "HostileRequest",
    "Served",
    "hostile_inits",
    "hostile_requests",
    "osmosis_serve",
    "tally",
    "valid_init",
]

SERVER_KEY = "torture-server-key-42"


@dataclass
class Served:
    """A running ``osmosis serve`` child."""

    proc: subprocess.Popen[str]
    url: str
    log: Path

    def rss_mb(self) -> float:
        """Its resident set size now, in MB."""
        return rss_bytes(self.proc.pid) / 1e6

    def peak_rss_mb(self) -> float:
        """Its peak resident set size so far (VmHWM), in MB."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1e3
        return float("nan")

    def threads(self) -> int:
        """How many threads it runs now."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
        return 0

    def cpu_s(self) -> float:
        """Its CPU time so far (user + system), in seconds."""
        return cpu_seconds(self.proc.pid)


@contextlib.contextmanager
def osmosis_serve(
    target: str, workdir: Path, *args: str, limit_files: int | None = None, **env: str
) -> Iterator[Served]:
    """Run ``osmosis serve TARGET --port 0 --no-validate ARGS`` with ``OSMOSIS_*`` from ``env``
    (and, with ``limit_files``, that limit on open files, through ``prlimit``)."""
    log = workdir / "server.log"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OSMOSIS_")}
    environ.update({"OSMOSIS_API_KEY": SERVER_KEY, **{f"OSMOSIS_{k}": v for k, v in env.items()}})
    command = [sys.executable, "-m", "osmosis_rollout", "serve", target, "--port", "0"]
    command += ["--no-validate", "--outbox-dir", str(workdir / "outbox"), *args]
    if limit_files is not None:
        command = ["prlimit", f"--nofile={limit_files}:{limit_files}", *command]
    with log.open("w") as sink:
        proc = subprocess.Popen(
            command, stdout=sink, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=environ
        )
    try:
        url = wait_until_serving(proc, log, "osmosis serve")
        yield Served(proc, url, log)
    finally:
        stop_process(proc)
