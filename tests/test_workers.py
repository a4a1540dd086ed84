"""``osmosis serve --workers N``: N processes on one port, supervised and stopped as one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import anyio.to_thread
import httpx2
import pytest

from .gates import CallbackGate, init
from .processes import REPO, ServeProcess, clean_env, osmosis_serve, stop_process
from .support import free_port, wait_until

AGENT = f"{REPO / 'tests' / 'assets' / 'replica_agent.py'}:SleepAgent"

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


def children(server: ServeProcess) -> set[int]:
    """The supervisor's child processes (Linux /proc)."""
    pid = server.proc.pid
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text(encoding="utf-8")
    return {int(p) for p in text.split()}


def replaced_without(server: ServeProcess, victim: int) -> bool:
    """Whether the supervisor again has two children, ``victim`` not among them."""
    now = children(server)
    return len(now) == 2 and victim not in now


def alive(pid: int) -> bool:
    """Whether process ``pid`` still exists."""
    return Path(f"/proc/{pid}").exists()


async def test_workers_share_the_port_are_replaced_and_drain_together(
    tmp_path: Path, redis_url: str, gate: tuple[CallbackGate, str]
) -> None:
    """Two workers both serve inits on one port; a killed worker is replaced; SIGTERM to the
    supervisor lets every in-flight rollout finish on both, then all processes exit 0."""
    recorder, gate_url = gate
    with osmosis_serve(
        tmp_path / "server.log",
        AGENT,
        "--port",
        "0",
        "--no-validate",
        "--workers",
        "2",
        "--state",
        redis_url,
        "--shutdown-grace",
        "20",
        env=clean_env(),
    ) as server:
        first = children(server)
        no_reuse = httpx2.Limits(max_keepalive_connections=0)  # a new connection per init
        async with httpx2.AsyncClient(timeout=30, limits=no_reuse) as http:
            n = 0
            while len({c[0].body["extra_fields"]["pid"] for c in recorder.callbacks.values()}) < 2:
                assert n < 200, f"one worker took every connection: {recorder.callbacks.keys()}"
                await http.post(f"{server.url}/v1/rollout/init", json=init(f"w-{n}", gate_url, 0))
                n += 1
                await anyio.sleep(0.01)
            pids = {c[0].body["extra_fields"]["pid"] for c in recorder.callbacks.values()}

            victim = min(first)
            os.kill(victim, signal.SIGKILL)
            await wait_until(
                lambda: len(children(server)) == 2 and victim not in children(server), 20
            )
            replaced = children(server)
            await wait_until(lambda: "starting a new one" in server.output(), 5)

            in_flight = [f"slow-{i}" for i in range(6)]
            for rid in in_flight:
                response = await http.post(
                    f"{server.url}/v1/rollout/init", json=init(rid, gate_url, 1.5)
                )
                assert response.status_code == 202
            server.proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            code = await anyio.to_thread.run_sync(lambda: server.proc.wait(timeout=30))

    assert pids == first
    assert len(replaced) == 2
    assert code == 0
    for rid in in_flight:
        [callback] = recorder.callbacks[rid]
        assert callback.body["status"] == "COMPLETED"
        assert callback.at >= signalled  # drained: they finished after the signal, not cut off
    assert not any(alive(pid) for pid in replaced)
    assert f"worker {victim} died (signal 9); starting a new one" in server.output()


def test_memory_state_with_workers_warns_about_idempotency(tmp_path: Path) -> None:
    """--workers with the memory backend serves, but says what is lost and what to use."""
    with osmosis_serve(
        tmp_path / "server.log", AGENT, "--port", "0", "--no-validate", "--workers", "2"
    ) as server:
        output = server.output()

    assert "workers       2 processes" in output
    assert "each worker keeps its own idempotency" in " ".join(output.split())
    assert "--state redis://" in output


def test_an_unreachable_redis_at_start_is_said_in_the_banner(tmp_path: Path) -> None:
    """The server starts (Redis may come up later) but says inits get 503 until it answers."""
    log = tmp_path / "server.log"
    url = f"redis://127.0.0.1:{free_port()}/0"
    command = [sys.executable, "-m", "osmosis_rollout", "serve", AGENT, "--port", "0"]
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [*command, "--no-validate", "--state", url],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=clean_env(),
            start_new_session=True,
        )
    # The banner is printed line by line: wait for the last line we expect, not the first.
    warning = "the state store does not answer now: inits get 503"
    try:
        deadline = time.monotonic() + 20
        while warning not in " ".join(log.read_text(errors="replace").split()):
            assert proc.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.05)
    finally:
        stop_process(proc)
    output = log.read_text(errors="replace")
    assert "listening on" in output
    assert "Traceback" not in output
