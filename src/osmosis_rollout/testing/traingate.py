"""``MockTrainGate``: plays TrainGate for tests and ``osmosis test``.

It answers ``/v1/chat/completions`` through a pluggable LLM backend, receives
``/v1/rollout/completed``, and speaks protocol v2 as well (``gate.v2``: :mod:`.traingate_v2`,
routes under ``/v1/rollouts/{id}/``); it records everything, and checks the agent's protocol
behaviour the way the real trainer depends on it (the checks themselves: :mod:`.protocol_checks`).
Each violation becomes a named :class:`Finding`, never a crash.

The two endpoints are handler functions over headers and body bytes
(:meth:`MockTrainGate.handle_chat`, :meth:`MockTrainGate.handle_completed`). A Starlette ``app``
serves them over HTTP (behind uvicorn for ``--server``, or ``httpx2.ASGITransport``), and
:meth:`MockTrainGate.post_transport` hands them straight to an in-process server's
``TrainGateClient``: the same bytes, without the HTTP machinery.
"""

from __future__ import annotations

import hmac
import json
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx2
from pydantic import ValidationError
from pydantic_core import to_json
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..errors import LLMBackendError
from ..findings import (
    BAD_API_KEY,
    DUPLICATE_COMPLETION,
    MALFORMED_REQUEST,
    NO_COMPLETION,
    UNKNOWN_ROLLOUT,
)
from ..protocol import (
    CompletionsRequest,
    InitResponse,
    OpenAIFunctionToolSchema,
    RolloutRequest,
    RolloutResponse,
    describe_validation_error,
)
from ..transport import AsgiTransport, InvalidTarget, PostTransport, Reply
from .protocol_checks import check_chat, check_completion
from .records import Finding, LLMBackend, RolloutRecord
from .traingate_v2 import v2_route
from .v2_driver import V2Controller

__all__ = ["GateTransport", "MockTrainGate"]


