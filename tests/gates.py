"""TrainGate stand-ins for the server tests, the paths they serve and the replies they script.

``RecordingGate`` wraps a ``MockTrainGate`` app in-process: it keeps every raw request and can
answer chosen calls with a fault first. ``CallbackGate`` is a whole TrainGate of its own that only
takes completion callbacks, for servers in other processes (run it with ``serve_in_thread``).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

#: The two paths a TrainGate serves.
CHAT = "/v1/chat/completions"
COMPLETED = "/v1/rollout/completed"

#: The replies of a two-turn tool rollout: call ``add(3, 4)``, then answer.
ADD_CALL: dict[str, Any] = {
    "content": None,
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "add", "arguments": json.dumps({"a": 3, "b": 4})},
        }
    ],
}
ANSWER: dict[str, Any] = {"content": "3 + 4 = 7"}


@dataclass
class RawCall:
    """One request as it arrived at the gate, before any parsing."""

    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body as JSON."""
        return json.loads(self.body)


@dataclass
class RecordingGate:
    """An ASGI wrapper around a TrainGate app: records raw requests, injects scripted faults."""

    app: Any
    calls: list[RawCall] = field(default_factory=list)
    faults: dict[str, list[Response]] = field(default_factory=dict)

    def fail_next(self, path: str, status: int, headers: dict[str, str] | None = None) -> None:
        """Answer the next call to ``path`` with ``status`` instead of passing it on."""
        response = JSONResponse({"detail": f"injected {status}"}, status, headers=headers)
        self.faults.setdefault(path, []).append(response)

    def calls_to(self, path: str) -> list[RawCall]:
        """The recorded calls to one path, in order."""
        return [c for c in self.calls if c.path == path]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        body = await request.body()
        headers = {k.lower(): v for k, v in request.headers.items()}
        self.calls.append(RawCall(request.url.path, headers, body))
        pending = self.faults.get(request.url.path)
        if pending:
            await pending.pop(0)(scope, receive, send)
            return
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


@dataclass
class Callback:
    """One completion callback as the gate received it."""

    body: dict[str, Any]
    at: float  # time.monotonic()
    authorization: str | None = None


@dataclass
class CallbackGate:
    """Records completion callbacks by rollout id (thread-safe: uvicorn runs in a thread)."""

    callbacks: dict[str, list[Callback]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def completed(self, request: Request) -> Response:
        body = await request.json()
        with self.lock:
            self.callbacks.setdefault(body["rollout_id"], []).append(
                Callback(body, time.monotonic(), request.headers.get("authorization"))
            )
        return Response(status_code=200)

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/rollout/completed", self.completed, methods=["POST"])])

    def count(self) -> int:
        with self.lock:
            return sum(len(v) for v in self.callbacks.values())


def init(rollout_id: str, gate_url: str, sleep_s: float) -> dict[str, Any]:
    """An init body for ``tests/assets/replica_agent.py:SleepAgent`` (it sleeps ``sleep_s``) that
    sends its callback to the gate at ``gate_url``."""
    return {
        "rollout_id": rollout_id,
        "server_url": gate_url,
        "messages": [{"role": "user", "content": f"task {rollout_id}"}],
        "completion_params": {},
        "metadata": {"sleep_s": sleep_s},
        "api_key": "tg-key-for-replicas",
    }
