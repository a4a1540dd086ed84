"""Which wire a server speaks, from one ``GET /health`` (``evaluation/wire_probe.py``): the
shapes each Osmosis server answers, and our own server's real answer."""

from __future__ import annotations

import json

import httpx2
import pytest

from osmosis_rollout.evaluation.wire_probe import probe_wire, wire_of_health
from osmosis_rollout.server import create_app

from .support import load_asset, serve_in_thread

pytestmark = pytest.mark.anyio

#: What osmosis-ai 0.3.2's LocalBackend answers, and 0.3.8's (read from their sources).
OFFICIAL_032 = {"status": "ok", "instance_id": "i-1"}
OFFICIAL_038 = {
    "status": "ok",
    "concurrency": {"max_concurrent": 4, "in_flight": 0},
    "instance_id": "i-1",
    "process_id": "p-1",
    "lifecycle": {"accepting_rollouts": True, "active_rollouts": 0},
}


@pytest.mark.parametrize(
    ("body", "wire"),
    [
        (OFFICIAL_032, "v2"),
        (OFFICIAL_038, "polling"),
        ({"status": "healthy", "agent_loop": "calc", "active_rollouts": 0}, "v1"),
        ({**OFFICIAL_038, "agent_loop": "calc"}, "v1"),  # ours speaks every wire
        ({"ok": True}, "v1"),
    ],
)
def test_each_servers_health_names_its_wire(body: dict[str, object], wire: str) -> None:
    probed = wire_of_health(200, json.dumps(body).encode())
    assert probed.protocol == wire
    assert probed.reason


def test_a_health_that_is_not_json_keeps_the_default() -> None:
    probed = wire_of_health(200, b"<html>ok</html>")
    assert probed.protocol == "v1"
    assert "without a JSON object" in probed.reason


async def test_our_own_servers_health_is_read_as_ours() -> None:
    app = create_app(load_asset("hrd_agents").Quick())
    with serve_in_thread(app, lifespan="on") as url:
        async with httpx2.AsyncClient() as http:
            probed = await probe_wire(http, url)
    assert probed.protocol == "v1"
    assert "osmosis-rollout server" in probed.reason


async def test_an_unreachable_server_keeps_the_default() -> None:
    async with httpx2.AsyncClient() as http:
        probed = await probe_wire(http, "http://127.0.0.1:9")
    assert probed.protocol == "v1"
    assert "could not be read" in probed.reason
