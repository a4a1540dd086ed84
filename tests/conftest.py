"""Shared fixtures: a TrainGateClient wired to a MockTrainGate, a CallbackGate on 127.0.0.1, and a
throwaway redis-server."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator

import httpx2
import pytest

from osmosis_rollout.client import RetryPolicy, TrainGateClient
from osmosis_rollout.testing import MockTrainGate

from .gates import CallbackGate
from .programs import require_program
from .support import serve_in_thread


@pytest.fixture
def anyio_backend() -> str:
    """Run async tests on asyncio, the only loop the server supports."""
    return "asyncio"


async def _no_sleep(_: float) -> None:
    return None


@pytest.fixture
def fast_retry() -> RetryPolicy:
    """The protocol's retry counts, with tiny delays."""
    return RetryPolicy(retries=3, base_delay_s=0.001, max_delay_s=0.01)


@pytest.fixture
async def mock_client(
    fast_retry: RetryPolicy,
) -> AsyncIterator[tuple[MockTrainGate, TrainGateClient]]:
    """A MockTrainGate and a TrainGateClient that reaches it in-process."""
    gate = MockTrainGate()
    http = httpx2.AsyncClient(transport=gate.transport())
    client = TrainGateClient(http, retry=fast_retry, sleep=_no_sleep)
    try:
        yield gate, client
    finally:
        await http.aclose()


@pytest.fixture
def gate() -> Iterator[tuple[CallbackGate, str]]:
    """A ``CallbackGate`` served on 127.0.0.1 (uvicorn in a thread), and its URL."""
    recorder = CallbackGate()
    with serve_in_thread(recorder.app()) as url:
        yield recorder, url


@pytest.fixture
def no_inherited_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``OSMOSIS_*`` variable from the caller's environment reaches the command under test."""
    for name in list(os.environ):
        if name.startswith("OSMOSIS_"):
            monkeypatch.delenv(name)


# --------------------------------------------------------------------------------------------
# A real redis-server for the shared-state tests
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A throwaway ``redis-server`` on a free 127.0.0.1 port (no persistence); its base URL.

    Skipped only when the binary is not installed (tests/programs.py; ``.ci/run`` installs it).
    """
    binary = require_program("redis-server")
    workdir = tmp_path_factory.mktemp("redis")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly"]
    command += ["no", "--dir", str(workdir), "--logfile", str(workdir / "redis.log")]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 15
        while not _redis_command(port, b"PING").startswith(b"+PONG"):
            if proc.poll() is not None or time.monotonic() > deadline:
                log = workdir / "redis.log"
                raise RuntimeError(f"redis-server did not start: {log.read_text(errors='replace')}")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def redis_url(redis_server: str) -> str:
    """An empty Redis database for one test: ``redis://127.0.0.1:PORT/0``, flushed first."""
    port = int(redis_server.rsplit(":", 1)[1])
    assert _redis_command(port, b"FLUSHALL").startswith(b"+OK")
    return f"{redis_server}/0"


def _redis_command(port: int, command: bytes) -> bytes:
    """Send one inline command to Redis on 127.0.0.1; its first reply bytes, or b"" if down."""
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1) as conn:
        conn.sendall(command + b"\r\n")
        return conn.recv(64)
    return b""
