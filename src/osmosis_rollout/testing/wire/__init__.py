"""The mock TrainGate's side of each wire protocol, one module per wire, as the server's
(``server/wire/``): ``v1.py`` (``POST /v1/rollout/init``, one completion callback),
``v2.py`` (``POST /rollout``, a completion and a grader callback, status, cancel) and
``polling.py`` (``POST /rollout``, then long polls of ``GET /rollout/{id}/result``).

:data:`WIRES` is the one list of them: ``osmosis test --protocol`` and ``osmosis validate
--protocol`` offer its names, the harness, the mock TrainGate's routes and the cassettes read
it, and a third wire is one more module here plus one entry. Each :class:`MockWire` names its
server-side twin by that wire's ``Wire.protocol`` (the name on ``--protocol``, in cassette
headers and in outbox entries). This module imports nothing heavy (the CLI reads the names
before it parses a flag): a wire's module loads when a mock TrainGate first needs it.

A wire's module defines ``Controller(gate)`` (:class:`Controller`: its routes, and driving one
rollout through a :class:`ServerLink`) and ``name_urls(text, base_url)`` (the mock's own URLs
of that wire named for a reader, in error messages).
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    import httpx2
    from starlette.responses import Response
    from starlette.routing import BaseRoute

    from ...agent import RolloutAgentLoop
    from ...errors import LLMBackendError
    from ...protocol import RolloutRequest
    from ...transport import PostTransport, Reply
    from ..records import Finding, LLMBackend, RolloutRecord, WireLog

__all__ = [
    "LEGACY_PROTOCOL",
    "MOCK_API_KEY",
    "MOCK_CALLBACK_KEY",
    "POLLING",
    "V1",
    "V2",
    "WIRES",
    "Controller",
    "GateState",
    "Handler",
    "HttpxCalls",
    "MockWire",
    "ServerCalls",
    "ServerLink",
    "wire_named",
    "wire_names",
]

#: The per-rollout secret the mock TrainGate hands out and expects back on every call.
MOCK_API_KEY = "mock-traingate-key"
#: On v2, the second secret: the bearer of the two callbacks, never the agent's to hold.
MOCK_CALLBACK_KEY = "mock-traingate-callback-key"

#: One POST to the mock TrainGate: (lower-case headers, body bytes) -> its reply.
Handler = Callable[[Mapping[str, str], bytes], Awaitable["Reply"]]


@dataclass(frozen=True)
class MockWire:
    """One wire protocol as the mock TrainGate speaks it (see the module docstring)."""

    #: The server-side twin's ``Wire.protocol``: ``--protocol``'s value, kept in cassettes.
    protocol: str
    #: The module defining its ``Controller`` and ``name_urls`` (loaded on first use).
    module: str
    #: Whether its init carries a turn budget (``--max-turns``); without one, the agent's own
    #: limit applies and the CLI says so.
    turn_budget: bool = False

    def controller(self, gate: GateState) -> Controller:
        """This wire's side of ``gate``: its routes, and driving a rollout."""
        return cast("Controller", self._module().Controller(gate))

    def name_urls(self, text: str, base_url: str) -> str:
        """``text`` with this wire's mock URLs under ``base_url`` named for a reader."""
        return cast(str, self._module().name_urls(text, base_url))

    def _module(self) -> Any:
        return importlib.import_module(self.module)


#: Protocol v1 (``docs/protocol.md``) and protocol v2 (``docs/protocol-v2.md``).
V1 = MockWire("v1", "osmosis_rollout.testing.wire.v1", turn_budget=True)
V2 = MockWire("v2", "osmosis_rollout.testing.wire.v2")
#: The polling wire (``docs/protocol-polling.md``: osmosis-ai 0.3.3+'s controller).
POLLING = MockWire("polling", "osmosis_rollout.testing.wire.polling")
#: Every wire the mock TrainGate speaks, the default (``osmosis test``'s) first.
WIRES: tuple[MockWire, ...] = (V1, V2, POLLING)

#: The wire a cassette header or an outbox entry without a ``protocol`` was written on: v1,
#: only because every such file predates protocol v2 (every writer names its wire since).
LEGACY_PROTOCOL = "v1"


def wire_names() -> tuple[str, ...]:
    """The names ``--protocol`` takes, in :data:`WIRES`' order."""
    return tuple(wire.protocol for wire in WIRES)


def wire_named(name: str | MockWire) -> MockWire:
    """The wire called ``name`` (any case; a wire is returned as it is); a ``ConfigError``
    naming the choices otherwise."""
    if isinstance(name, MockWire):
        return name
    wanted = name.strip().lower()
    for wire in WIRES:
        if wire.protocol == wanted:
            return wire
    from ...errors import ConfigError

    raise ConfigError(f"unknown protocol {name!r}; choose {' or '.join(wire_names())}")


