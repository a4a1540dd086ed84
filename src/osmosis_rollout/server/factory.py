"""The app factory behind ``osmosis serve --reload``: uvicorn's reloader re-imports the agent
in a child process, so the target and settings travel through the environment."""

from __future__ import annotations

import os

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ..config import ServerSettings
from ..errors import OsmosisError
from ..loader import load_agent
from ..project import find_project
from .app import create_app

__all__ = ["SETTINGS_ENV", "TARGET_ENV", "app_from_environment"]

TARGET_ENV = "OSMOSIS_SERVE_TARGET"
SETTINGS_ENV = "OSMOSIS_SERVE_SETTINGS_JSON"


def app_from_environment() -> Starlette:
    """Build the app from ``OSMOSIS_SERVE_TARGET`` and ``OSMOSIS_SERVE_SETTINGS_JSON``."""
    settings = ServerSettings.model_validate_json(os.environ.get(SETTINGS_ENV, "{}"))
    project = find_project()
    if project is not None:
        project.put_root_on_path()  # as the parent did: module targets import from the root
    try:
        agent = load_agent(os.environ[TARGET_ENV])
    except OsmosisError as exc:
        return _unloadable(str(exc))
    return create_app(agent, settings=settings)


def _unloadable(reason: str) -> Starlette:
    """An edit broke the agent (a syntax error, a bad import): print the one line ``validate``
    prints instead of uvicorn's traceback, and answer 503 until a fixed file is saved, while
    the reloader keeps watching."""
    from rich.console import Console
    from rich.markup import escape

    err = Console(stderr=True, highlight=False)
    err.print(f"[bold red]Error:[/] {escape(reason)}", soft_wrap=True)
    err.print("[dim]Hint:[/] fix it and save: the server reloads (until then it answers 503)")
    body = {"detail": f"the agent failed to load: {reason}"}

    async def unavailable(request: Request) -> JSONResponse:
        return JSONResponse(body, status_code=503)

    methods = ["GET", "POST", "PUT", "DELETE", "PATCH"]
    return Starlette(routes=[Route("/{path:path}", unavailable, methods=methods)])