class MockTrainGate:
    """A TrainGate stand-in: a Starlette ``app`` plus the records and findings it collects.

    Use it in-process (``transport()``) or behind a real uvicorn. Register each rollout with
    :meth:`expect` (or let :meth:`init_rollout` do it) so the checks know the id, key and tools.
    """

    def __init__(
        self,
        backend: LLMBackend | None = None,
        *,
        base_url: str = "http://traingate.test",
    ) -> None:
        if not backend:
            from .backends import ScriptedBackend  # here: its module imports the samplers

            backend = ScriptedBackend([])
        self.backend: LLMBackend = backend
        self.base_url = base_url.rstrip("/")
        self.records: dict[str, RolloutRecord] = {}
        self.stray_findings: list[Finding] = []
        #: Set when the LLM backend failed in a way every rollout would (bad key, unreachable).
        self.systemic_error: LLMBackendError | None = None
        self._own_app = Starlette(
            routes=[
                Route(CHAT_PATH, self._chat, methods=["POST"]),
                Route(COMPLETED_PATH, self._completed, methods=["POST"]),
                Route(V2_ROUTES, self._v2, methods=["POST"]),
            ]
        )
        #: The protocol v2 routes and driver (spec §11).
        self.v2 = V2Controller(self)
        #: The ASGI app serving the two endpoints; tests may wrap it (any ASGI app will do).
        self.app: Any = self._own_app
        #: Tools already parsed, by the exact bytes of an init answer's tools (see _learn_tools).
        self._parsed_tools: dict[bytes, tuple[list[OpenAIFunctionToolSchema], Any]] = {}

    # -- driving a rollout server --------------------------------------------------------------

    def transport(self) -> httpx2.ASGITransport:
        """An in-process ``httpx2`` transport to this app (for an ``httpx2`` client)."""
        return httpx2.ASGITransport(app=self.app)

    def post_transport(self) -> GateTransport:
        """The cheapest in-process carrier for the server's ``TrainGateClient``: each POST goes
        straight to the handler of its path (see :class:`GateTransport`)."""
        return GateTransport(self)

    def expect(
        self,
        rollout_id: str,
        *,
        api_key: str | None = None,
        tools: list[OpenAIFunctionToolSchema] | None = None,
    ) -> RolloutRecord:
        """Register a rollout before its init is sent, so its calls are recognised."""
        record = RolloutRecord(
            rollout_id=rollout_id,
            api_key=api_key,
            tools=list(tools or []),
            tools_known=tools is not None,
        )
        record.tools_ready.set()
        self.records[rollout_id] = record
        return record

    async def init_rollout(
        self, server: httpx2.AsyncClient, request: RolloutRequest, *, server_key: str | None = None
    ) -> tuple[RolloutRecord, httpx2.Response]:
        """POST ``/v1/rollout/init`` to a rollout server and record the tools it declared."""
        record, content, headers = self._begin(request, server_key)
        try:
            response = await server.post("/v1/rollout/init", content=content, headers=headers)
            self._learn_tools(record, response.status_code, response.content)
        finally:
            record.tools_ready.set()  # known now, or never: chat calls waiting must go on
        return record, response

    async def init_rollout_via(
        self,
        transport: PostTransport,
        url: str,
        request: RolloutRequest,
        *,
        server_key: str | None = None,
    ) -> tuple[RolloutRecord, Reply]:
        """:meth:`init_rollout` through a :class:`~osmosis_rollout.transport.PostTransport`
        (``url``: the server's base URL)."""
        record, content, headers = self._begin(request, server_key)
        try:
            reply = await transport.post(f"{url}/v1/rollout/init", content, headers)
            self._learn_tools(record, reply.status_code, reply.content)
        finally:
            record.tools_ready.set()
        return record, reply

    def _begin(
        self, request: RolloutRequest, server_key: str | None
    ) -> tuple[RolloutRecord, bytes, dict[str, str]]:
        """Register the rollout and build the init's body and headers."""
        from ..protocol import wire_json

        record = RolloutRecord(rollout_id=request.rollout_id, api_key=request.api_key_value)
        record.request = request
        self.records[request.rollout_id] = record
        headers = {"Content-Type": "application/json"}
        if server_key:
            headers["Authorization"] = f"Bearer {server_key}"
        return record, wire_json(request), headers

    def _learn_tools(self, record: RolloutRecord, status: int, content: bytes) -> None:
        """The tools a 202 declared. A server answers every init with the same tools, so the
        answer's bytes after its ``rollout_id`` are parsed once: the same bytes, the same tools
        (the models are shared by the records, read-only).

        Kept on measurement (``benchmarks/bench_replay.py``, 1,000 rows, alternating with the
        tree without it): parsing each init's tools costs only ~28 us, but a batch keeps every
        record, and a record's own copy of the tool models is ~100 more objects for each full
        collection to walk: without the cache, replay in process ran 640-784 rows/s against
        885-911 (1.26-1.55 ms of CPU a row against 1.08-1.12).
        """
        if status != 202:
            return
        prefix = b'{"rollout_id":' + to_json(record.rollout_id) + b',"tools":'
        key = content[len(prefix) :] if content.startswith(prefix) else None
        known = self._parsed_tools.get(key) if key is not None else None
        if known is None:
            tools = list(InitResponse.model_validate_json(content).tools)
            known = (tools, json.loads(content).get("tools"))
            if key is not None:
                if len(self._parsed_tools) >= 16:
                    self._parsed_tools.clear()
                self._parsed_tools[key] = known
        record.tools = list(known[0])
        record.tools_wire = known[1]
        record.tools_known = True

    async def wait_completed(self, rollout_id: str, timeout_s: float) -> RolloutRecord:
        """Wait for the completion callback; a miss becomes a ``no_completion`` finding."""
        record = self.records[rollout_id]
        with anyio.move_on_after(timeout_s):
            await record.done.wait()
        if not record.completions:
            record.add(NO_COMPLETION, f"no completion callback within {timeout_s:g} s")
        return record

    @property
    def findings(self) -> list[Finding]:
        """Every finding, for every rollout, plus those about unknown rollouts."""
        found = list(self.stray_findings)
        for record in self.records.values():
            found.extend(record.findings)
        return found

    # -- the two endpoints --------------------------------------------------------------------

    async def _chat(self, request: Request) -> Response:
        return _response(await self.handle_chat(request.headers, await request.body()))

    async def _completed(self, request: Request) -> Response:
        return _response(await self.handle_completed(request.headers, await request.body()))

    async def _v2(self, request: Request) -> Response:
        raw = request.scope.get("raw_path")  # undecoded: an id may hold an encoded "/"
        path = raw.decode("latin-1").partition("?")[0] if raw else request.url.path
        route = v2_route(path)
        if route is None:
            return Response(b"Not Found", status_code=404, media_type="text/plain")
        kind, rollout_id = route
        reply = await self.v2.handle(kind, rollout_id, request.headers, await request.body())
        return _response(reply)

    def _authorised(self, headers: Mapping[str, str], record: RolloutRecord) -> bool:
        expected = record.api_key
        if expected is None:
            return True
        header = headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            token.encode("utf-8", "replace"), expected.encode()
        )

    async def _receive(
        self, headers: Mapping[str, str], content: bytes, model: type[Any], what: str
    ) -> tuple[Any, RolloutRecord] | Reply:
        """Parse a call's body, find its rollout, check its key: the body and record, or the
        error reply (each failure also recorded as a finding)."""
        try:
            body = model.model_validate_json(content)
        except ValidationError as exc:
            detail = describe_validation_error(exc)
            self.stray_findings.append(Finding(MALFORMED_REQUEST, f"malformed {what}: {detail}"))
            return _json_reply(400, {"detail": detail})
        record = self.records.get(body.rollout_id)
        if record is None:
            self.stray_findings.append(
                Finding(UNKNOWN_ROLLOUT, f"{what} for a rollout never started", body.rollout_id)
            )
            return _json_reply(404, {"detail": "unknown rollout_id"})
        if not self._authorised(headers, record):
            record.add(BAD_API_KEY, f"{what} without the rollout's bearer api_key")
            return _json_reply(401, {"detail": "invalid api key"})
        return body, record

    async def handle_chat(self, headers: Mapping[str, str], content: bytes) -> Reply:
        """``POST /v1/chat/completions``: check the turn, ask the backend, record both.

        ``headers`` must look names up case-insensitively (Starlette's do; lower-case names
        in a plain dict do too)."""
        received = await self._receive(headers, content, CompletionsRequest, "chat call")
        if isinstance(received, Reply):
            return received
        body, record = received
        # The first turn may arrive before the init's 202 (the server starts the agent first):
        # answer it only once the declared tools are known, so the LLM always gets them.
        if not record.tools_ready.is_set():  # no checkpoint otherwise: keep the usual order
            await record.tools_ready.wait()
        request_id = headers.get("x-request-id", "")
        if request_id and record.request_ids and record.request_ids[-1] == request_id:
            # A retry of the last turn (its reply was lost on the way): it replaces that turn.
            record.request_ids.pop()
            record.chats.pop()
            if len(record.replies) > len(record.chats):
                record.replies.pop()
        check_chat(record, body)
        record.request_ids.append(request_id)
        record.chats.append(body)
        try:
            reply = await self.backend.complete(body, record)
        except LLMBackendError as exc:
            # Not the agent's fault: answer like a failing trainer and let the runner report it.
            record.backend_error = exc
            record.chats.pop()  # unanswered: the client's retry must not look like a rewrite
            record.request_ids.pop()
            if exc.systemic and self.systemic_error is None:
                self.systemic_error = exc
            # Systemic failures get a status the server will not retry (424); others a 503,
            # which a real trainer would also answer with when its model server hiccups.
            status = 424 if exc.systemic else 503
            return _json_reply(status, {"detail": f"LLM backend error: {exc}"})
        record.replies.append(reply)
        return Reply(200, _JSON_HEADERS, reply.model_dump_json(exclude_none=True).encode())

    async def handle_completed(self, headers: Mapping[str, str], content: bytes) -> Reply:
        """``POST /v1/rollout/completed``: check and record the rollout's result."""
        received = await self._receive(headers, content, RolloutResponse, "completion callback")
        if isinstance(received, Reply):
            return received
        body, record = received
        if not record.tools_ready.is_set():  # the tools check needs them, as chat calls do
            await record.tools_ready.wait()
        if record.completions:
            record.add(DUPLICATE_COMPLETION, "a second completion callback arrived")
        else:
            check_completion(record, body)
        record.completions.append(body)
        observe = getattr(self.backend, "rollout_completed", None)
        if observe is not None and len(record.completions) == 1:
            observe(record, body)  # e.g. a replay compares the result with its recording
        record.done.set()
        return _json_reply(200, {"ok": True})


