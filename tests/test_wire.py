"""The wire seam (``server/wire``): v1 as one adapter, and a second wire served beside it
without any change to the core (scheduler, delivery, registry)."""

from __future__ import annotations

import ast
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import pytest

from osmosis_rollout import server as server_package
from osmosis_rollout.client import RetryPolicy, TrainGateClient
from osmosis_rollout.config import ServerSettings
from osmosis_rollout.protocol import RolloutResponse, RolloutStatus
from osmosis_rollout.server import RolloutServer
from osmosis_rollout.server.app import build_app
from osmosis_rollout.server.types import Answer, refusal
from osmosis_rollout.server.wire.v1 import V1, V1Callback
from osmosis_rollout.testing import MockTrainGate, ScriptedBackend

from .gates import ANSWER, COMPLETED, RecordingGate
from .serving import TG_KEY, init_body
from .support import load_asset

agents = load_asset("srv_agents")

pytestmark = pytest.mark.anyio


class Bare(V1):
    """A made-up second protocol: v1's body at another path, answered 202 with ``{}``."""

    start_path = "/bare/start"

    def accepted(self, rollout_id: str, tools_json: bytes) -> bytes:
        return b"{}"


@contextlib.asynccontextmanager
async def two_wires(tmp_path: Path) -> AsyncIterator[tuple[httpx2.AsyncClient, RecordingGate]]:
    gate = MockTrainGate(ScriptedBackend([ANSWER, ANSWER]))
    raw = RecordingGate(gate.app)
    for rollout_id in ("r-v1", "r-bare"):
        gate.expect(rollout_id, api_key=TG_KEY)
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=raw)) as gate_http:
        client = TrainGateClient(gate_http, retry=RetryPolicy(retries=0))
        settings = ServerSettings(outbox_dir=tmp_path / "outbox", shutdown_grace_s=5.0)
        server = RolloutServer(agents.ToolAgent(), settings, wires=(V1(), Bare()), client=client)
        app = build_app(server)
        async with (
            app.router.lifespan_context(app),
            httpx2.AsyncClient(
                transport=httpx2.ASGITransport(app=app), base_url="http://rollout.test"
            ) as http,
        ):
            yield http, raw


async def test_a_second_wire_is_served_beside_v1_by_the_same_core(tmp_path: Path) -> None:
    """Each wire's start route admits through the one scheduler and answers in its own shape;
    each rollout still ends in exactly one completion callback."""
    async with two_wires(tmp_path) as (http, raw):
        v1 = await http.post("/v1/rollout/init", json=init_body("r-v1"))
        bare = await http.post("/bare/start", json=init_body("r-bare"))
        again = await http.post("/bare/start", json=init_body("r-bare"))

    assert v1.status_code == 202
    assert v1.json()["rollout_id"] == "r-v1"
    assert [t["function"]["name"] for t in v1.json()["tools"]] == ["add", "note"]
    assert (bare.status_code, bare.content) == (202, b"{}")
    assert (again.status_code, again.content) == (202, b"{}")  # a duplicate: the same answer
    ids = sorted(json.loads(call.body)["rollout_id"] for call in raw.calls_to(COMPLETED))
    assert ids == ["r-bare", "r-v1"]


def test_v1_target_binds_the_rollouts_url_and_key() -> None:
    """A v1 rollout's chat channel and callback go to its server_url with its api_key."""
    wire = V1()
    request = wire.parse(json.dumps(init_body("r-1")).encode(), max_metadata_bytes=1024)
    target = wire.target(request)
    rebuilt = wire.target_of("r-1", request.server_url, TG_KEY)

    assert isinstance(target, V1Callback)
    assert (target.rollout_id, target.server_url, target.api_key) == (
        "r-1",
        "http://traingate.test",
        TG_KEY,
    )
    assert (rebuilt.rollout_id, rebuilt.server_url, rebuilt.api_key) == (
        target.rollout_id,
        target.server_url,
        target.api_key,
    )
    client = TrainGateClient(retry=RetryPolicy(retries=0))
    assert target.channel(client).server_url == "http://traingate.test"


async def test_v1_delivery_posts_one_completion_callback() -> None:
    """``V1Callback.deliver`` is v1's ``POST {server_url}/v1/rollout/completed``."""
    seen: list[httpx2.Request] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return httpx2.Response(200, json={})

    async with httpx2.AsyncClient(transport=httpx2.MockTransport(handler)) as http:
        client = TrainGateClient(http, retry=RetryPolicy(retries=0))
        response = RolloutResponse(
            rollout_id="r-1", status=RolloutStatus.COMPLETED, final_messages=[], reward=1.0
        )
        await V1Callback("r-1", "http://traingate.test", TG_KEY).deliver(client, response)

    [request] = seen
    assert str(request.url) == "http://traingate.test/v1/rollout/completed"
    assert request.headers["authorization"] == f"Bearer {TG_KEY}"
    assert json.loads(request.content)["rollout_id"] == "r-1"


def test_v1_answers_are_json_with_retry_after_when_asked() -> None:
    """The core's answers become v1 responses: JSON, and ``Retry-After: 5`` on a retryable 503."""
    busy = V1().respond(refusal(503, "busy", retry_after=True))
    accepted = V1().respond(Answer(202, V1().accepted("r-1", b"[]")))

    assert (busy.status_code, busy.body, busy.headers["retry-after"]) == (
        503,
        b'{"detail": "busy"}',
        "5",
    )
    assert "retry-after" not in accepted.headers
    assert accepted.body == b'{"rollout_id":"r-1","tools":[]}'
    assert accepted.media_type == "application/json"


@pytest.mark.parametrize(
    "module", ["core", "scheduler", "delivery", "replicas", "registry", "types"]
)
def test_the_core_imports_the_wires_for_types_only(module: str) -> None:
    """The core never imports ``server/wire`` at run time (only under ``TYPE_CHECKING``): a
    protocol depends on the core, never the other way round."""
    path = Path(server_package.__file__).parent / f"{module}.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    type_checking = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING"
        for node in ast.walk(block)
    }
    runtime = [
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and id(node) not in type_checking
        and node.level == 1
        and (node.module or "").split(".")[0] == "wire"
    ]
    assert runtime == []
