"""``create_app``: the Starlette app that serves one agent over the remote rollout protocol.

The app's lifespan owns the long-lived parts: the pooled ``TrainGateClient``, the task group in
which rollouts run (never request-scoped), the TTL cleanup, the debug tracer. Each accepted
rollout ends in exactly one completion callback; one that cannot be delivered goes to the outbox.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from pydantic import SecretStr, TypeAdapter, ValidationError
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from ..agent import RolloutAgentLoop, resolve_tools
from ..client import RetryPolicy, TrainGateClient
from ..config import ServerSettings
from ..errors import TrainGateError
from ..protocol import (
    DEFAULT_MAX_METADATA_BYTES,
    HealthResponse,
    OpenAIFunctionToolSchema,
    RolloutRequest,
    RolloutResponse,
    RolloutStatus,
    loggable,
    scrub,
)
from ..rollout import run_rollout
from ..tracing import Tracer
from .auth import key_matches
from .outbox import DEFAULT_OUTBOX_DIR, write_outbox
from .registry import Conflict, RolloutEntry, RolloutRegistry, fingerprint

__all__ = ["RolloutServer", "create_app"]

logger = logging.getLogger("osmosis_rollout.server")

_JSON = "application/json"
#: Inits larger than this are refused with 413 before parsing (messages can be long).
_MIN_BODY_LIMIT = 16 * 1024 * 1024
_RETRY_AFTER_S = "5"
_TOOLS_JSON = TypeAdapter(list[OpenAIFunctionToolSchema])
#: After the grace period, how long cancelled rollouts get to deliver their callbacks before
#: the rest are stopped and written to the outbox (a dead TrainGate must not hold shutdown).
_DELIVERY_GRACE_S = 15.0
#: How long a client may take to send an init's body (a slow sender must not hold a connection).
_BODY_TIMEOUT_S = 30.0
#: A 422 lists at most this many validation errors (plus the total count), each message cut to
#: _MAX_ERROR_CHARS and the whole list to _MAX_ERRORS_BYTES: small whatever the input.
_MAX_ERRORS = 20
_MAX_ERROR_CHARS = 200
_MAX_ERRORS_BYTES = 4096

#: A start-up or shutdown hook: an async function without arguments (a sync one works too).
Hook = Callable[[], Awaitable[None] | None]


async def _call_hook(hook: Hook | None, when: str) -> None:
    if hook is None:
        return
    result = hook()
    if inspect.isawaitable(result):
        await result
    logger.debug("%s hook %r done", when, hook)


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
) -> Starlette:
    """Build the rollout server for ``agent_loop``.

    Pass either keyword settings or a resolved ``ServerSettings`` (not both). ``client`` lets
    tests and the mock harness route callbacks in-process; by default the lifespan opens one.
    ``on_startup`` is awaited before the first request is served; ``on_shutdown`` after the
    drain (running rollouts have ended), before the client closes. The ``RolloutServer`` behind
    the app is ``app.state.rollout_server``.
    """
    if settings is None:
        settings = ServerSettings(
            api_key=SecretStr(api_key) if api_key else None,
            max_concurrent=max_concurrent,
            max_queued=max_queued,
            rollout_timeout_s=rollout_timeout_s,
            record_ttl_s=record_ttl_s,
            shutdown_grace_s=shutdown_grace_s,
            debug_dir=Path(debug_dir) if debug_dir is not None else None,
            outbox_dir=Path(outbox_dir) if outbox_dir is not None else None,
            max_metadata_bytes=max_metadata_bytes,
        )
    server = RolloutServer(agent_loop, settings, client=client)
    server.hooks = (on_startup, on_shutdown)
    app = Starlette(
        routes=[
            Route("/v1/rollout/init", server.init, methods=["POST"]),
            Route("/health", server.health, methods=["GET"]),
            Route("/platform/health", server.platform_health, methods=["GET"]),
        ],
        lifespan=server.lifespan,
    )
    app.state.rollout_server = server
    return app


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(body), status_code=status, media_type=_JSON, headers=headers)


class RolloutServer:
    """The state and handlers behind ``create_app``; one per app."""

    def __init__(
        self,
        agent: RolloutAgentLoop,
        settings: ServerSettings,
        *,
        client: TrainGateClient | None = None,
    ) -> None:
        self.agent = agent
        self.settings = settings
        self.registry = RolloutRegistry(
            max_concurrent=settings.max_concurrent,
            max_queued=settings.max_queued,
            record_ttl_s=settings.record_ttl_s,
        )
        self._server_key = settings.api_key.get_secret_value() if settings.api_key else None
        self._given_client = client
        self.client: TrainGateClient | None = client
        self.tracer = Tracer(settings.debug_dir) if settings.debug_dir else None
        self.outbox_dir = settings.outbox_dir or DEFAULT_OUTBOX_DIR
        self._slots = anyio.Semaphore(settings.max_concurrent)
        self._tasks: anyio.abc.TaskGroup | None = None
        self._body_limit = max(_MIN_BODY_LIMIT, 4 * settings.max_metadata_bytes)
        self.body_timeout_s = _BODY_TIMEOUT_S
        self.delivery_grace_s = _DELIVERY_GRACE_S
        self.hooks: tuple[Hook | None, Hook | None] = (None, None)  # on_startup, on_shutdown

    # -- lifespan -------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        """Open the client and the rollout task group; on exit drain, then close everything."""
        owns_client = self._given_client is None
        if owns_client:
            self.client = TrainGateClient(
                retry=RetryPolicy(),
                max_connections=max(1000, 2 * self.settings.max_concurrent),
            )
        try:
            async with anyio.create_task_group() as tasks:
                self._tasks = tasks
                tasks.start_soon(self._expire_records)
                await _call_hook(self.hooks[0], "startup")
                try:
                    yield
                finally:
                    with anyio.CancelScope(shield=True):
                        await self.drain()
                        try:
                            await _call_hook(self.hooks[1], "shutdown")
                        except Exception:
                            logger.exception("the on_shutdown hook raised")
                    tasks.cancel_scope.cancel()
        finally:
            self._tasks = None
            if owns_client and self.client is not None:
                await self.client.aclose()
            if self.tracer is not None:
                self.tracer.close()

    async def drain(self) -> None:
        """Stop accepting; give running rollouts the grace period; cancel the rest."""
        if not self.registry.draining:
            logger.info(
                "draining: %d running, %d queued; grace period %g s",
                self.registry.active,
                self.registry.queued,
                self.settings.shutdown_grace_s,
            )
        await self.registry.drain(self.settings.shutdown_grace_s, self.delivery_grace_s)

    async def _expire_records(self) -> None:
        interval = min(60.0, max(0.05, self.settings.record_ttl_s / 2))
        while True:
            await anyio.sleep(interval)
            self.registry.expire()

    # -- GET /health, GET /platform/health --------------------------------------------------------

    def _health_body(self) -> HealthResponse:
        registry = self.registry
        return HealthResponse(
            status="draining" if registry.draining else "healthy",
            agent_loop=self.agent.name,
            active_rollouts=registry.active,
            completed_rollouts=registry.completed_total,
            queued_rollouts=registry.queued,
        )

    async def health(self, request: Request) -> Response:
        """200 with counts, or 503 while draining."""
        body = self._health_body()
        status = 503 if body.status == "draining" else 200
        return Response(body.model_dump_json(), status_code=status, media_type=_JSON)

    async def platform_health(self, request: Request) -> Response:
        """The ``/health`` body behind the server key; 404 when the server has no key."""
        if self._server_key is None:
            return _json(404, {"detail": "Not Found"})
        if not key_matches(request.headers.get("authorization"), self._server_key):
            return _json(401, {"detail": "Invalid or missing API key"})
        return await self.health(request)

    # -- POST /v1/rollout/init ------------------------------------------------------------------

    async def init(self, request: Request) -> Response:
        """Auth, validate, deduplicate, get tools, admit, start; see protocol.md section 1."""
        if self._server_key is not None and not key_matches(
            request.headers.get("authorization"), self._server_key
        ):
            return _json(401, {"detail": "Invalid or missing API key"})
        unavailable = self._unavailable()
        if unavailable is not None:
            return unavailable
        body = await self._read_body(request)
        if isinstance(body, Response):
            return body
        try:
            rollout = RolloutRequest.model_validate_json(
                body, context={"max_metadata_bytes": self.settings.max_metadata_bytes}
            )
        except ValidationError as exc:
            return _json(422, _validation_body(exc))

        body_fingerprint = fingerprint(body)
        found = self.registry.lookup(rollout, body_fingerprint)
        if isinstance(found, Conflict):
            return _json(409, {"detail": found.detail})
        if found is not None:
            status, answer = await found.init_answer()
            return Response(answer, status_code=status, media_type=_JSON)

        entry = self.registry.reserve(rollout, body_fingerprint)
        try:
            with anyio.fail_after(self.settings.get_tools_timeout_s):
                tools = await resolve_tools(self.agent, rollout)
        except TimeoutError:
            detail = f"get_tools did not return within {self.settings.get_tools_timeout_s:g} s"
            logger.error("rollout %s refused: %s", loggable(rollout.rollout_id), detail)
            return self._refuse(entry, 500, {"detail": detail})
        except Exception as exc:
            detail = scrub(f"get_tools failed: {type(exc).__name__}: {exc}", rollout.api_key_value)
            logger.error("rollout %s refused: %s", loggable(rollout.rollout_id), detail)
            return self._refuse(entry, 500, {"detail": detail})
        except BaseException:  # the request was cancelled: free the key so retries can start
            self._refuse(entry, 503, {"detail": "init interrupted; retry"})
            raise
        # Re-checked: draining may have begun while get_tools ran.
        unavailable = self._unavailable()
        if unavailable is not None:
            self.registry.release(entry, unavailable.status_code, bytes(unavailable.body))
            return unavailable
        if not self.registry.has_capacity():
            return self._refuse(
                entry,
                503,
                {"detail": "too many rollouts queued; retry later"},
                {"Retry-After": _RETRY_AFTER_S},
            )
        payload = self.registry.accept(entry, _TOOLS_JSON.dump_json(tools, exclude_none=True))
        assert self._tasks is not None  # _unavailable() checked it; no await since
        self._tasks.start_soon(self._run, entry, tools)
        return Response(payload, status_code=202, media_type=_JSON)

    def _unavailable(self) -> Response | None:
        """The 503 to answer when no rollout can start now, or None."""
        if self.registry.draining:
            detail = "server is shutting down; retry on another server"
        elif self._tasks is None:
            detail = (
                "server is not running: its lifespan has not started (when mounting the app, "
                "run its lifespan too, or use osmosis_rollout.server.serve)"
            )
        else:
            return None
        return _json(503, {"detail": detail}, {"Retry-After": _RETRY_AFTER_S})

    def _refuse(
        self,
        entry: RolloutEntry,
        status: int,
        body: dict[str, Any],
        headers: dict[str, str] | None = None,
    ) -> Response:
        response = _json(status, body, headers)
        self.registry.release(entry, status, bytes(response.body))
        return response

    async def _read_body(self, request: Request) -> bytes | Response:
        """The body, or the error to answer: 413 as soon as ``Content-Length`` (or the bytes
        received) exceed the limit, 408 when the body is not in within ``body_timeout_s``."""
        too_large = _json(413, {"detail": f"request body exceeds {self._body_limit} bytes"})
        declared = request.headers.get("content-length")
        if declared is not None:
            if not declared.isdigit():
                return _json(400, {"detail": "Content-Length must be a whole number of bytes"})
            if int(declared) > self._body_limit:
                return too_large
        chunks: list[bytes] = []
        size = 0
        with anyio.move_on_after(self.body_timeout_s):
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
            {"detail": f"request body not received within {self.body_timeout_s:g} s"},
            {"Connection": "close"},
        )

    # -- one rollout's background life ----------------------------------------------------------

    async def _run(self, entry: RolloutEntry, tools: Sequence[OpenAIFunctionToolSchema]) -> None:
        """Run the agent when a slot frees up, then send exactly one callback."""
        request = entry.request
        assert self.client is not None  # the lifespan opened it
        response: RolloutResponse | None = None
        try:
            async with self._slots:
                self.registry.start(entry)
                queued_ms = round((time.perf_counter() - entry.accepted_at) * 1000, 3)
                try:
                    response = await run_rollout(
                        self.agent,
                        request,
                        self.client.channel(request),
                        tools=tools,
                        deadline_s=self.settings.rollout_timeout_s,
                        tracer=self.tracer,
                        control=entry.control,
                    )
                except Exception as exc:  # a toolkit bug must still end in one callback
                    _log_exception(request, "internal error")
                    response = RolloutResponse(
                        rollout_id=request.rollout_id,
                        status=RolloutStatus.ERROR,
                        final_messages=list(request.messages),
                        finish_reason="error",
                        error_message=f"internal error: {type(exc).__name__}",
                    )
            if response.metrics is not None:
                response.metrics = response.metrics.model_copy(
                    update={"queue_latency_ms": queued_ms}
                )
            self.registry.delivering(entry)
            # A drain that gives up on this delivery cancels this scope: the result goes to the
            # outbox at once, not when the process exits.
            with anyio.CancelScope() as entry.delivery:
                await self._deliver(entry, response)
        except BaseException:
            if response is None:  # stopped before the agent ran: the result is still kept
                cancelled = RolloutResponse(
                    rollout_id=request.rollout_id,
                    status=RolloutStatus.ERROR,
                    final_messages=list(request.messages),
                    finish_reason="cancelled",
                    error_message="rollout cancelled (server stopped before it ran)",
                )
                self._to_outbox(request, cancelled, "server stopped before the rollout ran")
            raise
        finally:
            self.registry.finish(entry)

    async def _deliver(self, entry: RolloutEntry, response: RolloutResponse) -> None:
        assert self.client is not None
        request = entry.request
        entry.outcome = "outbox"  # until TrainGate accepts it
        try:
            await self.client.complete_rollout(
                request.server_url, response, api_key=request.api_key_value
            )
            entry.outcome = response.status.value
        except TrainGateError as exc:
            self._to_outbox(request, response, str(exc))
        except Exception as exc:  # never let one delivery take the task group down
            _log_exception(request, "callback could not be sent")
            self._to_outbox(request, response, f"callback not sent: {type(exc).__name__}")
        except BaseException as exc:  # cancelled mid-delivery (drain gave up, or a hard stop)
            reason = "shutdown: TrainGate did not accept it in time"
            self._to_outbox(
                request, response, f"delivery interrupted ({reason}): {type(exc).__name__}"
            )
            raise

    def _to_outbox(self, request: RolloutRequest, response: RolloutResponse, error: str) -> None:
        secret = request.api_key_value
        error = scrub(error, secret)
        try:
            path = write_outbox(self.outbox_dir, request.server_url, response, error, secret)
        except Exception as exc:
            logger.critical(
                "rollout %s: callback failed (%s) and the outbox is not writable (%s); "
                "response follows: %s",
                loggable(request.rollout_id),
                error,
                exc,
                scrub(repr(response), secret),
            )
            return
        logger.error(
            "rollout %s: completion callback failed (%s); saved to %s",
            loggable(request.rollout_id),
            error,
            path,
        )


def _log_exception(request: RolloutRequest, what: str) -> None:
    """Log the exception being handled, its traceback scrubbed of the rollout's api_key."""
    text = scrub(traceback.format_exc(), request.api_key_value)
    logger.error("rollout %s: %s\n%s", loggable(request.rollout_id), what, text.rstrip())


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


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