CHAT_PATH = "/v1/chat/completions"
COMPLETED_PATH = "/v1/rollout/completed"
V2_ROUTES = "/v1/rollouts/{rest:path}"
_JSON_HEADERS = {"content-type": "application/json"}
_Handler = Callable[[MockTrainGate, Mapping[str, str], bytes], Awaitable[Reply]]
_ROUTES: dict[str, _Handler] = {
    CHAT_PATH: MockTrainGate.handle_chat,
    COMPLETED_PATH: MockTrainGate.handle_completed,
}


class GateTransport:
    """A :class:`~osmosis_rollout.transport.PostTransport` that hands each POST straight to the
    mock TrainGate's handler for its path: what an in-process server's ``TrainGateClient`` uses.

    The body is the client's real serialised bytes and the handler parses them as the HTTP
    route would; only the HTTP layers in between (request objects, ASGI, routing) are skipped.
    An unknown path gets the 404 a router would answer. When ``gate.app`` was replaced (a test
    wrapping it to record or fault requests), calls go through that app instead.
    """

    def __init__(self, gate: MockTrainGate) -> None:
        self.gate = gate
        self._routes: dict[str, _Handler | None] = {}
        self._wrapped: AsgiTransport | None = None

    async def post(self, url: str, content: bytes, headers: Mapping[str, str]) -> Reply:
        """Answer one POST with the gate's handler (or its replaced app)."""
        gate = self.gate
        if gate.app is not gate._own_app:
            if self._wrapped is None or self._wrapped.app is not gate.app:
                self._wrapped = AsgiTransport(gate.app)
            return await self._wrapped.post(url, content, headers)
        try:
            handler = self._routes[url]
        except KeyError:
            handler = self._route(url)
        if handler is None:
            return Reply(404, {"content-type": "text/plain; charset=utf-8"}, b"Not Found")
        return await handler(gate, {name.lower(): v for name, v in headers.items()}, content)

    async def aclose(self) -> None:
        """Nothing to release."""

    def _route(self, url: str) -> _Handler | None:
        try:
            parts = urlsplit(url)
        except ValueError as exc:
            raise InvalidTarget(f"invalid URL {url!r}: {exc}") from None
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise InvalidTarget(f"cannot POST to {url!r}: an http(s) URL with a host is needed")
        handler = _ROUTES.get(parts.path)
        if handler is None:
            route = v2_route(parts.path)
            if route is not None:
                handler = _v2_handler(*route)
        if len(self._routes) >= 256:
            self._routes.clear()
        self._routes[url] = handler
        return handler


