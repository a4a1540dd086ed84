"""``Harness``: a rollout server and a ``MockTrainGate`` wired together, for tests and tools.

By default both run in this process, with no HTTP client in between: the mock TrainGate posts
each init through :class:`~osmosis_rollout.transport.AsgiTransport` (a direct call of the real
``create_app``: its routing, auth and limits), and the server's ``TrainGateClient`` posts chat
turns and callbacks through :meth:`MockTrainGate.post_transport` (straight to the mock's
handlers). Every byte still goes through the real serialisation and parsing on both sides. With
``server_url`` the harness drives an already running server instead, over ``httpx2``, and the
mock TrainGate listens on 127.0.0.1 for its calls. ``osmosis test``, ``osmosis validate``'s dry
run and the REPL all use this. ``protocol`` is the wire it drives the server over (a
:data:`~.wire.WIRES` entry or its name: ``"v1"`` by default, ``"v2"`` for ``POST /rollout``,
two callbacks, status, cancel: :mod:`.wire.v2`); rows, findings and results read the same on
every wire.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import httpx2
from pydantic import ValidationError

from ..agent import RolloutAgentLoop
from ..client import RetryPolicy, TrainGateClient
from ..errors import ConfigError
from ..protocol import Message, RolloutRequest, RolloutResponse, describe_validation_error
from ..transport import AsgiTransport, Httpx2Transport, PostTransport, TransportFailure
from .protocol_checks_v2 import check_start
from .records import Finding, LLMBackend, RolloutRecord
from .traingate import MockTrainGate
from .wire import (
    MOCK_API_KEY,
    MOCK_CALLBACK_KEY,
    V1,
    WIRES,
    HttpxCalls,
    MockWire,
    ServerCalls,
    ServerLink,
    server_headers,
    wire_named,
)

if TYPE_CHECKING:
    from ..server import RolloutServer
    from .gate_trace import GateTracer

__all__ = ["MOCK_API_KEY", "MOCK_CALLBACK_KEY", "Harness", "RolloutOutcome", "ServerUnreachable"]

_SERVER_BASE = "http://rollout-server.test"


class ServerUnreachable(ConfigError):
    """The rollout server given by URL cannot be reached (not started, or gone)."""


@dataclass
class RolloutOutcome:
    """What happened to one rollout, as the mock TrainGate saw it."""

    rollout_id: str
    init_status: int
    init_body: Any
    record: RolloutRecord
    wall_ms: float
    findings: list[Finding] = field(default_factory=list)
    #: What a refusal says of the wire chosen (a v1 init answered 404: the other wires).
    init_hint: str | None = None

    @property
    def result(self) -> RolloutResponse | None:
        """The (first) completion callback, if one arrived."""
        return self.record.result

    @property
    def accepted(self) -> bool:
        """Whether the server accepted the init with 202."""
        return self.init_status == 202

    @property
    def init_error(self) -> str | None:
        """A readable reason when the init was refused."""
        if self.accepted:
            return None
        detail = self.init_body.get("detail") if isinstance(self.init_body, dict) else None
        shown = _shown_detail(detail)
        reason = f"init refused with HTTP {self.init_status}" + (f": {shown}" if shown else "")
        return f"{reason}; {self.init_hint}" if self.init_hint else reason


def _shown_detail(detail: Any, *, limit: int = 3) -> Any:
    """A refusal's ``detail`` as the user reads it: a FastAPI 422's list of errors as
    ``field: msg; ...``, without the ``input`` each echoes (the whole start, keys and all)."""
    if not isinstance(detail, list) or not all(
        isinstance(e, dict) and "loc" in e and "msg" in e for e in detail
    ):
        return detail
    parts = []
    for error in detail[:limit]:
        loc = error["loc"] if isinstance(error["loc"], list) else [error["loc"]]
        if loc[:1] == ["body"] and len(loc) > 1:
            loc = loc[1:]
        parts.append(f"{'.'.join(str(p) for p in loc)}: {error['msg']}")
    more = len(detail) - limit
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def _background_server(app: Any) -> Any:
    """A uvicorn server for ``app`` inside our event loop, which leaves the process's signal
    handlers alone. uvicorn is imported here: in-process runs never need it (~50 ms)."""
    import uvicorn

    class _BackgroundServer(uvicorn.Server):
        def capture_signals(self) -> contextlib.AbstractContextManager[None]:  # type: ignore[override]
            return contextlib.nullcontext()

    config = uvicorn.Config(app, log_level="warning", lifespan="off")
    return _BackgroundServer(config)


class Harness:
    """Run rollouts of ``agent`` through a rollout server and a mock TrainGate.

    Use as ``async with Harness(agent, backend=...) as h: outcome = await h.run(messages)``.
    """

    def __init__(
        self,
        agent: RolloutAgentLoop | None = None,
        *,
        backend: LLMBackend | None = None,
        gate: MockTrainGate | None = None,
        server_url: str | None = None,
        server_key: str | None = None,
        rollout_timeout_s: float = 300.0,
        max_concurrent: int = 100,
        debug_dir: str | Path | None = None,
        outbox_dir: str | Path | None = None,
        secrets: Iterable[str | None] = (),
        protocol: MockWire | str = V1,
        v2_slack_s: float = 60.0,
        artifact_root: str | Path | None = None,
        start_checks: bool = False,
    ) -> None:
        if (agent is None) == (server_url is None):
            raise ConfigError("give either an agent (in-process server) or a server_url")
        #: Check a remote server's v2 start answers (``protocol_checks_v2.check_start``):
        #: ``osmosis test`` does, for its run-level findings of the server.
        self.start_checks = start_checks
        #: The wire spoken to the server (``wire_named`` refuses an unknown name).
        self.wire = wire_named(protocol)
        #: Its name, as ``--protocol`` spells it.
        self.protocol = self.wire.protocol
        #: On v2 a controller waits for the grader callback up to agent + grader timeouts +
        #: this (spec: 60 s), then cancels.
        self.v2_slack_s = v2_slack_s
        self.agent = agent
        self.gate = gate or MockTrainGate(backend)
        if backend is not None and gate is not None:
            self.gate.backend = backend
        self.server_url = server_url.rstrip("/") if server_url else None
        self.server_key = server_key
        self.rollout_timeout_s = rollout_timeout_s
        self.max_concurrent = max_concurrent
        self.debug_dir = debug_dir
        self.outbox_dir = outbox_dir
        #: The in-process server writes each rollout's ATIF trajectory under it, as
        #: ``osmosis serve`` does under the platform's ``_OSMOSIS_ROLLOUT_ARTIFACT_ROOT``.
        self.artifact_root = artifact_root
        #: The agent a ``server_url``'s ``/health`` names (``agent_loop``), once probed.
        self.server_agent: str | None = None
        #: Scrubbed from the traces too (the LLM's key): the server only knows its own.
        self.secrets = [s for s in secrets if s]
        self._stack = contextlib.AsyncExitStack()
        self._server_http: httpx2.AsyncClient | None = None
        #: How inits reach the server, and the URL they are posted under.
        self._server_post: PostTransport | None = None
        self._server_base = _SERVER_BASE
        self._app: Any = None
        self.rollout_server: RolloutServer | None = None
        #: With ``server_url`` and ``debug_dir``: the mock's side of each rollout as a trace.
        self.gate_tracer: GateTracer | None = None

    @property
    def server_http(self) -> httpx2.AsyncClient | None:
        """An ``httpx2`` client to the server (its base URL set), for calls beyond the init
        (``/health``, raw requests in tests); None outside ``async with``. For the in-process
        server it is made on first use (``run`` does not need it) and closed with the harness.
        """
        if self._server_http is None and self._app is not None:
            self._server_http = httpx2.AsyncClient(
                transport=httpx2.ASGITransport(app=self._app), base_url=_SERVER_BASE, timeout=None
            )
            self._stack.push_async_callback(self._server_http.aclose)
        return self._server_http

    async def __aenter__(self) -> Harness:
        try:
            if self.agent is not None:
                await self._start_in_process(self.agent)
            else:
                await self._start_gate_listener()
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        try:
            await self._stack.aclose()
        finally:
            self._app = None  # no new server_http once the server is gone

    async def _start_in_process(self, agent: RolloutAgentLoop) -> None:
        from ..server import create_app

        client = TrainGateClient(transport=self.gate.post_transport(), retry=RetryPolicy(retries=0))
        app = create_app(
            agent,
            api_key=self.server_key,
            client=client,
            rollout_timeout_s=self.rollout_timeout_s,
            max_concurrent=self.max_concurrent,
            shutdown_grace_s=0.0,
            debug_dir=self.debug_dir,
            outbox_dir=self.outbox_dir,
            artifact_root=self.artifact_root,
        )
        self.rollout_server = app.state.rollout_server
        if self.rollout_server.tracer is not None:
            self.rollout_server.tracer.secrets += self.secrets
        await self._stack.enter_async_context(app.router.lifespan_context(app))
        self._server_post = AsgiTransport(app)
        self._app = app

    async def _start_gate_listener(self) -> None:
        from ..server import bind_socket

        assert self.server_url is not None
        sock = bind_socket("127.0.0.1", 0)
        port = sock.getsockname()[1]
        self.gate.base_url = f"http://127.0.0.1:{port}"
        server = _background_server(self.gate.app)
        stopped = anyio.Event()
        tasks = await self._stack.enter_async_context(anyio.create_task_group())

        async def run_server() -> None:
            try:
                await server.serve([sock])
            finally:
                stopped.set()
                sock.close()

        async def stop() -> None:
            server.should_exit = True
            await stopped.wait()

        tasks.start_soon(run_server)
        self._stack.push_async_callback(stop)
        # No wait for uvicorn: bind_socket already listens, early connections queue up.
        http = await self._stack.enter_async_context(
            httpx2.AsyncClient(base_url=self.server_url, timeout=30.0)
        )
        self._server_http = http
        await self._probe_server(http)
        if self.debug_dir is not None:
            self._trace_gate(self.server_url)
        self._server_post = Httpx2Transport(http)
        self._server_base = self.server_url

    def _trace_gate(self, server_url: str) -> None:
        """Keep the mock's side of each rollout (``testing.gate_trace``): the server is
        another process, so its own steps are its own to trace."""
        from .gate_trace import GateTracer

        assert self.debug_dir is not None
        tracer = GateTracer(
            self.debug_dir,
            server_url=server_url,
            protocol=self.protocol,
            secrets=[*self.secrets, self.server_key],
        )
        tracer.agent = self.server_agent
        self.gate_tracer = tracer
        self.gate.wire_log = tracer.log

        def stop() -> None:
            self.gate.wire_log = None
            tracer.close()

        self._stack.callback(stop)

    async def _probe_server(self, http: httpx2.AsyncClient) -> None:
        """Fail fast, once, when ``--server`` points at nothing that speaks the protocol."""
        try:
            response = await http.get("/health", timeout=10.0)
        except httpx2.TransportError as exc:
            raise ServerUnreachable(
                f"cannot reach the rollout server at {self.server_url} "
                f"({type(exc).__name__}); is `osmosis serve` running there?"
            ) from None
        if response.status_code not in (200, 503):
            raise ConfigError(
                f"{self.server_url}/health answered HTTP {response.status_code}; "
                "is this an osmosis rollout server?"
            )
        with contextlib.suppress(ValueError, AttributeError):
            name = response.json().get("agent_loop")
            self.server_agent = name if isinstance(name, str) else None
        if self.server_agent is not None:  # only ours has /platform/health: no 404 elsewhere
            await self._probe_key(http)
        assert self.server_url is not None
        await self.gate.controller(self.wire).probe(http, self.server_url, self.server_key)

    async def _probe_key(self, http: httpx2.AsyncClient) -> None:
        """Check the server key once, before any row: a wrong or missing key would otherwise
        refuse every init one by one. ``/platform/health`` answers 401 exactly when the server
        has a key and ours does not match (404 when it has none). Asked of an osmosis-rollout
        server only (its ``/health`` names its ``agent_loop``): another server, such as the
        official SDK's, would log the 404 of a route it does not have."""
        headers = {"Authorization": f"Bearer {self.server_key}"} if self.server_key else {}
        try:
            response = await http.get("/platform/health", headers=headers, timeout=10.0)
        except httpx2.TransportError:
            return  # /health answered a moment ago: let the run report what happens
        if response.status_code != 401:
            return
        problem = (
            "refused the key given" if self.server_key else "requires a key and none was given"
        )
        raise ConfigError(
            f"the rollout server at {self.server_url} {problem}; pass the key it was served "
            "with: --api-key KEY or the OSMOSIS_API_KEY environment variable"
        )

    def trace_path(self, rollout_id: str) -> Path | None:
        """Where the trace of ``rollout_id`` is written, if anywhere: by this harness's
        in-process server, or, for a server given by URL, by the mock (its side)."""
        if self.gate_tracer is not None:
            return self.gate_tracer.path_for(rollout_id)
        server = self.rollout_server
        if server is None or server.tracer is None:
            return None
        return server.tracer.path_for(rollout_id)

    def cancel(self, rollout_id: str, *, reason: str = "test harness") -> bool:
        """Cancel a running in-process rollout; it still sends its ``ERROR``/``cancelled``
        callback. Returns False when there is no such rollout (or the server is remote)."""
        if self.rollout_server is None:
            return False
        entry = self.rollout_server.registry.by_id.get(rollout_id)
        if entry is None:
            return False
        entry.control.cancel(reason)
        return True

    async def cancel_remote(self, rollout_id: str) -> bool:
        """Ask a server in another process to cancel ``rollout_id`` (``POST /rollout/cancel``,
        or v1's ``/v1/rollout/cancel`` extension); True when it answers that it cancelled it
        (a server whose cancel cancels nothing, as osmosis-ai 0.3's, answers no disposition)."""
        if self.rollout_server is not None or self._server_http is None:
            return False
        import json

        path = "/v1/rollout/cancel" if self.wire is V1 else "/rollout/cancel"
        body = json.dumps({"ids": [rollout_id]}).encode()
        calls: ServerCalls = HttpxCalls(self._server_http)
        if self.gate_tracer is not None:  # a call of the rollout's, in its trace
            calls = self.gate_tracer.noted(calls, rollout_id)
        try:
            reply = await calls.post(
                f"{self._server_base}{path}", body, server_headers(self.server_key)
            )
            answer: Any = reply.json()
        except (httpx2.HTTPError, TransportFailure, ValueError):
            return False
        dispositions = answer.get("dispositions") if isinstance(answer, dict) else None
        if reply.status_code != 200 or not isinstance(dispositions, dict):
            return False
        return dispositions.get(rollout_id) in ("cancelled_queued", "cancelled_running")

    async def run(
        self,
        messages: list[Message],
        *,
        rollout_id: str | None = None,
        completion_params: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        max_turns: int = 10,
        max_tokens_total: int = 8192,
        timeout_s: float = 60.0,
        grader_timeout_s: float | None = None,
    ) -> RolloutOutcome:
        """Start one rollout over the harness's wire, wait for its result, and report what
        happened (the wire's controller: ``Controller.run``).

        ``timeout_s`` is how long the rollout may take; the result is awaited a little longer
        (the server's own deadline starts later, when the agent starts), so that an agent that
        runs too long shows up as the server's ``ERROR``/``timeout``, not as a lost callback.
        Raises ``ConfigError`` when the request itself is invalid (e.g. metadata too large).
        On v2, ``timeout_s`` is the ``agent_timeout_sec`` and ``grader_timeout_s`` (default:
        the same) the ``grader_timeout_sec`` of the ``POST /rollout``.
        """
        if self._server_post is None:
            raise RuntimeError("use the Harness inside `async with`")
        rid = rollout_id or f"rollout-{uuid.uuid4().hex[:12]}"
        try:
            request = RolloutRequest(
                rollout_id=rid,
                server_url=self.gate.base_url,
                messages=messages,
                completion_params=completion_params or {},
                max_turns=max_turns,
                max_tokens_total=max_tokens_total,
                metadata=metadata or {},
                api_key=MOCK_API_KEY,
            )
        except ValidationError as exc:
            raise ConfigError(
                f"this rollout cannot be sent: {describe_validation_error(exc)}"
            ) from None
        started = time.perf_counter()
        link = ServerLink(
            post=self._server_post,
            calls=self._server_calls(),
            base_url=self._server_base,
            key=self.server_key,
            agent=self.agent,
            slack_s=self.v2_slack_s,
        )
        grader_s = timeout_s if grader_timeout_s is None else grader_timeout_s
        gate_tracer = self.gate_tracer
        begun = time.time()
        if gate_tracer is not None:
            link = gate_tracer.link(link, rid)
        try:
            record, response = await self.gate.controller(self.wire).run(
                link, request, timeout_s=timeout_s, grader_timeout_s=grader_s
            )
        except BaseException as exc:
            if gate_tracer is not None:  # what was seen until then (Ctrl-C, a server gone)
                gate_tracer.write(rid, self.gate.records.get(rid), started=begun)
            if isinstance(exc, TransportFailure):
                raise ServerUnreachable(
                    f"cannot reach the rollout server at {self.server_url}: {exc.kind}"
                ) from None
            raise
        try:
            init_body: Any = response.json()
        except ValueError:
            init_body = response.text[:500]
        remote = self.agent is None and self.start_checks
        if remote and response.status_code == 202 and self.wire is not V1:
            check_start(record, init_body, keyed=bool(self.server_key))
        if gate_tracer is not None:
            gate_tracer.write(rid, record, started=begun)
        tracer = self.rollout_server.tracer if self.rollout_server is not None else None
        if tracer is not None and record.findings:
            tracer.sink(rid, secrets=[MOCK_API_KEY, MOCK_CALLBACK_KEY])(
                {"event": "findings", "rollout_id": rid}
                | {"findings": [f.as_dict() for f in record.findings]}
            )
        return RolloutOutcome(
            rollout_id=rid,
            init_status=response.status_code,
            init_body=init_body,
            record=record,
            wall_ms=(time.perf_counter() - started) * 1000,
            findings=list(record.findings),
            init_hint=self._wire_hint(response.status_code),
        )

    def _wire_hint(self, status: int) -> str | None:
        """For a v1 init answered 404: the server speaks another wire, so name the flags that
        choose them (an osmosis-ai 0.3 server has no ``/v1/rollout/init``). For a v2 or polling
        start answered 422: most likely the other of the two (their starts differ in required
        fields: v2's ``completion_callback_url``), so name its flag."""
        from ..server.wire.polling import Polling

        if status == 422 and self.wire is not V1 and self.agent is None:
            v2 = wire_named("v2").protocol
            other, release = (
                (Polling.protocol, "0.3.3 or later")
                if self.wire.protocol == v2
                else (v2, "0.3.0-0.3.2")
            )
            return (
                f"a {self.wire.protocol} start refused as invalid most often means the server "
                f"speaks another wire: an osmosis-ai {release} server speaks {other}, try "
                f"--protocol {other} (or drop --protocol: the wire is then asked of the "
                "server's /health)"
            )
        if status != 404 or self.wire is not V1:
            return None
        from .wire.v1 import INIT_PATH

        others = [w.protocol for w in WIRES if w is not self.wire]
        if Polling.protocol not in others:
            others.append(Polling.protocol)
        choices = " or ".join(f"--protocol {name}" for name in others)
        return (
            f"the server has no POST {INIT_PATH}: an osmosis-ai 0.3 server "
            f"speaks another wire, try {choices} (or drop --protocol: the wire is then asked "
            "of the server's /health)"
        )

    def _server_calls(self) -> ServerCalls:
        """How status and cancel reach the server: a direct call of the in-process app (as the
        init), or the ``httpx2`` client of ``--server``."""
        if isinstance(self._server_post, AsgiTransport):
            return self._server_post
        assert self._server_http is not None
        return HttpxCalls(self._server_http)
