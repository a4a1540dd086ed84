"""Request screening (``server/screening.py``) and the destination check at init, on a real
``create_app`` under uvicorn on 127.0.0.1: what a web page in the user's browser can send to a
default server (no key, loopback) is refused, what TrainGate, curl and ``osmosis test --server``
send is served."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

from osmosis_rollout.config import ServerSettings
from osmosis_rollout.server import create_app

from .gates import CallbackGate, RecordingGate
from .support import load_asset, serve_in_thread

Quick = load_asset("hrd_agents").Quick


@contextlib.contextmanager
def served_app(**settings: Any) -> Iterator[str]:
    """``create_app`` with ``settings`` under uvicorn on 127.0.0.1; its URL."""
    app = create_app(Quick(), settings=ServerSettings(shutdown_grace_s=0, **settings))
    with serve_in_thread(app, lifespan="on") as url:
        yield url


@pytest.fixture
def server() -> Iterator[str]:
    """A default server: 127.0.0.1, no key."""
    with served_app() as url:
        yield url


@pytest.fixture
def internal() -> Iterator[tuple[RecordingGate, str]]:
    """A service on 127.0.0.1 a hostile page would like the server to call; records all."""

    async def anything(request: Any) -> Response:
        return Response("ok")

    inner = Starlette(routes=[Route("/{path:path}", anything, methods=["POST", "GET"])])
    recorder = RecordingGate(inner)
    with serve_in_thread(recorder) as url:
        yield recorder, url


def body(rollout_id: str, server_url: str, **extra: Any) -> dict[str, Any]:
    return {
        "rollout_id": rollout_id,
        "server_url": server_url,
        "messages": [{"role": "user", "content": "hi"}],
        "completion_params": {},
        **extra,
    }


def post(url: str, payload: Any, **headers: str) -> httpx2.Response:
    content = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return httpx2.post(f"{url}/v1/rollout/init", content=content, headers=headers, timeout=10)


def test_the_reviewed_attack_reaches_nothing(
    server: str, internal: tuple[RecordingGate, str]
) -> None:
    """The issue's shape: ``text/plain`` (no preflight), ``Origin: https://evil.example``, a
    ``server_url`` with a path, a query and a ``#``, an attacker's ``api_key``: refused, and
    the internal service gets no request at all, whichever of the doors is tried."""
    recorder, internal_url = internal
    target = f"{internal_url}/internal/admin/reset?confirm=yes#"
    hostile = body("evil-1", target, api_key="attacker", completion_params={"action": "reset"})
    as_page = post(
        server, hostile, **{"Content-Type": "text/plain", "Origin": "https://evil.example"}
    )
    as_form = post(server, hostile, **{"Content-Type": "application/x-www-form-urlencoded"})
    with_origin = post(
        server, hostile, **{"Content-Type": "application/json", "Origin": "https://evil.example"}
    )
    as_json = post(server, hostile, **{"Content-Type": "application/json"})
    time.sleep(0.3)

    assert as_page.status_code == 403
    assert "--allow-origin" in as_page.json()["detail"]
    assert as_form.status_code == 415
    assert as_form.json() == {
        "detail": "the body must be JSON: send Content-Type: application/json"
    }
    assert with_origin.status_code == 403
    assert as_json.status_code == 422
    locations = [item["loc"] for item in as_json.json()["detail"]]
    assert ["body", "server_url"] in locations
    assert ["body", "completion_params"] in locations
    assert recorder.calls == []


@pytest.mark.parametrize(
    "content_type", ["text/plain", "multipart/form-data; boundary=x", "application/jsonx", ""]
)
def test_a_body_that_is_not_declared_json_is_415(server: str, content_type: str) -> None:
    """Every content type a page may send without a CORS preflight is refused, before the
    body is read."""
    headers = {"Content-Type": content_type} if content_type else {}
    response = post(server, body("r-1", "http://tg.test"), **headers)

    assert response.status_code == 415
    assert "application/json" in response.json()["detail"]


def test_json_with_parameters_and_a_bodyless_post_pass_the_content_check(server: str) -> None:
    """``application/json; charset=utf-8`` is JSON; a POST without a body has nothing to
    declare (it gets the 422 of an empty body, not a 415)."""
    gate = CallbackGate()
    with serve_in_thread(gate.app()) as gate_url:
        typed = post(
            server,
            body("r-typed", gate_url),
            **{"Content-Type": "Application/JSON; charset=utf-8"},
        )
    empty = httpx2.post(f"{server}/v1/rollout/init", timeout=10)

    assert typed.status_code == 202
    assert empty.status_code == 422


@pytest.mark.parametrize("path", ["/health", "/metrics", "/v1/rollout/init"])
def test_any_route_asked_from_a_web_page_is_403(server: str, path: str) -> None:
    """A page may not read counts or metrics either: the check is the app's, not a route's."""
    response = httpx2.request(
        "POST" if path.endswith("init") else "GET",
        f"{server}{path}",
        headers={"Origin": "http://127.0.0.1:8080"},
        timeout=10,
    )

    assert response.status_code == 403


def test_an_allowed_origin_is_served() -> None:
    """``--allow-origin`` (here the setting) lets one page in, and only that one."""
    with served_app(allow_origin=("https://ui.example",)) as url:
        allowed = httpx2.get(f"{url}/health", headers={"Origin": "https://UI.example/"})
        other = httpx2.get(f"{url}/health", headers={"Origin": "https://evil.example"})

        assert allowed.status_code == 200
        assert other.status_code == 403


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:9000", "127.0.0.1.nip.io", "10.0.0.1"]
)
def test_a_host_that_is_not_the_servers_own_is_refused(server: str, host: str) -> None:
    """DNS rebinding: a page that points its own name at 127.0.0.1 still sends that name."""
    response = httpx2.get(f"{server}/health", headers={"Host": host}, timeout=10)

    assert response.status_code == 400
    assert "--allow-host" in response.json()["detail"]


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "LOCALHOST.", "[::1]", "a.localhost"])
def test_the_loopback_names_are_the_servers_own(server: str, host: str) -> None:
    """curl, the harness and ``osmosis test --server`` name the server as 127.0.0.1 or
    localhost (with any port)."""
    response = httpx2.get(f"{server}/health", headers={"Host": f"{host}:1234"}, timeout=10)

    assert response.status_code == 200


def test_a_configured_host_name_is_served() -> None:
    """``--allow-host`` adds names (a reverse proxy's, a service name)."""
    with served_app(allow_host=("rollouts.internal",)) as url:
        named = httpx2.get(f"{url}/health", headers={"Host": "rollouts.internal:9000"})
        other = httpx2.get(f"{url}/health", headers={"Host": "evil.example"})

        assert named.status_code == 200
        assert other.status_code == 400


def test_without_the_key_the_answer_is_401_whatever_the_content_type() -> None:
    """Authentication still comes first: a caller without the key learns nothing of the
    body's format (a 401, not a 415)."""
    with served_app(api_key="k" * 20) as url:
        wrong = post(url, b"x", **{"Content-Type": "text/plain"})
        right = post(url, b"x", **{"Content-Type": "text/plain", "Authorization": "k" * 20})

        assert wrong.status_code == 401
        assert right.status_code == 415


@pytest.mark.parametrize(
    ("server_url", "message"),
    [
        ("http://169.254.169.254", "link-local"),
        ("http://metadata.google.internal/computeMetadata/v1", "cloud metadata"),
        ("http://[::ffff:169.254.169.254]:80", "link-local"),
        ("http://2130706433:9000", "not written as one"),
        ("http://0x7f.0.0.1:9000", "not written as one"),
        ("http://127.1:9000", "not written as one"),
        ("http://u:p@tg.test", "user name or password"),
    ],
)
def test_an_init_naming_a_forbidden_destination_is_a_422_saying_why(
    server: str, server_url: str, message: str
) -> None:
    """Checked at init, before anything starts: the reason is in the 422."""
    response = post(server, body("r-dest", server_url), **{"Content-Type": "application/json"})

    assert response.status_code == 422
    [item] = response.json()["detail"]
    assert item["loc"] == ["body", "server_url"]
    assert message in item["msg"]


def test_a_public_server_refuses_to_call_this_machine() -> None:
    """On a server bound elsewhere than loopback, ``[::ffff:127.0.0.1]`` and ``localhost`` name
    this machine's services: refused unless ``--traingate`` lists them. (Bound to 127.0.0.1
    here; the setting says what the bound host would be, as ``--host`` does.)"""
    app = create_app(Quick(), settings=ServerSettings(host="10.9.9.9", shutdown_grace_s=0))
    with serve_in_thread(app, lifespan="on") as url:
        headers = {"Content-Type": "application/json", "Host": "10.9.9.9"}
        mapped = post(url, body("r-m", "http://[::ffff:127.0.0.1]:9"), **headers)
        named = post(url, body("r-n", "http://localhost:9"), **headers)

    assert mapped.status_code == 422
    assert "loopback" in mapped.json()["detail"][0]["msg"]
    assert named.status_code == 422


def test_the_traingate_allow_list_refuses_other_hosts_at_init() -> None:
    """With ``--traingate`` only the listed hosts are accepted as ``server_url``."""
    with served_app(traingate=("tg.internal:8000",)) as url:
        headers = {"Content-Type": "application/json"}
        other = post(url, body("r-o", "http://elsewhere.example:8000"), **headers)

        assert other.status_code == 422
        assert "allow-list" in other.json()["detail"][0]["msg"]
