"""Shared by ``soak_v2.py`` and ``bench_wire_cpu.py``: a controller that speaks both wires.

``Controller`` is a raw ASGI app (cheap, so the benchmark side stays out of the way) served by
uvicorn in the benchmark's own event loop on 127.0.0.1. It answers v1's chat and completion
paths and v2's per-rollout chat, completion and grader paths, scripts the two-turn tool
conversation of ``tests/assets/srv_agents.py:ToolAgent`` (an ``add`` call, then the answer),
counts each part it accepted per rollout, and fails about ``fault_rate`` of all calls (500,
429 without ``Retry-After``, or a 400 that is not retried), each fault's body echoing the
bearer key so that a leak would show in the server's log or outbox.
"""

from __future__ import annotations

import collections
import contextlib
import json
import random
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import uvicorn

LLM_KEY = 'llm-"key"\\b/%2F+9'
CONTROLLER_KEY = "controller-key-'4'\\n"
V1_KEY = "v1-key-5"

_ADD = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a":3,"b":4}'}}
    ],
}
_ANSWER = {"role": "assistant", "content": "3 + 4 = 7"}
_USAGE = {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25}


def _reply(turn: int) -> bytes:
    message = _ADD if turn == 0 else _ANSWER
    finish = "tool_calls" if turn == 0 else "stop"
    return json.dumps(
        {
            "id": f"c{turn}",
            "object": "chat.completion",
            "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": _USAGE,
        }
    ).encode()


_REPLIES = [_reply(0), _reply(1)]


@dataclass
class Controller:
    """The two wires' trainer side; see the module docstring."""

    fault_rate: float = 0.0
    seed: int = 13
    turns: collections.Counter[str] = field(default_factory=collections.Counter)
    delivered: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    refused: set[tuple[str, str]] = field(default_factory=set)
    faults: collections.Counter[str] = field(default_factory=collections.Counter)
    ended: dict[str, anyio.Event] = field(default_factory=dict)
    #: With ``record``: each accepted callback's (part, status, monotonic time), by rollout.
    record: bool = False
    seen: dict[str, list[tuple[str, str, float]]] = field(default_factory=dict)
    url: str = ""

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def waiter(self, rid: str) -> anyio.Event:
        """Set when the rollout's terminal part (v2: grader, v1: completion) was accepted or
        refused for good."""
        return self.ended.setdefault(rid, anyio.Event())

    def _fault(self, kind: str) -> int | None:
        if self._rng.random() >= self.fault_rate:
            return None
        status = self._rng.choice([500, 500, 429, 400])
        self.faults[f"{kind} {status}"] += 1
        return status

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        path = scope["path"]
        auth = dict(scope["headers"]).get(b"authorization", b"").decode()
        parts = path.strip("/").split("/")
        if path == "/v1/chat/completions":
            rid, kind, part = json.loads(body)["rollout_id"], "chat", ""
        elif path == "/v1/rollout/completed":
            rid, kind, part = json.loads(body)["rollout_id"], "callback", "completion"
        elif parts[:2] == ["v1", "rollouts"] and parts[-2:] == ["chat", "completions"]:
            rid, kind, part = parts[2], "chat", ""
        elif parts[:2] == ["v1", "rollouts"] and parts[-1] in ("completion", "grader"):
            rid, kind, part = parts[2], "callback", parts[-1]
        else:
            await _send(send, 404, b'{"detail":"Not Found"}')
            return
        status = self._fault(kind)
        if status is not None:
            if status == 400 and part:
                self.refused.add((rid, part))
                self._maybe_end(rid, part, path)
            await _send(send, status, json.dumps({"detail": f"injected; got {auth}"}).encode())
            return
        if kind == "chat":
            turn = self.turns[rid]
            self.turns[rid] += 1
            await _send(send, 200, _REPLIES[min(turn, 1)])
            return
        self.delivered[(rid, part)] += 1
        if self.record:
            status = str(json.loads(body).get("status"))
            self.seen.setdefault(rid, []).append((part, status, time.monotonic()))
        self._maybe_end(rid, part, path)
        await _send(send, 200, b'{"ok":true}')

    def _maybe_end(self, rid: str, part: str, path: str) -> None:
        v1 = path == "/v1/rollout/completed"
        if v1 or part == "grader" or (rid, "completion") in self.refused:
            self.waiter(rid).set()


async def _send(send: Any, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@contextlib.asynccontextmanager
async def served(controller: Controller) -> AsyncIterator[str]:
    """Serve ``controller`` on 127.0.0.1 in this event loop; yields its URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    config = uvicorn.Config(controller, lifespan="off", log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    async with anyio.create_task_group() as tasks:
        # The socket listens already: connections made before uvicorn starts wait in its backlog.
        tasks.start_soon(lambda: server.serve(sockets=[sock]))
        controller.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        try:
            yield controller.url
        finally:
            server.should_exit = True
    sock.close()


def v2_body(url: str, rid: str, *, grader: bool = True) -> dict[str, Any]:
    """A v2 init whose three URLs are the controller's for ``rid``; without ``grader``, no
    grader URL (one callback, as in v1: its completion goes to the grader path, the terminal
    event the controller waits for)."""
    base = f"{url}/v1/rollouts/{rid}"
    if not grader:
        return {
            "rollout_id": rid,
            "initial_messages": [{"role": "user", "content": "What is 3 + 4?"}],
            "chat_completions_url": base,
            "completion_callback_url": f"{base}/grader",
            "llm_api_key": LLM_KEY,
        }
    return {
        "rollout_id": rid,
        "initial_messages": [{"role": "user", "content": "What is 3 + 4?"}],
        "label": "7",
        "chat_completions_url": base,
        "completion_callback_url": f"{base}/completion",
        "grader_callback_url": f"{base}/grader",
        "controller_api_key": CONTROLLER_KEY,
        "llm_api_key": LLM_KEY,
        "agent_timeout_sec": 600,
        "grader_timeout_sec": 60,
    }


def v1_body(url: str, rid: str) -> dict[str, Any]:
    """A v1 init of the same rollout."""
    return {
        "rollout_id": rid,
        "server_url": url,
        "messages": [{"role": "user", "content": "What is 3 + 4?"}],
        "completion_params": {},
        "api_key": V1_KEY,
    }


def outbox_parts(outbox: Path) -> collections.Counter[tuple[str, str]]:
    """The parts still due in the outbox files, by (rollout id, part)."""
    pending: collections.Counter[tuple[str, str]] = collections.Counter()
    for path in outbox.glob("*.json"):
        data = json.loads(path.read_text())
        rid = data["response"]["rollout_id"]
        for part in (data.get("route") or {}).get("pending", ["completion"]):
            pending[(rid, part)] += 1
    return pending
