"""Which wire a server speaks, from one ``GET /health`` (``evaluation/wire_probe.py``): the
shapes each Osmosis server answers, our own server's real answer, and the warning when a given
``--protocol`` is not the wire it shows."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest

from osmosis_rollout.evaluation import TestOptions
from osmosis_rollout.evaluation.served import served
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


def _health_app(body: dict[str, object]) -> Any:
    """A server whose only route is ``GET /health`` answering ``body``."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def health(request: Any) -> JSONResponse:
        return JSONResponse(body)

    return Starlette(routes=[Route("/health", health)])


async def _forced(url: str, protocol: str) -> tuple[str | None, list[str], list[str]]:
    said: list[str] = []
    warned: list[str] = []
    options = TestOptions(server=url, protocol=protocol)
    async with served(options, said.append, warned.append) as live:
        chosen = live.wire.protocol
    return chosen, said, warned


async def test_a_forced_protocol_that_health_contradicts_is_warned_of_at_once() -> None:
    with serve_in_thread(_health_app(OFFICIAL_038)) as url:
        chosen, _, warned = await _forced(url, "v2")
    assert chosen == "v2"  # a warning, not a refusal: the user may mean it
    assert warned == [
        "--protocol v2 given, but /health shows the polling wire (osmosis-ai 0.3.3 or later): "
        "rollouts will likely never end (it sends no callback); drop --protocol to use polling"
    ]
    with serve_in_thread(_health_app(OFFICIAL_032)) as url:
        chosen, _, warned = await _forced(url, "polling")
    assert chosen == "polling"
    assert len(warned) == 1
    assert warned[0].startswith("--protocol polling given, but /health shows the v2 wire")
    assert "refused with HTTP 422" in warned[0]
    assert warned[0].endswith("drop --protocol to use v2")


@pytest.mark.parametrize(
    ("body", "protocol"),
    [
        (OFFICIAL_038, "polling"),  # agrees
        (OFFICIAL_032, "v2"),
        ({**OFFICIAL_038, "agent_loop": "calc"}, "v2"),  # ours speaks every wire
        ({"ok": True}, "polling"),  # an unusual /health tells nothing
    ],
)
async def test_a_forced_protocol_health_agrees_with_or_cannot_tell_is_quiet(
    body: dict[str, object], protocol: str
) -> None:
    with serve_in_thread(_health_app(body)) as url:
        chosen, said, warned = await _forced(url, protocol)
    assert chosen == protocol
    assert warned == []
    assert said == []
