"""The viewer's web app: a static page plus two JSON endpoints over a :class:`RolloutIndex`.

The page (``static/``: plain HTML, CSS and JavaScript, no build step, nothing from a CDN) asks
``/api/rollouts`` for the table and ``/api/rollouts/{id}`` for one rollout, read from disk then.
Every request and response passes ``guard.ViewGuard`` (the Host check, the CSP).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import anyio.to_thread
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from .guard import LOOPBACK_NAMES, ViewGuard
from .index import RolloutIndex

__all__ = ["STATIC_DIR", "create_view_app"]

STATIC_DIR = Path(__file__).parent / "static"


def _json(body: Any, status: int = 200) -> Response:
    return Response(
        json.dumps(body, default=str, allow_nan=False),
        status_code=status,
        media_type="application/json",
        headers={"Cache-Control": "no-store"},
    )


def create_view_app(index: RolloutIndex, *, hosts: Iterable[str] = LOOPBACK_NAMES) -> ASGIApp:
    """The app serving ``index``; bind it to 127.0.0.1 only (it reads local files). Requests
    naming another host than ``hosts`` are refused (DNS rebinding)."""

    async def page(request: Request) -> Response:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-store"})

    async def rollouts(request: Request) -> Response:
        return _json(
            {
                "sources": index.sources,
                "warnings": index.warnings,
                "rollouts": [r.public() for r in index.rollouts],
            }
        )

    async def rollout(request: Request) -> Response:
        summary = index.get(request.path_params["rollout"])
        if summary is None:
            return _json({"detail": "no such rollout in this index"}, 404)
        try:
            body = await anyio.to_thread.run_sync(index.load, summary)
        except (OSError, ValueError) as exc:
            return _json({"detail": f"cannot read this rollout: {exc}"}, 500)
        return _json(body)

    app = Starlette(
        routes=[
            Route("/", page),
            Route("/api/rollouts", rollouts),
            Route("/api/rollouts/{rollout}", rollout),
            Mount("/static", StaticFiles(directory=STATIC_DIR), name="static"),
        ]
    )
    return ViewGuard(app, hosts)
