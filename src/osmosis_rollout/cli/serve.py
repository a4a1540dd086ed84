"""``osmosis serve``: import an agent, validate it, and serve it to TrainGate."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from . import app
from ._common import EXIT_PROBLEMS, fail, run_async, stderr_console
from ._target import TARGET_HELP, agent_target

if TYPE_CHECKING:
    from ..config import ServerSettings


def resolve_target(target: str | None, module: str | None) -> str:
    """TARGET, or ``-m``, or ``agent`` from ``[tool.osmosis]``; exactly one source."""
    if target and module:
        fail("give the agent either as TARGET or with -m/--module, not both")
    return agent_target(
        target or module, command="serve", example="osmosis serve path/to/agent.py:MyAgent"
    )


#: The flag that sets each setting, so that a bad value's error names it.
_FLAGS = {
    "host": "--host",
    "port": "--port",
    "api_key": "--api-key",
    "max_concurrent": "--max-concurrent",
    "max_queued": "--max-queued",
    "record_ttl_s": "--record-ttl",
    "rollout_timeout_s": "--rollout-timeout",
    "shutdown_grace_s": "--shutdown-grace",
    "debug_dir": "--debug-dir",
    "outbox_dir": "--outbox-dir",
    "log_level": "--log-level",
    "metrics": "--no-metrics",
    "state": "--state",
    "lease_ttl_s": "--lease-ttl",
    "workers": "--workers",
    "traingate": "--traingate",
    "allow_origin": "--allow-origin",
    "allow_host": "--allow-host",
}


def decide_auth(
    settings: ServerSettings, *, no_auth: bool, new_key: Callable[[], str] | None = None
) -> tuple[ServerSettings, bool]:
    """The server key to use and whether it was generated: ``server.auth.decide_auth``."""
    from ..server.auth import decide_auth as decide

    return decide(settings, no_auth=no_auth, new_key=new_key)


@app.command("serve")
def serve_command(
    target: Annotated[
        str | None, typer.Argument(help=TARGET_HELP, metavar="TARGET", show_default=False)
    ] = None,
    module: Annotated[
        str | None, typer.Option("--module", "-m", help="The agent as pkg.module:Attr.")
    ] = None,
    host: Annotated[
        str | None,
        typer.Option(help="Interface to bind. \\[default: 127.0.0.1]", show_default=False),
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="Port to bind (0 = any free port). \\[default: 9000]")
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            help="Key TrainGate must send (Bearer). Also read from OSMOSIS_API_KEY.",
            show_default=False,
        ),
    ] = None,
    no_auth: Annotated[
        bool,
        typer.Option(
            "--no-auth",
            help="Serve without a key, even on a public interface (a controller that sends "
            "none, as the platform's): there, the first accepted init's hosts are pinned "
            "unless --traingate names them, and cancels go by ids only.",
        ),
    ] = False,
    traingate: Annotated[
        list[str] | None,
        typer.Option(
            "--traingate",
            help="A TrainGate host inits may name, HOST[:PORT] (repeat for more; also "
            "OSMOSIS_TRAINGATE). Without one, see docs/security.md for the default rule.",
            show_default=False,
        ),
    ] = None,
    allow_origin: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-origin",
            help="A web page origin whose requests are served (repeat; * for any). "
            "Requests from other pages get 403.",
            show_default=False,
        ),
    ] = None,
    allow_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-host",
            help="A host name requests may name besides the server's own (repeat; * for any).",
            show_default=False,
        ),
    ] = None,
    max_concurrent: Annotated[
        int | None,
        typer.Option(help="Rollouts run at once; more wait in a queue. \\[default: 100]"),
    ] = None,
    rollout_timeout: Annotated[
        float | None,
        typer.Option(help="Seconds before a rollout ends with ERROR/timeout. \\[default: 3600]"),
    ] = None,
    max_queued: Annotated[
        int | None,
        typer.Option(
            help="Rollouts accepted but waiting for a slot (cluster-wide with Redis); "
            "beyond it inits get 503. \\[default: 10000]"
        ),
    ] = None,
    record_ttl: Annotated[
        float | None,
        typer.Option(
            help="Seconds a finished rollout's record is kept, so a retried init gets the "
            "same answer. \\[default: 3600]"
        ),
    ] = None,
    debug_dir: Annotated[
        Path | None, typer.Option(help="Write per-rollout JSONL traces here.")
    ] = None,
    outbox_dir: Annotated[
        Path | None,
        typer.Option(help="Keep undeliverable callbacks here. \\[default: .osmosis/outbox]"),
    ] = None,
    shutdown_grace: Annotated[
        float | None,
        typer.Option(
            help="Seconds running rollouts get to finish on SIGTERM before they are cancelled. "
            "\\[default: 30]"
        ),
    ] = None,
    no_validate: Annotated[
        bool, typer.Option("--no-validate", help="Skip the agent checks at start.")
    ] = False,
    no_metrics: Annotated[
        bool,
        typer.Option(
            "--no-metrics", help="Do not serve GET /metrics (Prometheus; behind the key)."
        ),
    ] = False,
    reload: Annotated[
        bool, typer.Option("--reload", help="Restart when the agent's files change (development).")
    ] = False,
    log_level: Annotated[
        str | None, typer.Option(help="critical, error, warning, info or debug. \\[default: info]")
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            help="Server processes sharing the port (use with a Redis --state). \\[default: 1]"
        ),
    ] = None,
    state: Annotated[
        str | None,
        typer.Option(
            help="Where rollout state lives: memory, or redis://host:port/db shared by "
            "workers and replicas. \\[default: memory]",
            show_default=False,
        ),
    ] = None,
    lease_ttl: Annotated[
        float | None,
        typer.Option(
            help="With Redis: at most this many seconds after a replica dies, a peer sends "
            "each of its rollouts' ERROR callback. \\[default: 30]"
        ),
    ] = None,
) -> None:
    """Serve an agent over the remote rollout protocol until Ctrl-C or SIGTERM.

    Settings come from the flags, then OSMOSIS_* environment variables, then \\[tool.osmosis] /
    \\[tool.osmosis.serve] in pyproject.toml. On SIGTERM the server drains: new inits get 503,
    running rollouts get the grace period, the rest end with an ERROR/cancelled callback.
    """
    from rich.markup import escape

    from ..config import ServerSettings, find_pyproject
    from ..errors import OsmosisError
    from ..launch_contract import launch_settings, port_conflict

    err = stderr_console()
    pyproject = find_pyproject(Path.cwd())
    chosen = resolve_target(target, module)
    cli: dict[str, Any] = {
        "host": host,
        "port": port,
        "api_key": api_key,
        "max_concurrent": max_concurrent,
        "rollout_timeout_s": rollout_timeout,
        "max_queued": max_queued,
        "record_ttl_s": record_ttl,
        "shutdown_grace_s": shutdown_grace,
        "debug_dir": debug_dir,
        "outbox_dir": outbox_dir,
        "log_level": log_level.lower() if log_level else None,
        "metrics": False if no_metrics else None,
        "workers": workers,
        "state": state,
        "lease_ttl_s": lease_ttl,
        "traingate": traingate or None,
        "allow_origin": allow_origin or None,
        "allow_host": allow_host or None,
    }
    try:
        settings = ServerSettings.resolve(
            cli,
            environ=os.environ,
            pyproject=pyproject,
            flags=_FLAGS,
            fallback={**_legacy_settings(err), **launch_settings(os.environ)},
        )
        conflict = port_conflict(settings.port, os.environ)
        if conflict is not None:
            err.print(f"[yellow]warning[/] {escape(conflict)}", soft_wrap=True)
        settings, generated = decide_auth(settings, no_auth=no_auth)
        if reload and settings.workers > 1:
            fail("--reload runs one process: drop --workers (or the workers setting) to use it")
        state_answers = True
        if settings.state != "memory":
            # A missing extra or a bad URL fails here, once; an unreachable store is only said.
            state_answers = run_async(_state_answers(settings.state))
        agent = _load_and_check(chosen, validate=not no_validate)
        from ..server import bind_socket, serve

        sock = bind_socket(settings.host, settings.port)
        settings = settings.model_copy(update={"port": sock.getsockname()[1]})
        if reload:
            # uvicorn's reloader binds the port itself: free it, but only after a busy port has
            # failed here with one clear line and --port 0 has become a real port.
            sock.close()
            _print_banner(err, chosen, agent.name, settings, generated, state_answers)
            _serve_with_reload(chosen, settings)
            return
        _print_banner(err, chosen, agent.name, settings, generated, state_answers)
        serve(agent, settings=settings, sock=sock, no_auth=no_auth)
    except OsmosisError as exc:
        fail(str(exc))


def _legacy_settings(err: Any) -> dict[str, Any]:
    """The original SDK's ``OSMOSIS_ROLLOUT_*`` settings (and ``.env``): each one set is said,
    honoured or not."""
    from rich.markup import escape

    from ..compat.settings import legacy_settings, unsaid

    found = legacy_settings(os.environ)
    for line in found.honoured:
        err.print(f"[dim]note: {escape(line)}[/]", soft_wrap=True)
    for line in unsaid(found.ignored):
        err.print(f"[yellow]warning[/] {escape(line)}", soft_wrap=True)
    return found.values


def _load_and_check(target: str, *, validate: bool) -> Any:
    from ..loader import load_agent

    agent = load_agent(target)
    if validate:
        _validate_or_exit(agent)  # the loaded agent: its module's code must not run twice
    return agent


def _validate_or_exit(target: Any) -> None:
    from ..validator import validate_agent_loop_async

    result = run_async(validate_agent_loop_async(target, dry_run=False))
    from rich.markup import escape

    err = stderr_console()
    for problem in result.warnings:
        # What `osmosis validate` would warn about (a blocking call in run, a run that can
        # return nothing): serving anyway is allowed, serving silently is not.
        where = escape(problem.location or "")
        err.print(f"[yellow]warning[/] {problem.code} {where} {escape(problem.message)}")
    if not result.valid:
        err.print("[bold red]The agent did not pass validation:[/]")
        for problem in result.errors:
            where = escape(problem.location or "")
            # Messages quote user code and exceptions: "[config]" must print, not vanish as markup.
            err.print(f"  [red]{problem.code}[/] {where} {escape(problem.message)}")
        err.print("Run [bold]osmosis validate[/] for the full report, or pass --no-validate.")
        raise typer.Exit(EXIT_PROBLEMS)


async def _state_answers(url: str) -> bool:
    from ..server.state import open_state

    state = open_state(url, outbox_dir=Path("."))
    try:
        return await state.ping()
    finally:
        await state.close()  # the workers open their own connections


def _print_banner(
    err: Any, target: str, name: str, settings: Any, generated: bool, state_answers: bool = True
) -> None:
    from rich.markup import escape

    err.print(f"[bold]osmosis serve[/]  agent [cyan]{escape(name)}[/] from {escape(target)}")
    err.print(f"  listening on  http://{settings.host}:{settings.port}")
    from ..server.serve import http_stack

    loop, http = http_stack()
    fallback = "" if (loop, http) == ("uvloop", "httptools") else " (pure-Python fallback)"
    err.print(f"  http          uvicorn on {loop} + {http}{fallback}")
    from ..server.pinning import is_open

    if is_open(settings):
        err.print(
            "  auth          [yellow]off[/] on a public interface (--no-auth): anyone who "
            "reaches the port may start rollouts; cancels by ids only"
        )
    elif settings.api_key is None:
        err.print("  auth          [yellow]off[/] (no server key)")
    elif generated:
        err.print("  auth          on; generated key (shown once, pass it to TrainGate):")
        err.print(f"                [bold]{settings.api_key.get_secret_value()}[/]")
    else:
        err.print("  auth          on (Bearer key required)")
    err.print(f"  traingate     {escape(_destinations_line(settings))}")
    if settings.server_name or settings.instance_id or settings.artifact_root:
        # Started by the platform (or its local runner): say what it told us.
        parts = [f"rollout {settings.server_name}" if settings.server_name else None]
        parts.append(f"instance {settings.instance_id}" if settings.instance_id else None)
        parts.append(f"artifacts {settings.artifact_root}" if settings.artifact_root else None)
        err.print(f"  platform      {escape(', '.join(p for p in parts if p))}")
    traces = settings.debug_dir or "off (use --debug-dir)"
    err.print(f"  debug traces  {traces}")
    err.print(f"  outbox        {settings.outbox_dir or '.osmosis/outbox'}")
    err.print(f"  metrics       {'GET /metrics' if settings.metrics else 'off'}")
    err.print(
        f"  limits        {settings.max_concurrent} concurrent, "
        f"{settings.rollout_timeout_s:g} s per rollout"
    )
    if settings.state == "memory":
        err.print("  state         memory (this process)")
    else:
        from ..server.state.redis_connection import redact_url

        err.print(
            f"  state         {escape(redact_url(settings.state))} "
            f"(shared; leases {settings.lease_ttl_s:g} s)"
        )
        if not state_answers:
            err.print(
                "  [yellow]warning[/]       the state store does not answer now: inits get 503 "
                "and /health says degraded until it does"
            )
    if settings.workers > 1:
        err.print(f"  workers       {settings.workers} processes")
        if settings.state == "memory":
            err.print(
                "  [yellow]warning[/]       with --state memory each worker keeps its own "
                "idempotency records and queue: a retried init that reaches another worker "
                "starts a second rollout. Use --state redis://... for exact guarantees."
            )


def _destinations_line(settings: Any) -> str:
    """Where inits may send the server's calls: the allow-list, or the default rule."""
    if settings.traingate:
        return f"{', '.join(settings.traingate)} only (--traingate)"
    from ..server.pinning import is_open

    if is_open(settings):
        return (
            "the hosts of the first accepted init only (pinned: no key, no --traingate), "
            "never link-local, cloud metadata or loopback"
        )
    from ..server.auth import is_loopback

    here = "" if is_loopback(settings.host) else ", loopback"
    return f"any host but link-local, cloud metadata{here} (set --traingate to narrow)"


def _serve_with_reload(target: str, settings: Any) -> None:
    import uvicorn

    from ..loader import parse_target
    from ..redaction import REVEAL_SECRETS
    from ..server.factory import SETTINGS_ENV, TARGET_ENV

    os.environ[TARGET_ENV] = target
    os.environ[SETTINGS_ENV] = settings.model_dump_json(
        context={REVEAL_SECRETS: True}, exclude_none=True
    )
    location, _ = parse_target(target)
    watch = Path(location).resolve().parent if location.endswith(".py") else Path.cwd()
    uvicorn.run(
        "osmosis_rollout.server.factory:app_from_environment",
        factory=True,
        reload=True,
        reload_dirs=[str(watch)],
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
    )
