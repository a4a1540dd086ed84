"""The rollout server in-process: ``create_app`` through ``httpx2.ASGITransport``, its TrainGate a
``MockTrainGate`` behind a ``RecordingGate``; ``serving(agent, tmp_path)`` yields a ``Served``."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import httpx2

from osmosis_rollout import RolloutAgentLoop
from osmosis_rollout.client import RetryPolicy, TrainGateClient
from osmosis_rollout.protocol import InitResponse
from osmosis_rollout.server import RolloutServer, create_app
from osmosis_rollout.testing import MockTrainGate, ScriptedBackend

from .gates import ADD_CALL, ANSWER, COMPLETED, RecordingGate

#: Where the in-process TrainGate answers, the key the server requires, and TrainGate's own key.
GATE_URL = "http://traingate.test"
SERVER_KEY = "server-key-0123456789"
TG_KEY = "tg-secret-api-key-9876"


def init_body(rollout_id: str = "r-1", **overrides: Any) -> dict[str, Any]:
    """A valid init body for the in-process gate."""
    body: dict[str, Any] = {
        "rollout_id": rollout_id,
        "server_url": GATE_URL,
        "messages": [{"role": "user", "content": "What is 3 + 4?"}],
        "completion_params": {"temperature": 0.7, "max_tokens": 64},
        "api_key": TG_KEY,
    }
    body.update(overrides)
    return body


class Sleeps:
    """The client's sleep: records each retry delay and only yields, so tests stay fast."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        await anyio.lowlevel.checkpoint()


class SplitTransport(httpx2.AsyncBaseTransport):
    """Chat turns go to the in-process gate; completion callbacks go to the real network."""

    def __init__(self, chat: httpx2.AsyncBaseTransport, callback: httpx2.AsyncBaseTransport):
        self.chat = chat
        self.callback = callback

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        target = self.callback if request.url.path == COMPLETED else self.chat
        return await target.handle_async_request(request)

    async def aclose(self) -> None:
        await self.callback.aclose()


@dataclass
class Served:
    """A running in-process server, its gate, and what the gate saw."""

    http: httpx2.AsyncClient
    server: RolloutServer
    gate: MockTrainGate
    raw: RecordingGate
    sleeps: Sleeps

    async def init(
        self, body: dict[str, Any] | bytes, *, key: str | None = SERVER_KEY, **headers: str
    ) -> httpx2.Response:
        """POST one init (registering a dict body's rollout with the gate first)."""
        if isinstance(body, dict) and body.get("rollout_id") not in self.gate.records:
            self.gate.expect(str(body["rollout_id"]), api_key=body.get("api_key"))
        content = json.dumps(body).encode() if isinstance(body, dict) else body
        sent = {"Content-Type": "application/json", **headers}
        if key is not None:
            sent["Authorization"] = f"Bearer {key}"
        response = await self.http.post("/v1/rollout/init", content=content, headers=sent)
        if response.status_code == 202:  # what gate.init_rollout does: learn the tools
            init = InitResponse.model_validate_json(response.content)
            self.gate.records[init.rollout_id].tools = list(init.tools)
        return response

    async def settle(self) -> None:
        """Wait until every accepted rollout has handled its one callback."""
        with anyio.fail_after(5):
            for entry in self.server.registry.unfinished():
                await entry.finished.wait()

    async def health(self) -> httpx2.Response:
        """GET /health."""
        return await self.http.get("/health")

    def completions(self, rollout_id: str) -> list[Any]:
        """The completion callbacks the gate accepted for one rollout."""
        return self.gate.records[rollout_id].completions


@contextlib.asynccontextmanager
async def serving(
    agent: RolloutAgentLoop,
    tmp_path: Path,
    *,
    replies: list[dict[str, Any]] | None = None,
    refuse_callbacks: bool = False,
    **options: Any,
) -> AsyncIterator[Served]:
    """Run ``create_app(agent)`` with its lifespan; TrainGate answers ``replies`` per turn."""
    gate = MockTrainGate(ScriptedBackend(list(replies or [ADD_CALL, ANSWER])))
    raw = RecordingGate(gate.app)
    transport: httpx2.AsyncBaseTransport = httpx2.ASGITransport(app=raw)
    if refuse_callbacks:
        transport = SplitTransport(transport, httpx2.AsyncHTTPTransport())
    sleeps = Sleeps()
    options.setdefault("api_key", SERVER_KEY)
    options.setdefault("outbox_dir", tmp_path / "outbox")
    options.setdefault("shutdown_grace_s", 0.0)
    async with httpx2.AsyncClient(transport=transport, timeout=5.0) as gate_http:
        retry = RetryPolicy(retries=3, base_delay_s=0.01, max_delay_s=0.05, connect_timeout_s=2)
        client = TrainGateClient(gate_http, retry=retry, sleep=sleeps)
        app = create_app(agent, client=client, **options)
        async with (
            app.router.lifespan_context(app),
            httpx2.AsyncClient(
                transport=httpx2.ASGITransport(app=app), base_url="http://rollout.test"
            ) as http,
        ):
            yield Served(http, app.state.rollout_server, gate, raw, sleeps)
