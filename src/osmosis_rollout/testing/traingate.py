"""``MockTrainGate``: plays TrainGate for tests and ``osmosis test``.

It speaks every wire of :data:`~.wire.WIRES` at once (v1: ``/v1/chat/completions`` and
``/v1/rollout/completed``; v2: the URLs under ``/v1/rollouts/{id}/`` its inits name; polling:
the chat URL ``/polling/{id}/`` its starts name, the results being read, never sent), each
wire's side a controller of :mod:`.wire` that answers chat turns through a pluggable LLM
backend, records everything, and checks the protocol behaviour the real trainer depends on
(:mod:`.protocol_checks`, :mod:`.protocol_checks_v2`, :mod:`.protocol_checks_polling`). Each
violation becomes a named :class:`Finding`, never a crash. The gate itself knows no wire: it
holds the records, the backend, and the two ways in.

A Starlette ``app`` serves the wires' routes over HTTP (behind uvicorn for ``--server``, or
``httpx2.ASGITransport``), and :meth:`MockTrainGate.post_transport` hands each POST straight to
its wire's handler for an in-process server's ``TrainGateClient``: the same bytes, without the
HTTP machinery. ``expect``, ``init_rollout`` and ``wait_completed`` are protocol v1's (the
mock's API before v2), ``gate.v2`` is protocol v2's controller.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx2
from starlette.applications import Starlette

from ..errors import LLMBackendError
from ..protocol import OpenAIFunctionToolSchema, RolloutRequest
from ..transport import AsgiTransport, InvalidTarget, PostTransport, Reply
from .records import Finding, LLMBackend, RolloutRecord, WireLog
from .wire import V1, V2, WIRES, Controller, Handler, MockWire, wire_named

if TYPE_CHECKING:
    from .wire.v1 import V1Controller
    from .wire.v2 import V2Controller

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
        #: Set to keep each rollout's calls with their times (``testing.gate_trace``).
        self.wire_log: WireLog | None = None
        #: Each wire's side of this gate, by its protocol name.
        self.controllers: dict[str, Controller] = {w.protocol: w.controller(self) for w in WIRES}
        self._own_app = Starlette(
            routes=[route for c in self.controllers.values() for route in c.routes()]
        )
        #: The ASGI app serving every wire's endpoints; tests may wrap it (any ASGI app will do).
        self.app: Any = self._own_app

    def controller(self, wire: MockWire | str) -> Controller:
        """This gate's side of ``wire`` (a :data:`~.wire.WIRES` entry, or its name)."""
        return self.controllers[wire_named(wire).protocol]

    @property
    def v1(self) -> V1Controller:
        """Protocol v1's controller: the init, the chat and completion endpoints."""
        return self.controller(V1)  # type: ignore[return-value]

    @property
    def v2(self) -> V2Controller:
        """Protocol v2's controller: the start, the three URLs of each rollout, status, cancel
        (spec section 11)."""
        return self.controller(V2)  # type: ignore[return-value]

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
        """Register a v1 rollout before its init is sent, so its calls are recognised."""
        return self.v1.expect(rollout_id, api_key=api_key, tools=tools)

    async def init_rollout(
        self, server: httpx2.AsyncClient, request: RolloutRequest, *, server_key: str | None = None
    ) -> tuple[RolloutRecord, httpx2.Response]:
        """POST ``/v1/rollout/init`` to a rollout server and record the tools it declared."""
        return await self.v1.init_rollout(server, request, server_key=server_key)

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
        return await self.v1.init_rollout_via(transport, url, request, server_key=server_key)

    async def wait_completed(self, rollout_id: str, timeout_s: float) -> RolloutRecord:
        """Wait for a v1 completion callback; a miss becomes a ``no_completion`` finding."""
        return await self.v1.wait_completed(rollout_id, timeout_s)

    async def handle_chat(self, headers: Mapping[str, str], content: bytes) -> Reply:
        """``POST /v1/chat/completions`` (protocol v1's chat endpoint)."""
        return await self.v1.handle_chat(headers, content)

    async def handle_completed(self, headers: Mapping[str, str], content: bytes) -> Reply:
        """``POST /v1/rollout/completed`` (protocol v1's completion callback)."""
        return await self.v1.handle_completed(headers, content)

    @property
    def findings(self) -> list[Finding]:
        """Every finding, for every rollout, plus those about unknown rollouts."""
        found = list(self.stray_findings)
        for record in self.records.values():
            found.extend(record.findings)
        return found

    def handler(self, path: str) -> Handler | None:
        """The handler of a POST to ``path``: the first wire's that claims it."""
        for controller in self.controllers.values():
            handler = controller.handler(path)
            if handler is not None:
                return handler
        return None


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
        self._routes: dict[str, Handler | None] = {}
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
        return await handler({name.lower(): v for name, v in headers.items()}, content)

    async def aclose(self) -> None:
        """Nothing to release."""

    def _route(self, url: str) -> Handler | None:
        try:
            parts = urlsplit(url)
        except ValueError as exc:
            raise InvalidTarget(f"invalid URL {url!r}: {exc}") from None
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise InvalidTarget(f"cannot POST to {url!r}: an http(s) URL with a host is needed")
        handler = self.gate.handler(parts.path)
        if len(self._routes) >= 256:
            self._routes.clear()
        self._routes[url] = handler
        return handler


def name_gate_urls(text: str | None, base_url: str) -> str | None:
    """``text`` with the mock TrainGate's own URLs (internal, e.g. ``http://traingate.test``,
    or an ephemeral port) replaced by what they are, so a user is not sent looking for them."""
    if not text or not base_url:
        return text
    for wire in WIRES:
        text = wire.name_urls(text, base_url)
    return text.replace(base_url, "the mock TrainGate")
