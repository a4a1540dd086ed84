"""``create_app``: the Starlette app that serves one agent; this module is its HTTP edge.

The edge checks what every request must pass before the core sees it: the screening of every
route (``screening.py``: no web pages, only the server's own host names, JSON bodies), the
server key, the body's size and arrival time (413, 408, 400), the body's shape (422, via the
wire), where it asks the server to call (422, ``destinations.py``), and the 503 while the
server is draining or not running. The routes are ``/health``, ``/platform/health``,
``/metrics`` and each wire's start route (v1: ``POST /v1/rollout/init``; v2 and polling share
``POST /rollout``, told apart by the body: ``Wire.claims``) with its status, result and cancel
routes.
Everything behind them is ``RolloutServer`` (``core.py``).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
from pydantic import SecretStr, ValidationError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ..agent import RolloutAgentLoop
from ..client import TrainGateClient
from ..config import ServerSettings
from ..destinations import DestinationPolicy, check_destination
from ..errors import ConfigError
from ..protocol import DEFAULT_MAX_METADATA_BYTES, RolloutRequest
from .auth import is_loopback, key_matches
from .core import DELIVERY_GRACE_S, Hook, RolloutServer
from .pinning import FirstInitPin, is_open
from .screening import HostRule, Screening
from .state import StateUnavailable
from .types import Answer, Wire
from .wire import all_wires

__all__ = ["INSTANCE_HEADER", "Edge", "Hook", "build_app", "create_app"]

_JSON = "application/json"
#: Inits larger than this are refused with 413 before parsing (messages can be long).
_MIN_BODY_LIMIT = 16 * 1024 * 1024
#: After the grace period, how long cancelled rollouts get to deliver their callbacks (read
#: when an app is built, so a test or a script may set it first).
_DELIVERY_GRACE_S = DELIVERY_GRACE_S
#: A 422 lists at most this many validation errors (plus the total count), each message cut to
#: _MAX_ERROR_CHARS and the whole list to _MAX_ERRORS_BYTES: small whatever the input.
_MAX_ERRORS = 20
_MAX_ERROR_CHARS = 200
_MAX_ERRORS_BYTES = 4096


def create_app(
    agent_loop: RolloutAgentLoop,
    *,
    api_key: str | None = None,
    max_concurrent: int = 100,
    max_queued: int = 10_000,
    rollout_timeout_s: float = 3600.0,
    record_ttl_s: float = 3600.0,
    shutdown_grace_s: float = 30.0,
    debug_dir: str | Path | None = None,
    outbox_dir: str | Path | None = None,
    max_metadata_bytes: int = DEFAULT_MAX_METADATA_BYTES,
    settings: ServerSettings | None = None,
    client: TrainGateClient | None = None,
    on_startup: Hook | None = None,
    on_shutdown: Hook | None = None,
    metrics: bool = True,
    state: str = "memory",
    lease_ttl_s: float = 30.0,
    artifact_root: str | Path | None = None,
) -> Starlette:
    """Build the rollout server for ``agent_loop``.

    Pass either keyword settings or a resolved ``ServerSettings`` (not both): the keywords are
    a thin layer that builds one. ``client`` lets tests and the mock harness route callbacks
    in-process; by default the lifespan opens one. ``on_startup`` is awaited before the first
    request is served; ``on_shutdown`` after the drain (running rollouts have ended), before the
    client closes. ``artifact_root``: each rollout's ATIF ``trajectory.json`` goes under it.
    The ``RolloutServer`` behind the app is ``app.state.rollout_server``.
    """
    if settings is None:
        if api_key is not None and not api_key.strip():
            raise ConfigError(
                "api_key is blank (an unset variable?); give a real key, or api_key=None to "
                "serve without one"
            )
        settings = ServerSettings(
            api_key=SecretStr(api_key) if api_key is not None else None,
            max_concurrent=max_concurrent,
            max_queued=max_queued,
            rollout_timeout_s=rollout_timeout_s,
            record_ttl_s=record_ttl_s,
            shutdown_grace_s=shutdown_grace_s,
            debug_dir=Path(debug_dir) if debug_dir is not None else None,
            outbox_dir=Path(outbox_dir) if outbox_dir is not None else None,
            max_metadata_bytes=max_metadata_bytes,
            metrics=metrics,
            state=state,
            lease_ttl_s=lease_ttl_s,
            artifact_root=Path(artifact_root) if artifact_root is not None else None,
        )
    server = RolloutServer(
        agent_loop,
        settings,
        wires=all_wires(settings),
        client=client,
        delivery_grace_s=_DELIVERY_GRACE_S,
    )
    server.hooks = (on_startup, on_shutdown)
    return build_app(server)


def build_app(server: RolloutServer) -> Starlette:
    """The Starlette app in front of ``server``: each wire's routes, then the health and
    metrics routes; the app's lifespan is the server's."""
    edge = Edge(server)
    routes: list[BaseRoute] = []
    served: set[tuple[str, frozenset[str]]] = set()
    for path in dict.fromkeys(wire.start_path for wire in server.wires):
        sharing = [wire for wire in server.wires if wire.start_path == path]
        routes.append(Route(path, edge.start_route(*sharing), methods=["POST"]))
        served.add((path, frozenset({"POST"})))
    for wire in server.wires:
        for route in wire.routes(edge):
            # Wires sharing a start route share its cancel route too: the first one serves it.
            key = (getattr(route, "path", ""), frozenset(getattr(route, "methods", None) or ()))
            if key not in served:
                served.add(key)
                routes.append(route)
    routes.append(Route("/health", edge.health, methods=["GET"]))
    routes.append(Route("/platform/health", edge.platform_health, methods=["GET"]))
    if server.metrics is not None:
        routes.append(Route("/metrics", edge.metrics_page, methods=["GET"]))
    settings = server.settings
    screening = Middleware(
        Screening,
        hosts=HostRule(settings.host, settings.allow_host),
        origins=settings.allow_origin,
        server_key=edge.server_key,
        on_refusal=edge.count_screened,
        loopback_only=is_loopback(settings.host),
    )
    app = Starlette(routes=routes, lifespan=server.lifespan, middleware=[screening])
    app.state.rollout_server = server
    return app


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(body), status_code=status, media_type=_JSON, headers=headers)


_UNAUTHORIZED = {"detail": "Invalid or missing API key"}
#: The header ``/health`` names this server's instance in (the platform's runner checks it).
INSTANCE_HEADER = "x-osmosis-rollout-instance-id"


class Edge:
    """The HTTP handlers of one app, in front of its ``RolloutServer``; what the wires' own
    routes get of it is ``types.Edge``."""

    def __init__(self, server: RolloutServer) -> None:
        self.server = server
        settings = server.settings
        self.server_key = settings.api_key.get_secret_value() if settings.api_key else None
        self._body_limit = max(_MIN_BODY_LIMIT, 4 * settings.max_metadata_bytes)
        self.destinations = DestinationPolicy.for_server(settings.host, settings.traingate)
        #: No key on a public interface (``--no-auth``): only ids may be cancelled, and without
        #: ``--traingate`` the first accepted init's hosts are pinned (``pinning.py``).
        self.open = is_open(settings)
        self.pin = FirstInitPin() if self.open and not settings.traingate else None
        # The platform's runner reads the instance id from this header (the body's is v2's).
        instance = server.instance_id
        self._instance = (
            {INSTANCE_HEADER: instance} if all(" " < c <= "~" for c in instance) else None
        )

    def count_screened(self, path: str, cause: str) -> None:
        """Count an init the screening refused (``screening.py``), by cause."""
        metrics = self.server.metrics
        if metrics is not None and any(path == wire.start_path for wire in self.server.wires):
            metrics.rejected.labels(cause=cause).inc()

    def _authorized(self, request: Request) -> bool:
        return self.server_key is None or key_matches(
            request.headers.get("authorization"), self.server_key
        )

    # -- for the wires' own routes (status, cancel) ---------------------------------------------

    def authorized(self, request: Request) -> bool:
        """Whether the request carries the server key (or the server has none)."""
        return self._authorized(request)

    async def read_body(self, request: Request) -> bytes | Response:
        """The body within the limits (or the 413/408/400 to answer)."""
        return await self._read_body(request)

    @staticmethod
    def validation_body(exc: ValidationError) -> dict[str, Any]:
        """A bounded 422 body that echoes no input."""
        return _validation_body(exc)

    # -- GET /health, GET /platform/health, GET /metrics ----------------------------------------

    async def health(self, request: Request) -> Response:
        """200 with counts; 503 while draining or while the shared state is unreachable."""
        body = await self.server.health_body()
        status = 200 if body.status == "healthy" else 503
        return Response(
            body.model_dump_json(), status_code=status, media_type=_JSON, headers=self._instance
        )

    async def platform_health(self, request: Request) -> Response:
        """The ``/health`` body behind the server key; 404 when the server has no key."""
        if self.server_key is None:
            return _json(404, {"detail": "Not Found"})
        if not self._authorized(request):
            return _json(401, _UNAUTHORIZED)
        return await self.health(request)

    async def metrics_page(self, request: Request) -> Response:
        """Prometheus text exposition; behind the server key when there is one, like inits."""
        if not self._authorized(request):
            return _json(401, _UNAUTHORIZED)
        metrics, state = self.server.metrics, self.server.state
        assert metrics is not None  # the route exists only with metrics on
        from .metrics import CONTENT_TYPE

        # The outbox lives in the state (files, or a Redis stream): counted at scrape time; if
        # the store does not answer, the gauge keeps its last value.
        with contextlib.suppress(StateUnavailable, TimeoutError, OSError):
            with anyio.fail_after(5):
                metrics.outbox_size.set(len(await state.outbox_list()))
        return Response(metrics.exposition(), headers={"Content-Type": CONTENT_TYPE})

    # -- the wire's start route (v1: POST /v1/rollout/init) -------------------------------------

    def start_route(self, *wires: Wire) -> Callable[[Request], Awaitable[Response]]:
        """The handler of a start route, for the wires that share it (the first whose
        ``claims`` takes a body parses it; the last takes what no other claims)."""

        async def start(request: Request) -> Response:
            return await self.counted_start(wires, request)

        return start

    def sharing(self, protocol: str) -> frozenset[str]:
        """The protocols whose wires share ``protocol``'s start route (itself included)."""
        paths = {wire.start_path for wire in self.server.wires if wire.protocol == protocol}
        return frozenset(
            wire.protocol for wire in self.server.wires if wire.start_path in paths
        ) | {protocol}

    async def counted_start(self, wires: Sequence[Wire], request: Request) -> Response:
        """``start``, with every answer other than 202 counted by cause in the metrics."""
        response = await self.start(wires, request)
        metrics = self.server.metrics
        if metrics is not None and response.status_code != 202:
            from .metrics import refusal_cause

            cause = refusal_cause(
                response.status_code,
                draining=self.server.registry.draining,
                running=self.server.running,
            )
            metrics.rejected.labels(cause=cause).inc()
        return response

    async def start(self, wires: Sequence[Wire], request: Request) -> Response:
        """Auth, the body, its wire, its shape; then the scheduler admits (or refuses) it."""
        if not self._authorized(request):
            return _json(401, _UNAUTHORIZED)
        server = self.server
        scheduler = server.scheduler
        unavailable = scheduler.unavailable()
        if unavailable is not None:
            return wires[0].respond(unavailable)
        body = await self._read_body(request)
        if isinstance(body, Response):
            return body
        wire = wires[-1]
        if len(wires) > 1:
            wire = next((each for each in wires[:-1] if each.claims(body)), wire)
        try:
            rollout = wire.parse(body, max_metadata_bytes=server.settings.max_metadata_bytes)
        except ValidationError as exc:
            return _json(422, _validation_body(exc))
        urls = _called_urls(rollout)
        for field, url in urls:
            refused = check_destination(url, self.destinations)
            if refused is not None:
                return _json(422, _refusal_body(field, refused))
        claim = None
        if self.pin is not None:
            pinned_out, claim = self.pin.hold(urls)
            if pinned_out is not None:
                return _json(403, {"detail": pinned_out})
        try:
            answer: Answer = await scheduler.admit(
                rollout, wire.target(rollout), wire.accepted, size=len(body)
            )
        except BaseException:
            if self.pin is not None:
                self.pin.settle(claim, accepted=False)
            raise
        if self.pin is not None:
            self.pin.settle(claim, accepted=answer.status == 202)
        return wire.respond(answer)

    async def _read_body(self, request: Request) -> bytes | Response:
        """The body, or the error to answer: 413 as soon as ``Content-Length`` (or the bytes
        received) exceed the limit, 408 when the body is not in within ``body_timeout_s``."""
        too_large = _json(413, {"detail": f"request body exceeds {self._body_limit} bytes"})
        declared = request.headers.get("content-length")
        if declared is not None:
            # ASCII digits only: str.isdigit() also takes "²" or "٣", which int() then refuses.
            if not (declared.isascii() and declared.isdigit()):
                return _json(400, {"detail": "Content-Length must be a whole number of bytes"})
            if int(declared) > self._body_limit:
                return too_large
        chunks: list[bytes] = []
        size = 0
        with anyio.move_on_after(self.server.body_timeout_s):
            try:
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > self._body_limit:
                        return too_large
                    chunks.append(chunk)
            except ClientDisconnect:
                return _json(400, {"detail": "client disconnected"})
            return b"".join(chunks)
        return _json(
            408,
            {"detail": f"request body not received within {self.server.body_timeout_s:g} s"},
            {"Connection": "close"},
        )