def _v2_handler(kind: str, rollout_id: str) -> _Handler:
    async def handle(gate: MockTrainGate, headers: Mapping[str, str], content: bytes) -> Reply:
        return await gate.v2.handle(kind, rollout_id, headers, content)

    return handle


def _json_reply(status: int, data: Any) -> Reply:
    """A JSON reply, byte for byte what Starlette's ``JSONResponse`` sends."""
    content = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return Reply(status, _JSON_HEADERS, content.encode())


def _response(reply: Reply) -> Response:
    return Response(
        reply.content, status_code=reply.status_code, media_type=reply.headers["content-type"]
    )


def name_gate_urls(text: str | None, base_url: str) -> str | None:
    """``text`` with the mock TrainGate's own URLs (internal, e.g. ``http://traingate.test``,
    or an ephemeral port) replaced by what they are, so a user is not sent looking for them."""
    if not text or not base_url:
        return text
    text = re.sub(
        re.escape(base_url) + r"/v1/rollouts/[^/\s]+/(chat/completions|completion|grader)",
        lambda m: f"the mock TrainGate's {_V2_NAMES[m.group(1)]} endpoint",
        text,
    )
    return (
        text.replace(f"{base_url}/v1/chat/completions", "the mock TrainGate's chat endpoint")
        .replace(f"{base_url}/v1/rollout/completed", "the mock TrainGate's completion endpoint")
        .replace(base_url, "the mock TrainGate")
    )


_V2_NAMES = {"chat/completions": "chat", "completion": "completion", "grader": "grader"}
