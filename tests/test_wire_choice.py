"""Which wire ``osmosis test --server``/``--launch`` speaks when none is given, and the probes
that choose it: none may be one that a server we did not write logs as an error (the official
SDK's logs a ``GET /platform/health`` 404 and an empty ``POST /rollout`` 422). The servers
here are written with nothing but Starlette."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from osmosis_rollout.evaluation import TestOptions, run_test
from osmosis_rollout.evaluation.run import RunObserver
from osmosis_rollout.testing.harness import Harness

from .support import serve_in_thread

pytestmark = pytest.mark.anyio


def _foreign(seen: list[tuple[str, str, bytes]], *, rollout: bool = True) -> Starlette:
    """A server like osmosis-ai 0.3.2's: ``{"status": "ok"}`` on /health; ``POST /rollout``
    refused with 404 for a rollout id (enough for a row to end at once)."""

    async def health(request: Request) -> JSONResponse:
        seen.append((request.method, request.url.path, b""))
        return JSONResponse({"status": "ok"})

    async def start(request: Request) -> Response:
        seen.append((request.method, request.url.path, await request.body()))
        return JSONResponse({"detail": "no such rollout"}, status_code=404)

    async def anything(request: Request) -> Response:
        seen.append((request.method, request.url.path, await request.body()))
        return JSONResponse({"detail": "Not Found"}, status_code=404)

    routes = [Route("/health", health)]
    if rollout:
        routes.append(Route("/rollout", start, methods=["POST"]))
    routes.append(Route("/{path:path}", anything, methods=["GET", "POST"]))
    return Starlette(routes=routes)


class _Said(RunObserver):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, message: str) -> None:
        self.lines.append(message)


def _rows(tmp_path: Path) -> Path:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"user_prompt": "hi"}) + "\n")
    return rows


async def test_v2_start_probes_nothing_the_official_server_logs_as_an_error() -> None:
    seen: list[tuple[str, str, bytes]] = []
    with serve_in_thread(_foreign(seen)) as url:
        async with Harness(server_url=url, protocol="v2"):
            pass
    paths = [(method, path) for method, path, _ in seen]
    assert ("GET", "/platform/health") not in paths
    assert not [s for s in seen if s[:2] == ("POST", "/rollout")]  # no empty init
    assert ("GET", "/health") in paths


async def test_without_a_protocol_the_wire_is_asked_of_health_and_said(tmp_path: Path) -> None:
    seen: list[tuple[str, str, bytes]] = []
    said = _Said()
    with serve_in_thread(_foreign(seen)) as url:
        options = TestOptions(server=url, dataset=_rows(tmp_path), protocol=None, timeout=5)
        report = await run_test(options, said)
    assert any(line.startswith("protocol v2:") for line in said.lines), said.lines
    posts = [path for method, path, _ in seen if method == "POST"]
    assert posts == ["/rollout"]  # v2's start, not /v1/rollout/init
    assert report.rows[0].status == "REFUSED"


async def test_a_v1_init_answered_404_names_the_other_wires(tmp_path: Path) -> None:
    seen: list[tuple[str, str, bytes]] = []
    with serve_in_thread(_foreign(seen)) as url:
        options = TestOptions(server=url, dataset=_rows(tmp_path), protocol="v1", timeout=5)
        report = await run_test(options)
    message: Any = report.rows[0].error_message
    assert "HTTP 404" in message
    assert "--protocol v2" in message
    assert "--protocol polling" in message
