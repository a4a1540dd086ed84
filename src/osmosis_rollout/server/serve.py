"""``serve``: run a rollout server under uvicorn, draining gracefully on SIGTERM/SIGINT.

uvicorn closes its listening socket as soon as a signal arrives. We drain *first*, while still
listening, so TrainGate sees ``503`` on new inits and ``/health`` says ``draining`` during the
grace period; only then is uvicorn told to exit. A second signal cancels the remaining rollouts
at once (each still sends its ``ERROR``/``cancelled`` callback); a third forces exit.
"""

from __future__ import annotations

import asyncio
import copy
import gc
import importlib
import logging
import logging.config
import os
import signal
import socket
import sys
from types import FrameType
from typing import Any

import uvicorn
from pydantic import ValidationError

from ..agent import RolloutAgentLoop
from ..config import ServerSettings
from ..errors import ConfigError, OsmosisError
from ..launch_contract import apply_launch, port_conflict
from .app import create_app
from .auth import decide_auth
from .connections import (
    ConnectionLimits,
    LimitedConfig,
    auto_max_connections,
    file_limit,
    protocol_class,
    raise_file_limit,
)
from .core import RolloutServer
from .workers import die_with_parent, run_workers

__all__ = ["bind_socket", "http_stack", "serve"]

logger = logging.getLogger("osmosis_rollout.server")


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind the listening socket up front so a busy port is one clear ``ConfigError``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY only on sockets that say TCP, and
    # without it every small response waits ~40 ms for a delayed ACK (Nagle).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno in (98, 48, 10048):  # EADDRINUSE on Linux, macOS, Windows
            raise ConfigError(
                f"port {port} on {host} is already in use; stop the other server or pick "
                "another port with --port"
            ) from None
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    # Listen now: a client that connects as soon as the banner says so waits in the backlog
    # until uvicorn accepts, instead of being refused while the app starts up.
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def http_stack(loop: str = "auto", http: str = "auto") -> tuple[str, str]:
    """The (event loop, HTTP parser) the server will run, ``"auto"`` resolved: uvloop and
    httptools when importable (``uvicorn[standard]``: the least CPU per rollout, see
    docs/benchmarks.md), else the pure-Python fallback, asyncio and h11."""
    if loop == "auto":
        loop = "uvloop" if _importable("uvloop") else "asyncio"
    if http == "auto":
        http = "httptools" if _importable("httptools") else "h11"
    return loop, http