def _validation_body(exc: ValidationError) -> dict[str, Any]:
    """The 422 body: the first errors (never input values), each cut short, and the count.

    The input is pydantic's own (``fail_fast`` lists keep the count small); the caps keep the
    body a few KB whatever was sent.
    """
    details: list[dict[str, Any]] = []
    size = 0
    errors = exc.errors(include_input=False, include_url=False, include_context=False)
    for err in errors[:_MAX_ERRORS]:
        loc = [
            "body",
            *(_cut(str(part), 64) if isinstance(part, str) else part for part in err["loc"][:8]),
        ]
        item = {
            "loc": loc,
            "msg": _cut(err["msg"], _MAX_ERROR_CHARS),
            "type": _cut(err["type"], 64),
        }
        size += len(json.dumps(item))
        if size > _MAX_ERRORS_BYTES:
            break
        details.append(item)
    return {"detail": details, "error_count": exc.error_count()}


def _called_urls(rollout: RolloutRequest) -> list[tuple[str, str]]:
    """The URLs a rollout makes the server call, by field: a wire's request type may name more
    than v1's ``server_url`` (v2: its chat and callback URLs)."""
    # Looked up on the class: a missing attribute of a pydantic instance raises inside
    # pydantic's __getattr__, a few microseconds an init for v1's requests, which have none.
    called = _CALLED_URLS.get(type(rollout), _UNKNOWN)
    if called is _UNKNOWN:
        found = getattr(type(rollout), "called_urls", None)
        called = _CALLED_URLS[type(rollout)] = found if callable(found) else None
    if called is None:
        return [("server_url", rollout.server_url)]
    urls: list[tuple[str, str]] = called(rollout)
    return urls


#: ``called_urls`` of each request type (None: it has none, v1's), found once per type.
_CALLED_URLS: dict[type, Any] = {}
_UNKNOWN = object()


def _refusal_body(field: str, reason: str) -> dict[str, Any]:
    """A 422 in the shape of ``_validation_body`` for a value the server's policy refuses."""
    item = {"loc": ["body", field], "msg": _cut(reason, 2 * _MAX_ERROR_CHARS), "type": "refused"}
    return {"detail": [item], "error_count": 1}


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
