"""The legacy SDK's entry points have the same defences as ``osmosis serve`` (issue 38, items 2
and 7): ``compat.create_app`` served the documented way (``uvicorn v1_agent:app``) screens
every request, a blank key is refused, and an app built for loopback with no key does not
answer requests that arrived at a network address."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anyio
import httpx2
import pytest
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

from osmosis_rollout.compat import create_app
from osmosis_rollout.errors import ConfigError
from osmosis_rollout.server import create_app as core_create_app

from .gates import RecordingGate
from .support import load_asset, serve_in_thread

Quick = load_asset("hrd_agents").Quick


@pytest.fixture
def internal() -> Iterator[tuple[RecordingGate, str]]:
    """A service on 127.0.0.1 a hostile page would like the server to call; records all."""

    async def anything(request: Any) -> Response:
        return Response("ok")

    recorder = RecordingGate(Starlette(routes=[Route("/{p:path}", anything, methods=["POST"])]))
    with serve_in_thread(recorder) as url:
        yield recorder, url


def _init(rollout_id: str, server_url: str) -> bytes:
    return json.dumps(
        {
            "rollout_id": rollout_id,
            "server_url": server_url,
            "api_key": "attacker",
            "messages": [{"role": "user", "content": "hi"}],
            "completion_params": {},
        }
    ).encode()


def test_a_web_pages_simple_post_to_a_compat_app_reaches_nothing(
    internal: tuple[RecordingGate, str],
) -> None:
    """The review's attack: a ``text/plain`` POST (no preflight) with the page's ``Origin``
    got 202 from ``compat.create_app`` and made the server call a loopback service; now each
    door is refused and the service gets no request."""
    recorder, internal_url = internal
    app = create_app(Quick())
    with serve_in_thread(app, lifespan="on") as url:
        page = httpx2.post(
            f"{url}/v1/rollout/init",
            content=_init("evil-1", f"{internal_url}/admin"),
            headers={"Content-Type": "text/plain", "Origin": "https://evil.example"},
            timeout=10,
        )
        plain = httpx2.post(
            f"{url}/v1/rollout/init",
            content=_init("evil-2", f"{internal_url}/admin"),
            headers={"Content-Type": "text/plain"},
            timeout=10,
        )
        rebound = httpx2.get(f"{url}/health", headers={"Host": "evil.example"}, timeout=10)
        cancel = httpx2.post(
            f"{url}/rollout/cancel",
            content=b'{"all": true}',
            headers={"Content-Type": "text/plain", "Origin": "https://evil.example"},
            timeout=10,
        )
    assert page.status_code == 403
    assert plain.status_code == 415
    assert rebound.status_code == 400
    assert cancel.status_code == 403
    assert recorder.calls == []


def test_compat_create_app_keeps_the_core_apps_middleware() -> None:
    """Whatever entry point builds the app, its middleware stack is the core app's."""
    core = core_create_app(Quick())
    compat = create_app(Quick())
    assert [m.cls for m in compat.user_middleware] == [m.cls for m in core.user_middleware]
    assert compat.user_middleware, "the core app screens requests"


@pytest.mark.parametrize("blank", ["", "   ", "\t\n"])
def test_a_blank_key_is_refused_by_compat_create_app(blank: str) -> None:
    """``api_key=""`` used to serve with no auth (the first review's blank-key bug, on the
    compat path): refused with the fix in the message, as ``osmosis serve`` refuses it."""
    with pytest.raises(ConfigError, match="blank"):
        create_app(Quick(), api_key=blank)


def _asgi_get(app: Any, server: tuple[str, int]) -> tuple[int, dict[str, Any]]:
    """One ``GET /health`` as it arrives at the listening address ``server``."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/health",
        "raw_path": b"/health",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", f"{server[0]}:{server[1]}".encode())],
        "client": ("203.0.113.9", 51000),
        "server": server,
    }
    anyio.run(app, scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], json.loads(body)


@pytest.mark.parametrize("build", [create_app, core_create_app], ids=["compat", "core"])
def test_a_keyless_loopback_app_refuses_requests_from_the_network(build: Any) -> None:
    """``uvicorn v1_agent:app --host 0.0.0.0`` serves an app built for loopback with no key:
    a request that arrived at a network address is refused (403, the fix named); one that
    arrived on loopback is served."""
    app = build(Quick())
    status, body = _asgi_get(app, ("192.0.2.10", 9000))
    assert status == 403
    assert "api_key" in body["detail"]
    assert "osmosis serve" in body["detail"]
    status, _ = _asgi_get(app, ("127.0.0.1", 9000))
    assert status != 403


def test_an_app_with_a_key_still_answers_the_network() -> None:
    """A key is the network's door: with one, a network arrival reaches the routes."""
    app = create_app(Quick(), api_key="a-real-key")
    status, _ = _asgi_get(app, ("192.0.2.10", 9000))
    assert status != 403