class _DrainingServer(uvicorn.Server):
    """A uvicorn server whose first exit signal drains rollouts before closing the socket."""

    def __init__(
        self, config: uvicorn.Config, rollouts: RolloutServer, *, worker: bool = False
    ) -> None:
        super().__init__(config)
        self._rollouts = rollouts
        self._signals = 0
        self._drain: asyncio.Task[None] | None = None
        self._worker = worker

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self._worker:  # handlers are ours now: a dying supervisor means drain
            die_with_parent()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._worker and sig == signal.SIGINT:
            return  # a terminal's Ctrl-C: the supervisor forwards it as SIGTERM
        self._signals += 1
        if self._signals == 1:
            loop = asyncio.get_event_loop()
            loop.call_soon_threadsafe(self._start_drain)
        elif self._signals == 2:
            logger.warning("second signal: cancelling all running rollouts now")
            asyncio.get_event_loop().call_soon_threadsafe(self._cancel_all)
        else:
            self.should_exit = True
            self.force_exit = True

    def _cancel_all(self) -> None:
        for entry in self._rollouts.registry.unfinished():
            entry.control.cancel()

    def _start_drain(self) -> None:
        self._drain = asyncio.ensure_future(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        try:
            await self._rollouts.drain()
        finally:
            self.should_exit = True


def _log_config(log_level: str) -> dict[str, Any]:
    """uvicorn's logging setup plus our ``osmosis_rollout`` loggers on the same handler, so
    callback failures and drain progress show with a level, and ``--log-level`` applies."""
    config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    config["loggers"]["osmosis_rollout"] = {
        "handlers": ["default"],
        "level": log_level.upper(),
        "propagate": False,
    }
    return config


def serve(
    agent_loop: RolloutAgentLoop,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    settings: ServerSettings | None = None,
    log_level: str = "info",
    sock: socket.socket | None = None,
    workers: int = 1,
    loop: str = "auto",
    http: str = "auto",
    no_auth: bool = False,
    **app_options: Any,
) -> None:
    """Serve ``agent_loop`` until SIGTERM/SIGINT; the Python twin of ``osmosis serve``.

    ``app_options`` are ``create_app`` keywords (or pass a resolved ``settings``); ``sock`` is an
    already bound listening socket (see :func:`bind_socket`). ``workers`` > 1 forks that many
    server processes sharing the socket (POSIX only; see ``server/workers.py``); give them a
    shared ``state`` (a Redis URL) so that idempotency and admission hold across them.
    ``loop`` and ``http`` are uvicorn's: by default uvloop and httptools when installed (they
    come with ``uvicorn[standard]``; see docs/benchmarks.md), else asyncio and the pure-Python
    h11; ``loop="asyncio", http="h11"`` forces that fallback.

    The port is ``port``, else the platform's ``_OSMOSIS_ROLLOUT_PORT``, else 9000; the
    platform's other variables fill what was not given (``launch_contract.py``,
    docs/platform.md).

    Auth follows ``osmosis serve``: a blank ``api_key`` is a ``ConfigError``; on an interface
    other than loopback without a key one is generated and printed once on stderr, unless
    ``no_auth=True`` says to serve without one.
    """
    if settings is None:
        settings, app_options = _settings_of(host, port, log_level, app_options)
    settings = apply_launch(settings, os.environ)
    conflict = port_conflict(settings.port, os.environ)
    if conflict is not None:
        print(f"osmosis serve: warning: {conflict}", file=sys.stderr, flush=True)
    settings = _with_auth(settings, no_auth=no_auth)
    loop, http = http_stack(loop, http)
    stack = {"loop": loop, "http": http}
    raise_file_limit()  # before any fork: every worker inherits it
    log_level = settings.log_level
    workers = settings.workers if workers == 1 else workers
    listener = sock or bind_socket(settings.host, settings.port)
    if workers > 1:
        if not hasattr(os, "fork"):
            raise ConfigError("--workers needs os.fork (Linux or macOS); run one process per core")

        def child() -> None:
            _serve_one(agent_loop, settings, app_options, log_level, listener, stack, worker=True)

        logging.config.dictConfig(_log_config(log_level))  # the supervisor's lines too
        if settings.state == "memory":
            logger.warning(
                "%d workers with the memory state: each keeps its own idempotency records, so a "
                "retried init that reaches another worker starts a second rollout; use Redis",
                workers,
            )
        try:
            code = run_workers(child, workers)
        finally:
            listener.close()
        if code:
            raise OsmosisError("the workers kept dying at start; the log above says why")
        return
    try:
        _serve_one(agent_loop, settings, app_options, log_level, listener, stack, worker=False)
    finally:
        listener.close()


#: ``create_app`` keywords that are not settings: they pass through to it as they are.
_APP_ONLY = frozenset({"client", "on_startup", "on_shutdown"})


def _settings_of(
    host: str, port: int | None, log_level: str, app_options: dict[str, Any]
) -> tuple[ServerSettings, dict[str, Any]]:
    """The ``ServerSettings`` that ``serve()``'s keywords describe, and the rest of them.

    A port left out stays out of the settings' given fields, so the platform's may fill it.
    """
    key = app_options.get("api_key")
    if isinstance(key, str) and not key.strip():
        raise ConfigError(
            "api_key is blank (an unset variable?); give a real key, or pass no_auth=True "
            "to serve without one"
        )
    given = {k: v for k, v in app_options.items() if k not in _APP_ONLY and v is not None}
    given.update(host=host, log_level=log_level)
    if port is not None:
        given["port"] = port
    try:
        settings = ServerSettings.model_validate(given)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}"
            for error in exc.errors(include_input=False, include_url=False)
        )
        raise ConfigError(f"invalid serve() settings: {problems}") from None
    return settings, {k: v for k, v in app_options.items() if k in _APP_ONLY}


def _with_auth(settings: ServerSettings, *, no_auth: bool) -> ServerSettings:
    """``settings`` with the server key ``decide_auth`` picks; a generated key is printed once
    on stderr (the CLI's banner does the same)."""
    decided, generated = decide_auth(settings, no_auth=no_auth)
    if decided.api_key is not None and generated:
        shown = decided.api_key.get_secret_value()
        print(
            f"osmosis serve: no server key on {settings.host}, "
            f"a public interface; generated one (shown once, pass it to TrainGate): {shown}",
            file=sys.stderr,
            flush=True,
        )
    return decided


def _serve_one(
    agent_loop: RolloutAgentLoop,
    settings: ServerSettings,
    app_options: dict[str, Any],
    log_level: str,
    listener: socket.socket,
    stack: dict[str, str],
    *,
    worker: bool,
) -> None:
    """One server process: the app, uvicorn on ``listener``, drain on the first signal."""
    app = create_app(agent_loop, settings=settings, **app_options)
    resolved = app.state.rollout_server.settings
    limits = ConnectionLimits(
        max_connections=resolved.max_connections or auto_max_connections(file_limit()[0]),
        header_timeout_s=resolved.header_timeout_s,
        max_header_bytes=resolved.max_header_bytes,
    )
    config = LimitedConfig(
        app,
        limits=limits,
        log_config=_log_config(log_level),
        log_level=log_level,
        lifespan="on",
        timeout_graceful_shutdown=5,
        timeout_keep_alive=resolved.keep_alive_timeout_s,
        h11_max_incomplete_event_size=resolved.max_header_bytes,
        access_log=log_level == "debug",
        loop=stack["loop"],
        http=protocol_class(stack["http"]),
    )
    server = _DrainingServer(config, app.state.rollout_server, worker=worker)
    # Everything imported so far lives as long as the process: keep it out of the garbage
    # collector's full passes, which otherwise grow with it (see docs/benchmarks.md).
    gc.collect()
    gc.freeze()
    # Server.run, not asyncio.run(server.serve()): only run() uses the loop factory (uvloop).
    server.run(sockets=[listener])
