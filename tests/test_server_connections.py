"""The server's connection limits (``server/connections.py``), on a real ``osmosis serve``.

Hostile peers on 127.0.0.1: idle sockets, a head sent one byte at a time, megabytes of headers,
more connections than allowed. Each must cost the server little and end well before the 70 s a
review saw them hold a connection.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from .processes import REPO, ServeProcess, clean_env, osmosis_serve, stop_process, wait_healthy
from .programs import require_program
from .support import free_port

pytestmark = pytest.mark.slow

AGENT = f"{REPO / 'tests' / 'assets' / 'srv_agents.py'}:ToolAgent"
SERVER_KEY = "connections-key-42"
MAX_CONNECTIONS = 24


#: The h11 stack (uvicorn's pure-Python fallback) through ``serve()``, the Python twin.
_H11_SERVER = """
import os, sys
from osmosis_rollout.config import ServerSettings
from osmosis_rollout.loader import load_agent
from osmosis_rollout.server import serve
settings = ServerSettings.resolve({"port": int(sys.argv[2])}, environ=os.environ)
serve(load_agent(sys.argv[1]), settings=settings, loop="asyncio", http="h11")
"""


@pytest.fixture(scope="module", params=["httptools", "h11"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServeProcess]:
    """One server with short head limits (1 s) and a small connection bound, on each of
    uvicorn's HTTP parsers (``osmosis serve`` picks httptools when it is installed)."""
    tmp = tmp_path_factory.mktemp("limits")
    env = clean_env(
        OSMOSIS_API_KEY=SERVER_KEY,
        OSMOSIS_HEADER_TIMEOUT_S="1",
        OSMOSIS_MAX_CONNECTIONS=str(MAX_CONNECTIONS),
        OSMOSIS_OUTBOX_DIR=str(tmp / "outbox"),
    )
    if request.param == "httptools":
        with osmosis_serve(
            tmp / "server.log", AGENT, "--port", "0", "--no-validate", env=env
        ) as server:
            yield server
        return
    port = free_port()
    log = tmp / "server.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-c", _H11_SERVER, AGENT, str(port)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=env,
            start_new_session=True,
        )
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc, log)
        yield ServeProcess(proc, port, log)
    finally:
        stop_process(proc)


def _head_refused(answer: bytes) -> None:
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert b"larger than 64 KiB" in answer


def _connect(server: ServeProcess) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.settimeout(10)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def test_an_idle_connection_is_closed_after_the_header_timeout(served: ServeProcess) -> None:
    """A socket that never sends a byte is closed (nothing written) once the head is late."""
    started = time.monotonic()
    with _connect(served) as sock:
        assert _read_all(sock) == b""
    assert time.monotonic() - started < 5


def test_a_head_sent_one_byte_at_a_time_gets_408_at_the_header_timeout(
    served: ServeProcess,
) -> None:
    """A slow drip does not restart the clock: 408 and close at the bound, not at 70 s."""
    head = b"POST /v1/rollout/init HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200
    started = time.monotonic()
    with _connect(served) as sock:
        for byte in head:
            try:
                sock.send(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(0.05)
            if time.monotonic() - started > 8:
                break
        answer = _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert b"request headers took longer than 1 s" in answer
    assert time.monotonic() - started < 5


def test_sixty_megabytes_of_headers_get_431_and_are_not_read(served: ServeProcess) -> None:
    """The head is bounded (64 KiB): the server answers 431 and closes long before 60 MB."""
    sent = 0
    line = b"X-Pad: " + b"b" * 8000 + b"\r\n"
    with _connect(served) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        try:
            while sent < 60 * 2**20:
                sock.sendall(line)
                sent += len(line)
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = _read_all(sock)
    assert sent < 8 * 2**20  # refused after a few socket buffers, not at the end
    if answer:  # a reset may beat the answer to the client: closed early is what matters
        _head_refused(answer)


def test_one_large_head_in_a_single_read_gets_431(served: ServeProcess) -> None:
    """A 100 KB head that arrives whole (it completes in one read) is refused too."""
    head = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"c" * 100_000 + b"\r\n\r\n"
    with _connect(served) as sock:
        sock.sendall(head)
        answer = _read_all(sock)
    _head_refused(answer)


def test_connections_beyond_the_bound_get_503_at_once_and_the_server_recovers(
    served: ServeProcess,
) -> None:
    """Past max_connections a new connection is answered 503 and closed; once the idle ones
    go, requests are served again."""
    idle = [_connect(served) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.2)
        with _connect(served) as extra:
            answer = _read_all(extra)
        assert answer.startswith(b"HTTP/1.1 503 "), answer[:200]
        assert b"too many open connections (the limit is 24)" in answer
    finally:
        for sock in idle:
            sock.close()
    time.sleep(0.3)
    assert httpx2.get(f"{served.url}/health", timeout=5).status_code == 200


def test_keep_alive_requests_are_served_and_each_head_is_timed_afresh(
    served: ServeProcess,
) -> None:
    """Normal use is untouched: three requests on one kept-alive connection, each within the
    header timeout of the previous response, all answered."""
    with httpx2.Client(base_url=served.url, timeout=5) as http:
        for _ in range(3):
            assert http.get("/health").status_code == 200
            time.sleep(0.6)  # < 1 s each, > 1 s in all


def test_the_soft_file_limit_is_raised_to_the_hard_limit(tmp_path: Path) -> None:
    """At start the server lifts its soft file limit (often 1,024) to the hard one."""
    code = (
        "import resource\n"
        "from osmosis_rollout.server.connections import raise_file_limit\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))\n"
        "raised = raise_file_limit()\n"
        "print(raised == (hard, hard), resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert done.stdout.split() == ["True", "True"], done.stderr


def test_osmosis_serve_runs_with_its_soft_file_limit_raised_to_the_hard_one(
    tmp_path: Path,
) -> None:
    """A server started with a soft limit of 256 and a hard one of 4,096 runs at 4,096."""
    require_program("prlimit")
    env = clean_env(OSMOSIS_API_KEY=SERVER_KEY)
    with osmosis_serve(
        tmp_path / "server.log",
        AGENT,
        "--port",
        "0",
        "--no-validate",
        "--outbox-dir",
        str(tmp_path / "outbox"),
        env=env,
        limit_files=(256, 4096),
    ) as server:
        limits = Path(f"/proc/{server.proc.pid}/limits").read_text()
    line = next(row for row in limits.splitlines() if row.startswith("Max open files"))
    assert line.split()[3:5] == ["4096", "4096"], line
