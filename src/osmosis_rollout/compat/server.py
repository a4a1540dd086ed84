"""The legacy server entry points: ``create_app`` (the legacy parameters), ``serve_agent_loop``.

Both build our server (``server.create_app`` / ``server.serve``). Platform registration (the legacy
SDK's ``credentials``, ``server_host``, ``server_port`` and ``skip_register=False``) is not part of
osmosis-rollout: those arguments are accepted, a warning says the server is not registered, and
it serves all the same.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
import warnings
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from ..agent import RolloutAgentLoop
from ..config import ServerSettings
from ..errors import ConfigError, ServeError
from ..server.app import Hook
from ..server.app import create_app as _create_app
from ..server.auth import key_matches
from .app import LegacyApp, as_legacy_app

__all__ = [
    "API_KEY_PREFIX",
    "API_KEY_RANDOM_BYTES",
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "create_app",
    "generate_api_key",
    "serve_agent_loop",
    "validate_and_report",
    "validate_api_key",
]

logger = logging.getLogger("osmosis_rollout.server")

DEFAULT_HOST = "0.0.0.0"  # The legacy default; serve_agent_loop generates a key for it
DEFAULT_PORT = 9000
API_KEY_PREFIX = "osm_rollout_"
API_KEY_RANDOM_BYTES = 32

_NOT_REGISTERED = (
    "platform registration is not part of osmosis-rollout: {what} accepted for compatibility "
    "with the original SDK, but the server is NOT registered with the Osmosis platform; give "
    "TrainGate its address and key yourself ({fix})"
)


def generate_api_key() -> str:
    """A new server key: ``osm_rollout_`` and 32 random bytes, URL-safe."""
    return f"{API_KEY_PREFIX}{secrets.token_urlsafe(API_KEY_RANDOM_BYTES)}"


def validate_api_key(provided: str | None, expected: str) -> bool:
    """Whether ``provided`` is ``expected`` (constant time; None is never valid)."""
    return provided is not None and key_matches(provided, expected)


def _refuse_blank_key(api_key: str | None) -> None:
    """A blank key (an unset variable, ``api_key=os.environ.get("KEY", "")``) would serve with
    no auth while the caller believes there is one: refused, as ``osmosis serve`` refuses it."""
    if api_key is not None and not api_key.strip():
        raise ConfigError(
            "api_key is blank (an unset variable?); give a real key, or api_key=None to "
            "serve without one"
        )


def _warn_not_registered(what: str, fix: str) -> None:
    message = _NOT_REGISTERED.format(what=what, fix=fix)
    logger.warning(message)
    warnings.warn(message, UserWarning, stacklevel=3)


def _legacy_settings(
    settings: Any,
    *,
    max_concurrent: int | None,
    record_ttl_seconds: float | None,
    api_key: str | None,
    debug_dir: str | Path | None,
    **more: Any,
) -> ServerSettings:
    """One ``ServerSettings`` from the legacy arguments: ours, or the legacy ``RolloutSettings``
    (only its ``server`` part is used), with explicit arguments winning; 0 or None mean the default.
    Without ``settings``, the legacy ``OSMOSIS_ROLLOUT_*`` variables (and ``.env``) apply, as the
    legacy SDK's ``get_settings()`` read them; each one set and not honoured is logged as a
    warning."""
    server = getattr(settings, "server", None)
    from_env: dict[str, Any] = {}
    if settings is None:
        from .settings import legacy_settings, unsaid

        found = legacy_settings(os.environ)
        from_env = found.values
        for line in unsaid(found.ignored):
            logger.warning("%s", line)
    updates: dict[str, Any] = {
        "max_concurrent": max_concurrent or getattr(server, "max_concurrent_rollouts", None),
        "record_ttl_s": record_ttl_seconds or getattr(server, "record_ttl_seconds", None),
        "api_key": SecretStr(api_key) if api_key else None,
        "debug_dir": Path(debug_dir) if debug_dir is not None else None,
        **more,
    }
    updates = {**from_env, **{k: v for k, v in updates.items() if v is not None}}
    if isinstance(settings, ServerSettings):
        return ServerSettings.model_validate({**dict(settings), **updates})
    return ServerSettings.model_validate({**V1_DEFAULTS, **updates, **_outbox(updates)})


#: Where the legacy SDK and we differ by default: the legacy SDK cancelled running rollouts at
#: shutdown (no drain).
V1_DEFAULTS: dict[str, Any] = {"shutdown_grace_s": 0.0}
#: How long a legacy app's shutdown waits for the ERROR callbacks of the rollouts it cancelled
#: before the rest go to the outbox: a test client's teardown stays well under a second.
V1_DELIVERY_GRACE_S = 0.25


def _outbox(updates: dict[str, Any]) -> dict[str, Any]:
    """A legacy app's outbox, unless given: the user's state directory, not the working directory
    (a test suite's ``TestClient(create_app(agent))`` must leave no files in the project)."""
    if updates.get("outbox_dir") is not None or updates.get("state", "memory") != "memory":
        return {}
    home = os.environ.get("XDG_STATE_HOME") or os.path.join(Path.home(), ".local", "state")
    return {"outbox_dir": Path(home) / "osmosis-rollout" / "outbox"}


def create_app(
    agent_loop: RolloutAgentLoop,
    max_concurrent: int | None = None,
    record_ttl_seconds: float | None = None,
    settings: Any = None,
    credentials: Any = None,
    server_host: str | None = None,
    server_port: int | None = None,
    api_key: str | None = None,
    debug_dir: str | Path | None = None,
    on_startup: Hook | None = None,
    on_shutdown: Hook | None = None,
    **options: Any,
) -> LegacyApp:
    """The rollout server for ``agent_loop``, taking the legacy arguments (in the legacy order).

    ``settings`` is our ``ServerSettings`` or the legacy ``RolloutSettings``; ``api_key`` None means
    no auth; ``on_startup`` is awaited before serving, ``on_shutdown`` after the drain. As in
    the legacy SDK, shutdown cancels running rollouts at once (``shutdown_grace_s`` gives them
    time); their ERROR callbacks get a quarter of a second, then the outbox (by default in the
    user's state directory, ``~/.local/state/osmosis-rollout/outbox``). Other keywords
    (``rollout_timeout_s``, ``outbox_dir``, ``client``...) are
    ``osmosis_rollout.server.create_app``'s. The app takes FastAPI's route decorators
    (``@app.get("/ready")``, see ``compat.app``).
    """
    if credentials is not None or server_host is not None or server_port is not None:
        given = [
            name
            for name, value in (
                ("credentials", credentials),
                ("server_host", server_host),
                ("server_port", server_port),
            )
            if value is not None
        ]
        _warn_not_registered(", ".join(given) + " are", "drop these arguments to silence this")
    _refuse_blank_key(api_key)
    client = options.pop("client", None)
    resolved = _legacy_settings(
        settings,
        max_concurrent=max_concurrent,
        record_ttl_seconds=record_ttl_seconds,
        api_key=api_key,
        debug_dir=debug_dir,
        **options,
    )
    app = _create_app(
        agent_loop, settings=resolved, client=client, on_startup=on_startup, on_shutdown=on_shutdown
    )
    server = app.state.rollout_server
    server.delivery_grace_s = min(server.delivery_grace_s, V1_DELIVERY_GRACE_S)
    return as_legacy_app(app, agent_loop.name)


def serve_agent_loop(
    agent_loop: RolloutAgentLoop,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    validate: bool = True,
    log_level: str = "info",
    reload: bool = False,
    settings: Any = None,
    skip_register: bool = False,
    api_key: str | None = None,
    local_debug: bool = False,
    debug_dir: str | Path | None = None,
) -> None:
    """Validate ``agent_loop``, print a banner, and serve it until SIGTERM/SIGINT (the legacy API).

    A key is generated and printed unless one is given (``local_debug`` turns auth off).
    ``debug_dir`` gets one sub-directory per server start. Raises ``ServeError`` for settings
    that cannot work and ``AgentLoopValidationError`` when the agent is not valid.
    """
    from rich.console import Console

    from ..render.validation import validation_report
    from ..server.serve import serve
    from .validation import validate_agent_loop

    _refuse_blank_key(api_key)
    if local_debug and api_key:
        raise ServeError(
            "local_debug=True disables API key authentication; do not provide api_key in "
            "local debug mode."
        )
    if reload:
        raise ServeError(
            "reload=True needs the agent as an import target, not an object: run "
            "`osmosis serve path/to/agent.py:agent_loop --reload` instead"
        )
    if not (skip_register or local_debug):
        _warn_not_registered("skip_register=False is", "pass skip_register=True to silence this")
    console = Console()
    if validate:
        result = validate_agent_loop(agent_loop)
        if not result.valid or result.warnings:
            console.print(validation_report(result))
        result.raise_if_invalid()
    key = None if local_debug else (api_key or generate_api_key())
    trace_dir = None
    if debug_dir is not None:
        trace_dir = Path(debug_dir) / str(int(time.time()))
        trace_dir.mkdir(parents=True, exist_ok=True)
    resolved = _legacy_settings(
        settings,
        max_concurrent=None,
        record_ttl_seconds=None,
        api_key=key,
        debug_dir=trace_dir,
        host=host,
        port=port,
        log_level=log_level.lower(),
    )
    _print_banner(console, agent_loop.name, resolved, key, given=api_key is not None)
    # local_debug is the legacy explicit "no auth": serve() must not generate a key for it.
    serve(agent_loop, settings=resolved, no_auth=key is None)


def validate_and_report(agent_loop: RolloutAgentLoop, *, verbose: bool = False) -> Any:
    """Validate ``agent_loop`` (the legacy sync checks and ours) and print the report; the
    ``ValidationResult`` is returned. ``verbose`` is accepted: the report lists warnings
    always."""
    from rich.console import Console

    from ..render.validation import validation_report
    from .validation import validate_agent_loop

    result = validate_agent_loop(agent_loop)
    Console().print(validation_report(result))
    return result


def _print_banner(
    console: Any, name: str, settings: ServerSettings, key: str | None, *, given: bool
) -> None:
    from rich.markup import escape
    from rich.panel import Panel

    shown = "(disabled - local debug)" if key is None else "(provided)" if given else key
    lines = [
        f"Agent: {escape(name)}",
        f"Address: {settings.host}:{settings.port}",
        f"API Key: {shown}",
        "Registration: skipped (not part of osmosis-rollout)",
    ]
    if settings.debug_dir is not None:
        lines.append(f"Debug Log: {escape(str(settings.debug_dir))}/")
    console.print(Panel("\n".join(lines), title="RolloutServer", expand=False))
