"""A scriptable OpenAI-compatible chat server for tests: real HTTP, replies decided by the test.

``OpenAIStub().app`` is a Starlette app serving ``POST /v1/chat/completions`` (and
``GET /v1/models``) the way llama.cpp's or vLLM's server does, including the shapes the
built-in mock LLM never produces: ``"content": null`` beside ``tool_calls``,
``finish_reason: "length"``, a tool call written as text, a reply that takes its time.

Use it in-process (``stub.transport()``, for code that accepts an ``httpx2`` client;
``stub_backend(stub)`` is an ``OpenAICompatibleBackend`` over it) or on
127.0.0.1 (``with stub.serve() as base_url:``, for code that opens its own connections, such as
``osmosis test --llm-url``). Replies come from ``stub.script`` in order, one per request; when
the script is empty, ``stub.responder`` (if set) decides, else ``stub.default`` answers. Every
request is kept in ``stub.requests``::

    stub = OpenAIStub([tool_call("add", {"a": 1, "b": 2}), text("3")])
    with stub.serve() as base_url:  # e.g. http://127.0.0.1:40123/v1
        ...
    assert stub.requests[0].body["tools"]
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx2
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from osmosis_rollout.testing import OpenAICompatibleBackend

__all__ = [
    "STUB_URL",
    "OpenAIStub",
    "RecordedRequest",
    "Reply",
    "error",
    "slow",
    "stub_backend",
    "text",
    "text_tool_call",
    "tool_call",
    "truncated",
]

MODEL = "stub-model"


@dataclass
class Reply:
    """One scripted answer.

    ``message`` is the assistant message exactly as sent (keys with ``None`` values included);
    ``finish_reason`` defaults to ``tool_calls`` when the message has some, else ``stop``.
    ``status`` other than 200, or ``raw`` (a str or JSON value), replaces the completion body.
    ``delay_s`` waits before answering. ``extra`` is merged into the top level of the body and
    ``choice_extra`` into ``choices[0]`` (e.g. ``prompt_token_ids``, ``token_ids``).
    ``usage=None`` computes one from word counts; ``omit_usage`` leaves it out.
    """

    message: dict[str, Any] = field(default_factory=lambda: {"role": "assistant", "content": "ok"})
    finish_reason: str | None = None
    status: int = 200
    raw: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    usage: dict[str, int] | None = None
    omit_usage: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    choice_extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RecordedRequest:
    """What the stub received: path, lower-cased headers, parsed JSON body, arrival time."""

    path: str
    headers: dict[str, str]
    body: Any
    received_at: float


def text(content: str, *, finish_reason: str = "stop", **options: Any) -> Reply:
    """A plain text answer."""
    return Reply({"role": "assistant", "content": content}, finish_reason, **options)


def truncated(content: str, **options: Any) -> Reply:
    """A text answer cut by the token limit (``finish_reason: "length"``)."""
    return text(content, finish_reason="length", **options)


def tool_call(
    name: str,
    arguments: dict[str, Any] | str,
    *,
    call_id: str = "call_1",
    content: str | None = None,
    **options: Any,
) -> Reply:
    """A tool call as real servers send it: ``"content": null`` is present, not omitted.

    ``arguments`` is sent as given when a string (to script odd spacing), else as
    ``json.dumps`` would write it.
    """
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    message = {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {
                "index": 0,
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": args},
            }
        ],
    }
    return Reply(message, "tool_calls", **options)


def text_tool_call(
    name: str, arguments: dict[str, Any], *, style: str = "json", **options: Any
) -> Reply:
    """A tool call the model wrote into ``content`` instead of ``tool_calls`` (small models do).

    ``style``: ``json`` (the bare object), ``fenced`` (a ```json block with a sentence before
    it) or ``tags`` (Hermes/Qwen ``<tool_call>...</tool_call>``).
    """
    call = json.dumps({"name": name, "arguments": arguments})
    if style == "json":
        content = call
    elif style == "fenced":
        content = f"I will use the tool.\n```json\n{call}\n```"
    elif style == "tags":
        content = f"<tool_call>\n{call}\n</tool_call>"
    else:
        raise ValueError(f"unknown style {style!r}: json, fenced or tags")
    return text(content, **options)


def slow(delay_s: float, reply: Reply | None = None) -> Reply:
    """``reply`` (default: a text answer) sent only after ``delay_s`` seconds."""
    reply = reply or text("finally")
    reply.delay_s = delay_s
    return reply


def error(status: int, message: str = "error", **options: Any) -> Reply:
    """An OpenAI-style error body with the given HTTP status."""
    return Reply(status=status, raw={"error": {"message": message}}, **options)


def _words(value: Any) -> int:
    return max(1, len(json.dumps(value).split()))


class OpenAIStub:
    """The server: scripted replies, recorded requests, in-process or on 127.0.0.1."""

    def __init__(
        self,
        script: list[Reply] | None = None,
        *,
        responder: Callable[[RecordedRequest], Reply] | None = None,
        default: Reply | None = None,
    ) -> None:
        self.script: list[Reply] = list(script or [])
        self.responder = responder
        self.default = default or text("ok")
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self.app = Starlette(routes=self.routes())

    def routes(self) -> list[Route]:
        """The routes served; subclasses add theirs (e.g. an engine's tokenizer endpoints)."""
        return [
            Route("/v1/chat/completions", self._completions, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
        ]

    @property
    def bodies(self) -> list[Any]:
        """The JSON bodies of the chat requests received so far, in order."""
        return [r.body for r in self.requests if r.path.endswith("/chat/completions")]

    def transport(self) -> httpx2.ASGITransport:
        """An in-process transport; use with base URL ``http://stub.test/v1``."""
        return httpx2.ASGITransport(app=self.app)

    @contextlib.contextmanager
    def serve(self) -> Iterator[str]:
        """Serve on 127.0.0.1 (ephemeral port) in a thread; yield the ``.../v1`` base URL.

        The socket listens before uvicorn starts (early connections wait in the backlog), and
        the server is stopped on exit even when a slow reply is still pending.
        """
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        config = uvicorn.Config(
            self.app, lifespan="off", log_level="warning", timeout_graceful_shutdown=1
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        finally:
            server.should_exit = True
            thread.join(timeout=10)
            sock.close()

    async def record(self, request: Request) -> RecordedRequest:
        """Parse and keep one request (its body as JSON, or as text when it is not JSON)."""
        raw = await request.body()
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = raw.decode("utf-8", "replace")
        recorded = RecordedRequest(request.url.path, dict(request.headers), body, time.monotonic())
        with self._lock:
            self.requests.append(recorded)
        return recorded

    def _next(self, recorded: RecordedRequest) -> Reply:
        with self._lock:
            if self.script:
                return self.script.pop(0)
        if self.responder is not None:
            return self.responder(recorded)
        return self.default

    async def _completions(self, request: Request) -> Response:
        recorded = await self.record(request)
        reply = self._next(recorded)
        if reply.delay_s:
            await anyio.sleep(reply.delay_s)
        if reply.raw is not None or reply.status != 200:
            raw = reply.raw if reply.raw is not None else {"error": {"message": "error"}}
            if isinstance(raw, str):
                return Response(raw, status_code=reply.status, headers=reply.headers)
            return JSONResponse(raw, status_code=reply.status, headers=reply.headers)
        return JSONResponse(self.completion(recorded, reply), headers=reply.headers)

    def completion(self, recorded: RecordedRequest, reply: Reply) -> dict[str, Any]:
        """The chat.completion body for ``reply`` (overridable, e.g. to add token ids)."""
        message = dict(reply.message)
        finish = reply.finish_reason or ("tool_calls" if message.get("tool_calls") else "stop")
        body: dict[str, Any] = {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": 1760000000,
            "model": (recorded.body or {}).get("model", MODEL)
            if isinstance(recorded.body, dict)
            else MODEL,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": finish,
                    "logprobs": None,
                    **reply.choice_extra,
                }
            ],
        }
        if not reply.omit_usage:
            usage = reply.usage
            if usage is None:
                messages = recorded.body.get("messages") if isinstance(recorded.body, dict) else []
                prompt, completion = _words(messages), _words(message)
                usage = {
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "total_tokens": prompt + completion,
                }
            body["usage"] = usage
        body.update(reply.extra)
        return body

    async def _models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})


STUB_URL = "http://stub.test/v1"


def stub_backend(stub: OpenAIStub) -> OpenAICompatibleBackend:
    """An OpenAICompatibleBackend that reaches ``stub`` in-process."""
    http = httpx2.AsyncClient(transport=stub.transport())
    return OpenAICompatibleBackend(STUB_URL, "stub-model", http=http)
