"""The app the legacy ``create_app`` returns: our Starlette app with FastAPI's route decorators.

The legacy SDK returned a FastAPI app, and its guides add routes to it (``@app.get("/ready")``). The
same lines work on this app without FastAPI: ``get``/``post``/``put``/``patch``/``delete`` and
``api_route`` register a route whose function is called as FastAPI calls a simple one (path
and query parameters by name, a parameter typed ``Request`` gets the request; sync functions
run in a thread) and whose result becomes the response (a ``Response`` as is, anything else as
JSON). Dependencies, bodies parsed into models and OpenAPI pages are FastAPI's, not here.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

__all__ = ["LegacyApp", "as_legacy_app"]

Endpoint = Callable[..., Any]


class LegacyApp(Starlette):
    """A rollout server app (``app.state.rollout_server``) that also takes FastAPI-style
    routes; ``title`` is the legacy ``"Osmosis RolloutServer (<agent name>)"``."""

    title: str = "Osmosis RolloutServer"

    def api_route(
        self, path: str, methods: list[str] | None = None, **_: Any
    ) -> Callable[[Endpoint], Endpoint]:
        """``@app.api_route(path, methods=[...])``; FastAPI's other keywords are ignored."""

        def add(function: Endpoint) -> Endpoint:
            self.router.routes.append(
                Route(path, _endpoint(function), methods=methods or ["GET"], name=function.__name__)
            )
            return function

        return add

    def get(self, path: str, **options: Any) -> Callable[[Endpoint], Endpoint]:
        """``@app.get(path)``."""
        return self.api_route(path, ["GET"], **options)

    def post(self, path: str, **options: Any) -> Callable[[Endpoint], Endpoint]:
        """``@app.post(path)``."""
        return self.api_route(path, ["POST"], **options)

    def put(self, path: str, **options: Any) -> Callable[[Endpoint], Endpoint]:
        """``@app.put(path)``."""
        return self.api_route(path, ["PUT"], **options)

    def patch(self, path: str, **options: Any) -> Callable[[Endpoint], Endpoint]:
        """``@app.patch(path)``."""
        return self.api_route(path, ["PATCH"], **options)

    def delete(self, path: str, **options: Any) -> Callable[[Endpoint], Endpoint]:
        """``@app.delete(path)``."""
        return self.api_route(path, ["DELETE"], **options)


def as_legacy_app(app: Starlette, name: str) -> LegacyApp:
    """``app``'s routes, middleware (the request screening) and lifespan (the rollout
    server's) in a :class:`LegacyApp`: whichever entry point builds the app, it has the same
    defences as ``osmosis serve``'s."""
    server = app.state.rollout_server
    legacy = LegacyApp(
        routes=list(app.router.routes),
        middleware=list(app.user_middleware),
        lifespan=server.lifespan,
    )
    legacy.state.rollout_server = server
    legacy.title = f"Osmosis RolloutServer ({name})"
    return legacy


def _endpoint(function: Endpoint) -> Callable[[Request], Any]:
    parameters = inspect.signature(function).parameters
    is_async = inspect.iscoroutinefunction(function)

    async def endpoint(request: Request) -> Response:
        arguments: dict[str, Any] = {}
        for name, parameter in parameters.items():
            if parameter.annotation in (Request, "Request") or name == "request":
                arguments[name] = request
            elif name in request.path_params:
                arguments[name] = request.path_params[name]
            elif name in request.query_params:
                arguments[name] = request.query_params[name]
        if is_async:
            result = await function(**arguments)
        else:
            result = await run_in_threadpool(function, **arguments)
        return _response(result)

    return endpoint


def _response(result: Any) -> Response:
    if isinstance(result, Response):
        return result
    if isinstance(result, BaseModel):
        result = result.model_dump(mode="json")
    return Response(json.dumps(result, default=str), media_type="application/json")
