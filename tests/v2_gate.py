"""A protocol v2 controller stand-in for the server tests (spec section 11), on 127.0.0.1.

``V2Gate`` serves one rollout's three URLs with the id as a path segment: chat (bearer = the
LLM key; scripted replies, JSON or SSE), completion and grader callbacks (bearer = the controller
key; body id must match the path's when present; the body read with the one v2 schema,
``protocol.CompletionCallback``/``GraderCallback``, else a 422). It records every call and
can answer the next calls of a kind with a fault. ``v2_init`` builds a ``POST /rollout`` body
pointing at it.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from osmosis_rollout.protocol import CompletionCallback, GraderCallback

LLM_KEY = "llm-key-5551234"
CONTROLLER_KEY = "controller-key-7778889"


@dataclass
class Call:
    """One request the gate received."""

    authorization: str | None
    body: Any


@dataclass
class V2Gate:
    """Records chats and callbacks by rollout id (thread-safe: uvicorn runs in a thread)."""

    replies: list[dict[str, Any]] = field(default_factory=list)
    stream: bool = False
    usage: bool = False
    chats: dict[str, list[Call]] = field(default_factory=dict)
    completions: dict[str, list[Call]] = field(default_factory=dict)
    graders: dict[str, list[Call]] = field(default_factory=dict)
    faults: dict[str, list[int]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""

    def fail_next(self, kind: str, status: int, times: int = 1) -> None:
        """Answer the next ``times`` calls of ``kind`` (chat, completion, grader) with
        ``status``."""
        with self.lock:
            self.faults.setdefault(kind, []).extend([status] * times)

    def _fault(self, kind: str) -> int | None:
        with self.lock:
            pending = self.faults.get(kind)
            return pending.pop(0) if pending else None

    async def _chat(self, request: Request) -> Response:
        rid = request.path_params["rid"]
        body = json.loads(await request.body())
        with self.lock:
            calls = self.chats.setdefault(rid, [])
            calls.append(Call(request.headers.get("authorization"), body))
            turn = len(calls) - 1
        status = self._fault("chat")
        if status is not None:
            return JSONResponse({"detail": f"injected {status}"}, status)
        message = dict(self.replies[min(turn, len(self.replies) - 1)])
        message.setdefault("role", "assistant")
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        reply: dict[str, Any] = {
            "id": f"chat-{rid}-{turn}",
            "object": "chat.completion",
            "model": body.get("model"),
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        }
        if self.usage:
            reply["usage"] = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        if not self.stream:
            return JSONResponse(reply)
        delta = dict(message)
        if delta.get("tool_calls"):
            delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(delta["tool_calls"])]
        chunk = {
            "id": reply["id"],
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        text = f": ping\n\ndata: {json.dumps(chunk)}\n\ndata: [DONE]\n\n"
        return Response(text, media_type="text/event-stream")

    async def _callback(self, request: Request) -> Response:
        rid, kind = request.path_params["rid"], request.path_params["kind"]
        body = json.loads(await request.body())
        if body.get("rollout_id") is not None and body["rollout_id"] != rid:
            return JSONResponse({"detail": "rollout_id mismatch"}, 422)
        model = CompletionCallback if kind == "completion" else GraderCallback
        try:  # the one v2 schema: a field the server sends and the model lacks fails here
            model.model_validate(body)
        except ValidationError as exc:
            return JSONResponse({"detail": str(exc)[:1000]}, 422)
        status = self._fault(kind)
        with self.lock:
            store = self.completions if kind == "completion" else self.graders
            if status is None:
                store.setdefault(rid, []).append(Call(request.headers.get("authorization"), body))
        if status is not None:
            return JSONResponse({"detail": f"injected {status}"}, status)
        return JSONResponse({"ok": True})

    def app(self) -> Starlette:
        """The gate's routes."""
        return Starlette(
            routes=[
                Route("/v1/rollouts/{rid}/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/rollouts/{rid}/{kind:str}", self._callback, methods=["POST"]),
            ]
        )

    def ended(self, rid: str) -> bool:
        """Whether the rollout's terminal callback (grader) arrived."""
        with self.lock:
            return bool(self.graders.get(rid))


def v2_init(gate_url: str, rollout_id: str | None, **overrides: Any) -> dict[str, Any]:
    """A ``POST /rollout`` body whose three URLs are the gate's for ``rollout_id``."""
    segment = rollout_id or "unnamed"
    base = f"{gate_url}/v1/rollouts/{segment}"
    body: dict[str, Any] = {
        "initial_messages": [{"role": "user", "content": "What is 3 + 4?"}],
        "label": "7",
        "metadata": {},
        "chat_completions_url": base,
        "controller_api_key": CONTROLLER_KEY,
        "llm_api_key": LLM_KEY,
        "completion_callback_url": f"{base}/completion",
        "grader_callback_url": f"{base}/grader",
        "agent_timeout_sec": 30,
        "grader_timeout_sec": 30,
    }
    if rollout_id is not None:
        body["rollout_id"] = rollout_id
    body.update(overrides)
    return body
