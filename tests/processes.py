"""`osmosis serve` and other commands as subprocesses on 127.0.0.1, stopped however a test ends."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2

REPO = Path(__file__).resolve().parent.parent
_LISTENING = re.compile(r"listening on\s+http://127\.0\.0\.1:(\d+)")


@dataclass
class ServeProcess:
    """A running ``osmosis serve`` subprocess."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        """Its base URL."""
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        """Everything it printed so far (stdout and stderr)."""
        return self.log.read_text(encoding="utf-8", errors="replace")


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without inherited ``OSMOSIS_*`` settings (nor the platform's
    ``_OSMOSIS_ROLLOUT_*``), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OSMOSIS_", "_OSMOSIS_"))}
    env.update(extra)
    env["COLUMNS"] = "200"  # keep each printed line on one line
    return env


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """Terminate the process group we started (SIGTERM, then SIGKILL after 10 s)."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 20) -> None:
    """Poll ``/health`` until it answers 200 (a subprocess gives no event to wait on)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited early:\n{log.read_text(errors='replace')}")
        with contextlib.suppress(httpx2.TransportError):
            if httpx2.get(f"{url}/health", timeout=1).status_code == 200:
                return
        time.sleep(0.05)
    raise AssertionError(f"server not healthy in {timeout} s:\n{log.read_text(errors='replace')}")


@contextlib.contextmanager
def osmosis_serve(
    log: Path,
    *args: str,
    env: dict[str, str] | None = None,
    cwd: Path = REPO,
    limit_files: int | tuple[int, int] | None = None,
) -> Iterator[ServeProcess]:
    """Run ``osmosis serve AGENT --port 0 ...``; the port is read from its start banner.

    ``limit_files`` sets the server's limit on open files, soft and hard (one number: both)."""
    command = [sys.executable, "-m", "osmosis_rollout", "serve", *args]
    if limit_files is not None:
        soft, hard = limit_files if isinstance(limit_files, tuple) else (limit_files, limit_files)
        command = ["prlimit", f"--nofile={soft}:{hard}", *command]
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            command,
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env if env is not None else clean_env(),
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 20
        port = None
        while port is None:
            found = _LISTENING.search(log.read_text(errors="replace"))
            if found:
                port = int(found.group(1))
            elif proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"no start banner:\n{log.read_text(errors='replace')}")
            else:
                time.sleep(0.05)
        wait_healthy(f"http://127.0.0.1:{port}", proc, log)
        yield ServeProcess(proc, port, log)
    finally:
        stop_process(proc)
