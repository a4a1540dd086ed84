"""Shared helpers for the benchmark scripts: stats, tables, JSON results, child processes.

Every script runs as ``python benchmarks/bench_<name>.py`` from the repository root, so this
module is imported as ``_bench`` (the script's folder is first on ``sys.path``).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
SERVERS = ROOT / "benchmarks" / "_servers.py"
HOST = "127.0.0.1"

#: Wide enough for the tables when output goes to a file or a pipe.
console = Console(width=None if sys.stdout.isatty() else 132)


# -- numbers --------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile (``q`` in 0..1); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    k = max(0, math.ceil(q * len(ordered)) - 1)
    return ordered[k]


def median(values: Sequence[float]) -> float:
    """The middle value (lower median for an even count)."""
    return percentile(values, 0.5)


def ratio(a: float, b: float) -> float:
    """``a / b`` rounded, or NaN when ``b`` is zero."""
    return round(a / b, 3) if b else math.nan


# -- the machine and the results file -------------------------------------------------------------


def machine() -> dict[str, Any]:
    """What ran the benchmark: cores, CPU model, Python and the packages that matter."""
    cpu = platform.processor() or "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    versions: dict[str, str | None] = {}
    for name in ("osmosis-rollout", "uvicorn", "starlette", "httpx2", "pydantic", "anyio"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    load: list[str] | None = None
    with contextlib.suppress(OSError):
        load = Path("/proc/loadavg").read_text().split()[:3]
    return {
        "nproc": os.cpu_count(),
        "loadavg_1_5_15": load,
        "cpu": cpu,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "packages": versions,
    }


def write_results(name: str, results: dict[str, Any]) -> Path:
    """Write ``benchmarks/results/<name>.json`` with the machine and the exact command."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    document = {
        "benchmark": name,
        "command": " ".join(["python", *sys.argv]),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        **results,
    }
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    console.print(f"results written to {path.relative_to(ROOT)}")
    return path


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Print a Rich table; floats get three significant decimals."""
    table = Table(title=title, title_justify="left")
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*(_cell(v) for v in row))
    console.print(table)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.1f}"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    return str(value)


def verdict(ok: bool) -> str:
    """A goal check for the tables."""
    return "[green]met[/]" if ok else "[red]missed[/]"


# -- processes ------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process, from ``/proc/<pid>/stat`` (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def tree_cpu_seconds(pid: int) -> float:
    """CPU time of a live process and its live children (``--workers``), from ``/proc``."""
    total = cpu_seconds(pid)
    with contextlib.suppress(OSError):
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            with contextlib.suppress(OSError):
                total += cpu_seconds(int(child))
    return total


@contextlib.contextmanager
def redis_server() -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A throwaway ``redis-server`` on a free 127.0.0.1 port, no persistence; its URL."""
    import shutil
    import socket
    import tempfile

    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory() as workdir:
        command = [binary, "--port", str(port), "--bind", HOST, "--save", "", "--appendonly"]
        command += ["no", "--dir", workdir, "--logfile", f"{workdir}/redis.log"]
        proc = subprocess.Popen(command, text=True)
        try:
            deadline = time.monotonic() + 15
            while True:
                with contextlib.suppress(OSError), socket.create_connection((HOST, port), 1):
                    break
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not start")
                time.sleep(0.05)
            yield proc, f"redis://{HOST}:{port}/0"
        finally:
            stop_process(proc)


def rss_bytes(pid: int | None = None) -> int:
    """Resident set size of a process (this one by default), from ``/proc`` (Linux)."""
    statm = Path(f"/proc/{pid or 'self'}/statm").read_text().split()
    return int(statm[1]) * os.sysconf("SC_PAGE_SIZE")


@contextlib.contextmanager
def child_server(
    *args: str, timeout_s: float = 20.0
) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """Run ``_servers.py ARGS`` (which binds 127.0.0.1:0 and prints ``PORT n``); always stop it.

    Yields the process and its port. On exit: SIGTERM, then SIGKILL if it lingers.
    """
    proc = subprocess.Popen(
        [sys.executable, str(SERVERS), *args],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        port = _read_port(proc, timeout_s)
        yield proc, port
    finally:
        stop_process(proc)


def _read_port(proc: subprocess.Popen[str], timeout_s: float) -> int:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"server process exited early with code {proc.wait()}")
        if line.startswith("PORT "):
            return int(line.split()[1])
    raise RuntimeError("server process did not report its port in time")


_LISTENING = re.compile(r"listening on\s+http://127\.0\.0\.1:(\d+)")


def wait_until_serving(
    proc: subprocess.Popen[str], log: Path, what: str, timeout_s: float = 30.0
) -> str:
    """The URL of an ``osmosis serve --port 0`` child once ``/health`` answers 200.

    The banner names the port before uvicorn binds it, so the health check is what says "ready";
    both waits share one deadline, and a child that exits or never gets healthy is an error.
    """
    import httpx2

    deadline = time.monotonic() + timeout_s
    url = ""
    while True:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start:\n{log.read_text(errors='replace')}")
        if not url and (found := _LISTENING.search(log.read_text(errors="replace"))):
            url = f"http://{HOST}:{found.group(1)}"
        if url:
            with contextlib.suppress(httpx2.TransportError):
                if httpx2.get(f"{url}/health", timeout=2).status_code == 200:
                    return url
        time.sleep(0.05)


def stop_process(proc: subprocess.Popen[str], grace_s: float = 10.0) -> None:
    """SIGTERM a child we started, wait, then SIGKILL it if needed."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