class GateState(Protocol):
    """What a wire's controller uses of its mock TrainGate: the records and findings it
    shares with the other wires, and the LLM backend that answers every chat turn."""

    backend: LLMBackend
    base_url: str
    records: dict[str, RolloutRecord]
    stray_findings: list[Finding]
    systemic_error: LLMBackendError | None
    #: Where each chat turn and callback is noted with its time, when the mock's side of each
    #: rollout is traced (None otherwise: nothing is kept).
    wire_log: WireLog | None


class ServerCalls(Protocol):
    """What a controller needs to reach a server beyond the init: a GET and a POST."""

    async def get(self, url: str, headers: Mapping[str, str]) -> Reply: ...

    async def post(self, url: str, content: bytes, headers: Mapping[str, str]) -> Reply: ...


#: How long a GET's answer may take to come (a long poll waits up to the server's wait, 30 s
#: by default; the polling controller gives up on a poll sooner and sends it again).
GET_READ_S = 120.0


class HttpxCalls:
    """:class:`ServerCalls` over an ``httpx2`` client (a server on 127.0.0.1)."""

    def __init__(self, http: httpx2.AsyncClient) -> None:
        self.http = http

    async def get(self, url: str, headers: Mapping[str, str]) -> Reply:
        """One GET, read whole."""
        import httpx2

        from ...transport import Reply

        # a polling wire's result poll is a long poll: the read may take the server's wait
        timeout = httpx2.Timeout(10.0, read=GET_READ_S)
        response = await self.http.get(url, headers=dict(headers), timeout=timeout)
        return Reply(response.status_code, dict(response.headers), response.content)

    async def post(self, url: str, content: bytes, headers: Mapping[str, str]) -> Reply:
        """One POST, read whole."""
        from ...transport import Reply

        response = await self.http.post(url, content=content, headers=dict(headers), timeout=10.0)
        return Reply(response.status_code, dict(response.headers), response.content)


@dataclass(frozen=True)
class ServerLink:
    """How a controller reaches the rollout server under test (the harness builds it)."""

    #: Carries the inits: an in-process app's ``AsgiTransport``, or ``httpx2`` to ``--server``.
    post: PostTransport
    #: Carries the calls beyond the init (status, cancel).
    calls: ServerCalls
    #: The server's base URL (the in-process app's is a placeholder).
    base_url: str
    #: The server key, when it has one.
    key: str | None
    #: The agent, when the server runs in this process (what it declares is then known).
    agent: RolloutAgentLoop | None = None
    #: How much longer than a rollout's own timeouts a controller waits for its result, where
    #: its wire says (v2: agent + grader timeouts + this, spec 11.5, then a cancel).
    slack_s: float = 60.0


class Controller(Protocol):
    """One wire's side of one mock TrainGate (a wire module's ``Controller(gate)``)."""

    def routes(self) -> list[BaseRoute]:
        """The Starlette routes of this wire's endpoints, for the gate's HTTP app."""
        ...

    def handler(self, path: str) -> Handler | None:
        """The handler of an in-process POST to ``path`` (an undecoded URL path), if ours."""
        ...

    async def probe(self, http: httpx2.AsyncClient, server_url: str, key: str | None) -> None:
        """With ``--server``: raise ``ConfigError`` at once when the server lacks this wire."""
        ...

    async def run(
        self,
        link: ServerLink,
        request: RolloutRequest,
        *,
        timeout_s: float,
        grader_timeout_s: float,
    ) -> tuple[RolloutRecord, Reply]:
        """Start the rollout ``request`` describes and wait for its result (or its deadline):
        its record and the start request's reply."""
        ...


def json_reply(status: int, data: Any) -> Reply:
    """A JSON reply, byte for byte what Starlette's ``JSONResponse`` sends."""
    import json

    from ...transport import Reply

    content = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return Reply(status, {"content-type": "application/json"}, content.encode())


def as_response(reply: Reply) -> Response:
    """A handler's reply as the Starlette response its HTTP route sends."""
    from starlette.responses import Response

    return Response(
        reply.content, status_code=reply.status_code, media_type=reply.headers["content-type"]
    )


def bearer(headers: Mapping[str, str]) -> str | None:
    """The token of an ``Authorization: Bearer`` header (the scheme in any case)."""
    scheme, _, token = headers.get("authorization", "").partition(" ")
    return token if scheme.lower() == "bearer" else None


def server_headers(server_key: str | None) -> dict[str, str]:
    """The headers of a call to the server: JSON, and its key when it has one."""
    headers = {"Content-Type": "application/json"}
    if server_key:
        headers["Authorization"] = f"Bearer {server_key}"
    return headers
