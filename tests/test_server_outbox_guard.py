"""Nothing accepted is lost when files run out, and the outbox cannot grow without end
(``server/outbox_guard.py``, with the scheduler and delivery it guards).

The file-limit scenario is the review's: a real ``osmosis serve`` whose file limit is filled with
idle sockets, an init answered 202 on a connection opened before, a TrainGate it then cannot
reach and an outbox it cannot write. The result must end in exactly one callback or one outbox
file, and new inits must be refused (503) while it is only in memory.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx2
import pytest
from pydantic import SecretStr

from osmosis_rollout.client import RetryPolicy, TrainGateClient
from osmosis_rollout.config import ServerSettings
from osmosis_rollout.server import create_app
from osmosis_rollout.testing import MockTrainGate

from .processes import REPO, clean_env, osmosis_serve
from .programs import require_program
from .serving import SERVER_KEY, init_body
from .support import load_asset, serve_in_thread, wait_until
from .torture import outbox_ids

hrd = load_asset("hrd_agents")

QUICK = f"{REPO / 'tests' / 'assets' / 'hrd_agents.py'}:Quick"
TG_KEY = "tg-key-at-the-limit"


def _init(rollout_id: str, gate_url: str) -> dict[str, object]:
    return {
        "rollout_id": rollout_id,
        "server_url": gate_url,
        "messages": [{"role": "user", "content": "What is 3 + 4?"}],
        "completion_params": {"temperature": 0.7, "max_tokens": 64},
        "api_key": TG_KEY,
    }


def _fill(port: int, count: int) -> list[socket.socket]:
    """Open ``count`` idle sockets to the server (those it cannot accept wait or are dropped)."""
    idle = []
    for _ in range(count):
        with contextlib.suppress(OSError):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=2))
    return idle


@pytest.mark.slow
def test_at_the_file_limit_every_accepted_rollout_ends_once_and_inits_get_503(
    tmp_path: Path,
) -> None:
    """At its file limit (idle sockets hold every file handle) the server still answers on an
    open connection; each rollout it accepts cannot call back nor write its outbox file, so it
    holds the result and refuses new inits with 503; once handles are free the results are
    written: every accepted rollout ends in exactly one callback or one outbox file."""
    require_program("prlimit")
    gate = MockTrainGate()
    outbox = tmp_path / "outbox"
    env = clean_env(
        OSMOSIS_API_KEY=SERVER_KEY,
        # What a mistaken setting allows: connections without bound, kept for long.
        OSMOSIS_MAX_CONNECTIONS="100000",
        OSMOSIS_HEADER_TIMEOUT_S="300",
        OSMOSIS_KEEP_ALIVE_TIMEOUT_S="300",
    )
    headers = {"Authorization": f"Bearer {SERVER_KEY}"}
    accepted: list[str] = []
    refused: list[str] = []
    with (
        serve_in_thread(gate.app) as gate_url,
        osmosis_serve(
            tmp_path / "server.log",
            QUICK,
            "--port",
            "0",
            "--no-validate",
            "--outbox-dir",
            str(outbox),
            env=env,
            limit_files=200,
        ) as server,
        httpx2.Client(base_url=server.url, headers=headers, timeout=60) as http,
    ):
        assert http.get("/health").status_code == 200  # this connection stays open
        idle = _fill(server.port, 400)
        try:
            time.sleep(0.5)
            deadline = time.monotonic() + 40
            while time.monotonic() < deadline and not refused:
                rid = f"at-limit-{len(accepted)}"
                gate.expect(rid, api_key=TG_KEY)
                answer = http.post("/v1/rollout/init", json=_init(rid, gate_url))
                if answer.status_code == 202:
                    accepted.append(rid)
                else:
                    assert answer.status_code == 503, answer.text
                    assert "the outbox cannot be written" in answer.json()["detail"]
                    assert answer.headers["retry-after"]
                    refused.append(rid)
                time.sleep(1.0)
        finally:
            for sock in idle:
                sock.close()
        assert accepted, server.output()
        assert refused, f"never refused while at the file limit:\n{server.output()}"
        # Handles are free again: the held results reach the outbox within a few seconds.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            ends = [
                len(gate.records[r].completions) + outbox_ids(outbox).count(r) for r in accepted
            ]
            if all(ends):
                break
            time.sleep(0.2)
        log = server.output()
        assert http.post("/v1/rollout/init", json=_init("after", gate_url)).status_code == 202
    for rid in accepted:
        ends = len(gate.records[rid].completions) + outbox_ids(outbox).count(rid)
        assert ends == 1, f"{rid}: {ends} ends\n{log}"
    assert "held result written to the outbox" in log
    assert TG_KEY not in log


@contextlib.asynccontextmanager
async def _refusing(tmp_path: Path, **limits: int) -> AsyncIterator[httpx2.AsyncClient]:
    """A server whose TrainGate refuses every callback (400: straight to the outbox)."""

    def refuse(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(400, json={"detail": "refused"})

    settings = ServerSettings(
        api_key=SecretStr(SERVER_KEY),
        outbox_dir=tmp_path / "outbox",
        shutdown_grace_s=0,
        **limits,  # type: ignore[arg-type]
    )
    gate_http = httpx2.AsyncClient(transport=httpx2.MockTransport(refuse))
    client = TrainGateClient(gate_http, retry=RetryPolicy(retries=0))
    app = create_app(hrd.Quick(), settings=settings, client=client)
    async with (
        gate_http,
        app.router.lifespan_context(app),
        httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=app),
            base_url="http://127.0.0.1",
            headers={"Authorization": f"Bearer {SERVER_KEY}"},
        ) as http,
    ):
        yield http


async def _settle(outbox: Path, count: int) -> None:
    await wait_until(lambda: len(outbox_ids(outbox)) >= count, 10)


@pytest.mark.anyio
async def test_a_full_outbox_refuses_new_inits_with_503_and_keeps_every_result(
    tmp_path: Path,
) -> None:
    """Past outbox_max_entries, inits get a 503 that says why and what to do; the results of
    accepted rollouts are all kept; once the outbox is emptied (a replay), inits are taken."""
    outbox = tmp_path / "outbox"
    async with _refusing(tmp_path, outbox_max_entries=3) as http:
        for i in range(3):
            answer = await http.post("/v1/rollout/init", json=init_body(f"full-{i}"))
            assert answer.status_code == 202
        await _settle(outbox, 3)
        answer = await http.post("/v1/rollout/init", json=init_body("full-3"))
        assert answer.status_code == 503
        detail = answer.json()["detail"]
        assert detail.startswith("the outbox is full (3 results")
        assert "osmosis outbox replay" in detail
        assert "outbox_max_entries" in detail
        assert answer.headers["retry-after"]
        assert sorted(outbox_ids(outbox)) == ["full-0", "full-1", "full-2"]
        for path in outbox.glob("*.json"):  # what a successful replay does
            path.unlink()
        await anyio.sleep(2.1)  # the folder is counted again at most every 2 s
        answer = await http.post("/v1/rollout/init", json=init_body("full-4"))
        assert answer.status_code == 202


@pytest.mark.anyio
async def test_the_outbox_byte_cap_counts_results_already_on_disk(tmp_path: Path) -> None:
    """Results left by an earlier run count too: a folder over outbox_max_bytes refuses at the
    first init."""
    outbox = tmp_path / "outbox"
    outbox.mkdir()
    record = {"server_url": "http://t", "error": "e", "written_at": 0, "response": {}}
    (outbox / "old.20260101T000000.abcdef.json").write_text(
        json.dumps(record) + " " * 4096, encoding="utf-8"
    )
    async with _refusing(tmp_path, outbox_max_bytes=4096) as http:
        answer = await http.post("/v1/rollout/init", json=init_body("bytes-0"))
        assert answer.status_code == 503
        assert answer.json()["detail"].startswith("the outbox is full (1 results, 0.0 MiB")
