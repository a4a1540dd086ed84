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


def _strict_v2() -> Starlette:
    """A server like osmosis-ai 0.3.2's: its ``POST /rollout`` refuses a start without
    ``completion_callback_url`` with FastAPI's 422, which echoes the whole body as ``input``."""

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def start(request: Request) -> Response:
        body = json.loads(await request.body())
        if "completion_callback_url" in body:
            return JSONResponse({"detail": "no such rollout"}, status_code=404)
        error = {"type": "missing", "loc": ["body", "completion_callback_url"]}
        error |= {"msg": "Field required", "input": body}
        return JSONResponse({"detail": [error]}, status_code=422)

    async def anything(request: Request) -> Response:  # FastAPI's 404 is JSON
        return JSONResponse({"detail": "Not Found"}, status_code=404)

    routes = [Route("/health", health), Route("/rollout", start, methods=["POST"])]
    return Starlette(routes=[*routes, Route("/{path:path}", anything, methods=["GET", "POST"])])


class _Warned(_Said):
    def __init__(self) -> None:
        super().__init__()
        self.warnings: list[str] = []

    def warn(self, message: str) -> None:
        self.warnings.append(message)


async def test_a_start_on_the_wrong_wire_names_the_cause_and_the_flag(tmp_path: Path) -> None:
    said = _Warned()
    with serve_in_thread(_strict_v2()) as url:
        options = TestOptions(server=url, dataset=_rows(tmp_path), protocol="polling", timeout=5)
        report = await run_test(options, said)
    # warned before the first row: /health shows the callback wire
    assert len(said.warnings) == 1, said.warnings
    assert said.warnings[0].startswith("--protocol polling given, but /health shows the v2 wire")
    row = report.rows[0]
    assert row.status == "REFUSED"
    message: Any = row.error_message
    assert message.startswith("init refused with HTTP 422: completion_callback_url: Field required")
    assert "speaks another wire" in message
    assert "try --protocol v2" in message
    assert "initial_messages" not in message  # no echoed body
    assert "'input'" not in message
