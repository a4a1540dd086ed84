"""main.py, started the platform's way: on the port and with the instance id it is given."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

MAIN = Path(__file__).parents[1] / "main.py"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _health(url: str) -> tuple[dict[str, object], str | None] | None:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            header = response.headers.get("x-osmosis-rollout-instance-id")
            return json.loads(response.read()), header
    except (OSError, urllib.error.URLError):
        return None


def test_main_serves_the_agent_on_the_platforms_port(tmp_path: Path) -> None:
    """`_OSMOSIS_ROLLOUT_PORT=P python main.py` answers /health on P with the platform's id."""
    port = _free_port()
    # Settings of your shell (OSMOSIS_PORT would win over the platform's port) stay out.
    mine = ("OSMOSIS_", "_OSMOSIS_")
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(mine)}
    env = {
        **inherited,
        "_OSMOSIS_ROLLOUT_PORT": str(port),
        "_OSMOSIS_ROLLOUT_INSTANCE_ID": "test-instance",
        "OSMOSIS_HOST": "127.0.0.1",  # tests stay on this machine
    }
    log = tmp_path / "serve.log"
    with log.open("wb") as sink:
        server = subprocess.Popen(
            [sys.executable, str(MAIN)], cwd=tmp_path, env=env, stdout=sink, stderr=sink
        )
    try:
        deadline = time.monotonic() + 60
        found = None
        while found is None and time.monotonic() < deadline and server.poll() is None:
            found = _health(f"http://127.0.0.1:{port}/health")
            time.sleep(0.1)
        assert found is not None, log.read_text(errors="replace")
        body, header = found
        assert body["agent_loop"] == "__PROJECT__"
        assert header == "test-instance"
    finally:
        server.terminate()
        server.wait(timeout=60)
