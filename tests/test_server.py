"""The rollout server in-process: ``create_app`` through ``httpx2.ASGITransport``.

TrainGate is a ``MockTrainGate`` behind a ``RecordingGate`` (``serving`` in tests/serving.py) that
keeps every raw request and can answer chosen calls with a fault first. Every test checks the
one-callback rule at the gate.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import anyio
import anyio.lowlevel
import httpx2
import pytest
from starlette.responses import JSONResponse

from osmosis_rollout import RolloutAgentLoop
from osmosis_rollout.client import RetryPolicy, TrainGateClient
from osmosis_rollout.redaction import REDACTED
from osmosis_rollout.server import RolloutServer, create_app
from osmosis_rollout.testing import MockTrainGate, ScriptedBackend

from .gates import ANSWER, CHAT, COMPLETED
from .leaks import NASTY_KEY, every_form_absent, written_text
from .serving import SERVER_KEY, TG_KEY, init_body, serving
from .support import free_port, load_asset, serve_in_thread

pytestmark = pytest.mark.anyio

EMPTY_PARAMETERS = {"type": "object", "properties": {}}
#: The roles of a finished two-turn tool rollout's final messages.
TOOL_TURN_ROLES = ["user", "assistant", "tool", "assistant"]

agents = load_asset("srv_agents")
rev = load_asset("rev_agents")
hrd = load_asset("hrd_agents")


# --------------------------------------------------------------------------------------------
# The happy path, in-process
# --------------------------------------------------------------------------------------------


async def test_tool_rollout_returns_tools_and_sends_one_complete_callback(tmp_path: Path) -> None:
    """A two-turn tool rollout gets 202 with the full tool schemas and one COMPLETED callback."""
    async with serving(agents.ToolAgent(), tmp_path) as s:
        response = await s.init(init_body())
        await s.settle()

    assert response.status_code == 202
    body = response.json()
    assert body["rollout_id"] == "r-1"
    assert body["tools"] == [
        agents.ADD_TOOL,  # the full JSON Schema, nested keywords and `"default": null` kept
        {"type": "function", "function": {"name": "note", "parameters": EMPTY_PARAMETERS}},
    ]
    [result] = s.completions("r-1")
    assert result.status == "COMPLETED"
    assert result.reward == 1.0
    assert [m["role"] for m in result.final_messages] == TOOL_TURN_ROLES
    assert s.gate.findings == []
    assert not (tmp_path / "outbox").exists()


# --------------------------------------------------------------------------------------------
# Faults: each ends in exactly one callback and loses nothing
# --------------------------------------------------------------------------------------------


async def test_callback_500_then_200_is_retried_and_delivered_once(tmp_path: Path) -> None:
    """A 500 on the callback is retried with the same body; the gate accepts exactly one."""
    async with serving(agents.ToolAgent(), tmp_path) as s:
        s.raw.fail_next(COMPLETED, 500)
        await s.init(init_body())
        await s.settle()

    first, second = s.raw.calls_to(COMPLETED)
    assert first.body == second.body
    assert first.headers["x-request-id"] == second.headers["x-request-id"] == "r-1:completed"
    assert len(s.completions("r-1")) == 1
    assert s.completions("r-1")[0].status == "COMPLETED"
    assert len(s.sleeps.delays) == 1
    assert not (tmp_path / "outbox").exists()


async def test_chat_429_honours_retry_after_and_keeps_the_request_id(tmp_path: Path) -> None:
    """A 429 with Retry-After on a chat turn waits that long, retries the same turn, completes."""
    async with serving(agents.ToolAgent(), tmp_path) as s:
        s.raw.fail_next(CHAT, 429, {"Retry-After": "2"})
        await s.init(init_body())
        await s.settle()

    chats = s.raw.calls_to(CHAT)
    assert [c.headers["x-request-id"] for c in chats] == ["r-1:1", "r-1:1", "r-1:2"]
    assert chats[0].body == chats[1].body
    assert s.sleeps.delays == [2.0]
    [result] = s.completions("r-1")
    assert result.status == "COMPLETED"
    assert result.metrics is not None
    assert result.metrics.num_llm_calls == 2


async def test_refused_callback_lands_in_the_outbox_without_the_api_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Connection refused on every callback attempt: the full response goes to the outbox."""
    url = f"http://127.0.0.1:{free_port()}"
    async with serving(agents.ToolAgent(), tmp_path, refuse_callbacks=True) as s:
        s.gate.expect("r-1", api_key=TG_KEY)
        response = await s.init(init_body(server_url=url))
        await s.settle()
        health = (await s.health()).json()

    assert response.status_code == 202
    assert len(s.sleeps.delays) == 3  # the protocol's three retries, then give up
    assert s.completions("r-1") == []
    files = list((tmp_path / "outbox").iterdir())
    assert len(files) == 1
    assert re.fullmatch(r"r-1\.\d{8}T\d{6}\.[0-9a-f]{6}\.json", files[0].name)
    text = files[0].read_text(encoding="utf-8")
    assert TG_KEY not in text
    record = json.loads(text)
    assert record["server_url"] == url
    assert "could not reach" in record["error"]
    saved = record["response"]
    assert saved["rollout_id"] == "r-1"
    assert saved["status"] == "COMPLETED"
    assert saved["reward"] == 1.0
    assert [m["role"] for m in saved["final_messages"]] == TOOL_TURN_ROLES
    assert saved["metrics"]["num_llm_calls"] == 2
    assert saved["metrics"]["num_tool_calls"] == 1
    assert health["completed_rollouts"] == 1
    assert files[0].name in caplog.text
    assert TG_KEY not in caplog.text


async def test_raising_agent_sends_error_with_the_partial_conversation(tmp_path: Path) -> None:
    """An agent that raises mid-rollout ends in one ERROR callback holding the turns so far."""
    async with serving(agents.ToolAgent(), tmp_path) as s:
        await s.init(init_body(metadata={"raise_after_tools": True}))
        await s.settle()

    [result] = s.completions("r-1")
    assert result.status == "ERROR"
    assert result.finish_reason == "error"
    assert result.error_message == "agent raised RuntimeError: the calculator broke"
    assert [m["role"] for m in result.final_messages] == ["user", "assistant"]
    assert result.final_messages[1]["tool_calls"][0]["function"]["name"] == "add"


async def test_hanging_agent_times_out_at_its_deadline(tmp_path: Path) -> None:
    """An agent that hangs gets one ERROR/timeout callback once ``rollout_timeout_s`` passes."""
    async with serving(agents.ToolAgent(), tmp_path, rollout_timeout_s=0.3) as s:
        started = anyio.current_time()
        await s.init(init_body(metadata={"hang_after_tools": True}))
        await s.settle()
        elapsed = anyio.current_time() - started

    [result] = s.completions("r-1")
    assert result.status == "ERROR"
    assert result.finish_reason == "timeout"
    assert result.error_message == "rollout exceeded its deadline of 0.3 s"
    assert [m["role"] for m in result.final_messages] == ["user", "assistant"]
    assert 0.3 <= elapsed < 3


async def test_non_ascii_rollout_id_runs_with_an_encoded_request_id(tmp_path: Path) -> None:
    """A non-ASCII rollout_id (allowed) completes; X-Request-Id is percent-encoded ASCII."""
    async with serving(agents.ToolAgent(), tmp_path) as s:
        response = await s.init(init_body("résumé-1"))
        await s.settle()
        health = (await s.health()).json()

    assert response.status_code == 202
    [result] = s.completions("résumé-1")
    assert result.status == "COMPLETED"
    ids = [c.headers["x-request-id"] for c in s.raw.calls_to(CHAT)]
    assert ids == ["r%C3%A9sum%C3%A9-1:1", "r%C3%A9sum%C3%A9-1:2"]
    assert unquote(ids[0]) == "résumé-1:1"
    assert health["status"] == "healthy"


async def test_non_json_message_ends_in_one_error_callback(tmp_path: Path) -> None:
    """An agent that puts a non-JSON object in a message gets ERROR, not a dead server."""
    async with serving(rev.OpaqueMessageAgent(), tmp_path) as s:
        await s.init(init_body())
        await s.init(init_body("r-2"))
        await s.settle()
        health = (await s.health()).json()

    for rid in ("r-1", "r-2"):
        [result] = s.completions(rid)
        assert result.status == "ERROR"
        assert "Opaque" in (result.error_message or "")
    assert health["status"] == "healthy"
    assert health["completed_rollouts"] == 2


async def test_non_json_final_messages_are_sent_as_text(tmp_path: Path) -> None:
    """A result with a non-JSON object becomes ERROR with that value kept as text."""
    async with serving(rev.OpaqueResultAgent(), tmp_path, replies=[{"content": "hi"}]) as s:
        await s.init(init_body())
        await s.settle()

    [result] = s.completions("r-1")
    assert result.status == "ERROR"
    assert "cannot be sent" in (result.error_message or "")
    assert result.final_messages[-1]["content"] == "<Opaque>"


async def test_drain_lets_rollouts_finish_within_the_grace_period(tmp_path: Path) -> None:
    """While draining, /health says 503 draining and inits get 503; finished work completes."""
    agent = agents.Gated()
    async with serving(agent, tmp_path, shutdown_grace_s=30) as s:
        await s.init(init_body("a"))
        await s.init(init_body("b"))
        await agent.started.wait()
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(s.server.drain)
            while not s.server.registry.draining:
                await anyio.lowlevel.checkpoint()
            health = await s.health()
            refused = await s.init(init_body("c"))
            agent.release.set()
        assert s.server.registry.unfinished() == []

    assert health.status_code == 503
    assert health.json()["status"] == "draining"
    assert health.json()["active_rollouts"] == 2
    assert refused.status_code == 503
    assert refused.headers["retry-after"]
    assert [s.completions(r)[0].status for r in ("a", "b")] == ["COMPLETED", "COMPLETED"]
    assert [len(s.completions(r)) for r in ("a", "b")] == [1, 1]
    assert len(s.raw.calls_to(COMPLETED)) == 2
    assert "c" not in agent.runs


async def test_drain_cancels_what_outlives_the_grace_period(tmp_path: Path) -> None:
    """Rollouts still running after the grace period end with one ERROR/cancelled each."""
    agent = agents.Gated()
    async with serving(agent, tmp_path, max_concurrent=1, shutdown_grace_s=0.2) as s:
        await s.init(init_body("running"))
        await s.init(init_body("queued"))
        await agent.started.wait()
        started = anyio.current_time()
        with anyio.fail_after(5):
            await s.server.drain()
        elapsed = anyio.current_time() - started

    assert elapsed >= 0.2
    for rid in ("running", "queued"):
        [result] = s.completions(rid)
        assert result.status == "ERROR"
        assert result.finish_reason == "cancelled"
        assert result.final_messages == [{"role": "user", "content": "What is 3 + 4?"}]
    assert agent.runs == ["running"]  # the queued one never reached the agent


class _Stubborn(RolloutAgentLoop):
    """Finishes its work whatever happens (a shielded wait): it outlives the whole drain."""

    name = "stubborn"

    def __init__(self) -> None:
        self.started = anyio.Event()

    def get_tools(self, request: Any) -> list[Any]:
        return []

    async def run(self, ctx: Any) -> Any:
        self.started.set()
        with anyio.CancelScope(shield=True):  # past the drain's last 1 s wait for deliveries
            await anyio.sleep(1.3)
        return ctx.complete([{"role": "assistant", "content": "done anyway"}])


async def test_rollouts_left_after_the_drain_are_stopped_and_kept(tmp_path: Path) -> None:
    """At shutdown, the rollout still queued behind one that outlived the drain is stopped and
    its result kept in the outbox; the one that outlived it still ends in exactly one callback
    or outbox entry."""
    agent = _Stubborn()
    async with serving(agent, tmp_path, max_concurrent=1) as s:
        s.server.delivery_grace_s = 0.05
        await s.init(init_body("running"))
        await s.init(init_body("queued"))
        await agent.started.wait()

    saved = [json.loads(f.read_text()) for f in (tmp_path / "outbox").iterdir()]
    kept = {record["response"]["rollout_id"]: record for record in saved}
    assert len(kept) == len(saved)  # one entry per rollout at most
    assert s.completions("queued") == []
    assert kept["queued"]["response"]["finish_reason"] == "cancelled"
    assert kept["queued"]["error"] == "server stopped before the rollout ran"
    ran = [r.status for r in s.completions("running")]
    if "running" in kept:
        ran.append(kept["running"]["response"]["status"])
    assert ran == ["COMPLETED"]
    assert s.server.registry.unfinished() == []


async def test_drain_is_bounded_when_traingate_never_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the grace period, a callback stuck on a dead TrainGate goes to the outbox."""
    from osmosis_rollout.server import app as server_app

    monkeypatch.setattr(server_app, "_DELIVERY_GRACE_S", 0.2)
    stuck = anyio.Event()

    async with serving(agents.ToolAgent(), tmp_path, replies=[{"content": "done"}]) as s:
        client = s.server.client
        assert client is not None

        async def hang(*args: object, **kwargs: object) -> None:
            stuck.set()
            await anyio.sleep(60)

        client.complete_rollout = hang  # type: ignore[method-assign]
        await s.init(init_body())
        with anyio.fail_after(5):
            await stuck.wait()
        with anyio.fail_after(5):
            await s.server.drain()
    files = list((tmp_path / "outbox").iterdir())
    assert len(files) == 1
    assert TG_KEY not in files[0].read_text()
    assert s.raw.calls_to(COMPLETED) == []


class SilentCallbacks(httpx2.AsyncBaseTransport):
    """Chat turns reach the gate; completion callbacks are never answered (a hung TrainGate)."""

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self.inner = inner
        self.waiting = 0

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if request.url.path == COMPLETED:
            self.waiting += 1
            await anyio.sleep_forever()
        return await self.inner.handle_async_request(request)


@contextlib.asynccontextmanager
async def silent_gate_server(
    tmp_path: Path, **options: Any
) -> AsyncIterator[tuple[httpx2.AsyncClient, RolloutServer, SilentCallbacks]]:
    """An in-process server whose TrainGate never answers a callback."""
    gate = MockTrainGate(ScriptedBackend([ANSWER] * 10))
    transport = SilentCallbacks(httpx2.ASGITransport(app=gate.app))
    async with httpx2.AsyncClient(transport=transport, timeout=None) as gate_http:
        client = TrainGateClient(gate_http, retry=RetryPolicy(retries=0))
        app = create_app(
            agents.ToolAgent(), client=client, outbox_dir=tmp_path / "outbox", **options
        )
        async with (
            app.router.lifespan_context(app),
            httpx2.AsyncClient(
                transport=httpx2.ASGITransport(app=app), base_url="http://rollout.test"
            ) as http,
        ):
            yield http, app.state.rollout_server, transport


async def test_drain_writes_undeliverable_results_to_the_outbox_before_it_returns(
    tmp_path: Path,
) -> None:
    """A TrainGate that never answers callbacks: when drain() returns, every result is in the
    outbox and nothing is left for the lifespan's exit (which used to drain a second time)."""
    async with silent_gate_server(tmp_path, shutdown_grace_s=0.1) as (http, server, transport):
        server.delivery_grace_s = 0.3
        for rid in ("a", "b"):
            body = init_body(rid, server_url="http://traingate.test", metadata={"no_chat": True})
            assert (await http.post("/v1/rollout/init", json=body)).status_code == 202
        with anyio.fail_after(5):
            while transport.waiting < 2:  # noqa: ASYNC110  # counted by the transport
                await anyio.sleep(0.01)
        with anyio.fail_after(10):
            await server.drain()
        written = sorted(p.name.split(".")[0] for p in (tmp_path / "outbox").iterdir())
        left = server.registry.unfinished()
        exit_started = anyio.current_time()
    exit_s = anyio.current_time() - exit_started

    assert written == ["a", "b"]
    assert left == []
    record = json.loads(next((tmp_path / "outbox").iterdir()).read_text())
    assert record["response"]["status"] == "COMPLETED"
    assert "delivery interrupted" in record["error"]
    assert exit_s < 0.3  # the lifespan did not wait out another grace + delivery window


# --------------------------------------------------------------------------------------------
# Bad input: 4xx with a clear message, the server stays healthy, no callback is sent
# --------------------------------------------------------------------------------------------

BIG_METADATA = {"blob": "x" * (2 * 1024 * 1024)}

BAD_BODIES = [
    pytest.param(b'{"rollout_id": "r-1",', "json_invalid", id="malformed-json"),
    pytest.param(
        init_body(rollout_id=5, messages="hello", max_turns="many"), "string_type", id="wrong-types"
    ),
    pytest.param(init_body(metadata=BIG_METADATA), "the limit is 1048576", id="2mib-metadata"),
    pytest.param(init_body(rollout_id="   "), "only whitespace", id="blank-rollout-id"),
    pytest.param(init_body(rollout_id="r" * 300), "at most 256", id="300-char-rollout-id"),
    pytest.param(init_body(server_url="ftp://gate.test"), "http:// or https://", id="non-http"),
    pytest.param(init_body(completion_params=None), "dict_type", id="null-params"),
    pytest.param(b"[1, 2]", "model_type", id="not-an-object"),
]


@pytest.mark.parametrize(("body", "expected"), BAD_BODIES)
async def test_invalid_init_gets_422_without_echo(
    tmp_path: Path, body: dict[str, Any] | bytes, expected: str
) -> None:
    """An invalid body gets a 422 detail list that never echoes input (not even the api_key)."""
    async with serving(agents.ToolAgent(), tmp_path) as s:
        content = json.dumps(body).encode() if isinstance(body, dict) else body
        response = await s.init(content)
        health = await s.health()

    assert response.status_code == 422
    assert expected in response.text
    detail = response.json()["detail"]
    assert isinstance(detail, list)
    assert detail
    assert all(set(d) == {"loc", "msg", "type"} for d in detail)
    assert all(d["loc"][0] == "body" for d in detail)
    assert TG_KEY not in response.text
    assert "xxxxxxxx" not in response.text
    assert len(response.content) < 2000
    assert health.status_code == 200
    assert health.json()["active_rollouts"] == 0
    assert s.raw.calls == []
    assert s.server.registry.by_key == {}


async def test_a_body_of_many_bad_messages_gets_a_small_422_with_the_count(tmp_path: Path) -> None:
    """100,000 bad messages: before, one 422 entry each (megabytes); now a few KB and a count."""
    body = init_body()
    body["messages"] = [1] * 100_000
    async with serving(agents.ToolAgent(), tmp_path) as s:
        response = await s.init(json.dumps(body).encode())

    assert response.status_code == 422
    assert len(response.content) < 8192
    payload = response.json()
    assert 1 <= len(payload["detail"]) <= 20
    assert payload["error_count"] >= len(payload["detail"])
    assert payload["detail"][0]["loc"][:2] == ["body", "messages"]


async def test_every_error_message_is_cut_short_and_the_list_capped(tmp_path: Path) -> None:
    """Many fields wrong at once: at most 20 errors, each message at most 200 characters."""
    body: dict[str, Any] = {
        "rollout_id": "",
        "server_url": "ftp://x",
        "messages": "not a list",
        "completion_params": {"temperature": "hot", "stop": [1] * 50_000},
        "max_turns": 0,
        "max_tokens_total": -1,
        "idempotency_key": "",
        "metadata": [],
        "api_key": "has space",
    }
    async with serving(agents.ToolAgent(), tmp_path) as s:
        response = await s.init(json.dumps(body).encode())

    assert response.status_code == 422
    payload = response.json()
    assert len(response.content) < 8192
    assert payload["error_count"] == len(payload["detail"]) >= 8
    assert all(len(d["msg"]) <= 200 for d in payload["detail"])


@pytest.mark.parametrize(
    "url",
    [
        "http://\u0000/",
        "http://a\u0000b.test/",
        "http://host\u007f/",
        "http://%00/",
        "http://h/\x01",
    ],
)
async def test_a_server_url_with_control_characters_is_a_422_at_init(
    tmp_path: Path, url: str
) -> None:
    """Before: 202, then a rollout that could never call back (straight to the outbox)."""
    async with serving(agents.ToolAgent(), tmp_path) as s:
        response = await s.init(json.dumps(init_body(server_url=url)).encode())

    assert response.status_code == 422
    [error] = response.json()["detail"]
    assert error["loc"] == ["body", "server_url"]
    assert not (tmp_path / "outbox").exists()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("api_key", "clé-secrète", "api_key must be printable ASCII"),
        ("server_url", "http://traingate.test:99999", "invalid port"),
        ("server_url", "http://traingate.test:abc", "invalid port"),
        ("completion_params", {"temperature": "hot"}, "temperature"),
        ("completion_params", {"max_tokens": "many"}, "max_tokens"),
    ],
)
async def test_values_that_would_break_every_call_are_refused_at_init(
    tmp_path: Path, field: str, value: object, message: str
) -> None:
    """What would make each later call fail is a 422 at init, and the server stays healthy."""
    async with serving(agents.ToolAgent(), tmp_path) as s:
        response = await s.init(init_body(**{field: value}))
        after = await s.init(init_body("r-2"))
        await s.settle()

    assert response.status_code == 422
    assert message in response.text
    assert after.status_code == 202
    assert len(s.completions("r-2")) == 1


def _raw_request(url: str, head: bytes, body: bytes, *, timeout: float = 10) -> tuple[bytes, float]:
    """Send ``head`` + ``body`` on a raw socket, keep it open, return (response, seconds)."""
    host, port = url.removeprefix("http://").split(":")
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(head + body)
        received = b""
        while b"\r\n\r\n" not in received or not _complete(received):
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
    return received, time.monotonic() - started


def _complete(response: bytes) -> bool:
    head, _, body = response.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


@contextlib.contextmanager
def threaded_server(tmp_path: Path, **options: Any) -> Iterator[tuple[str, RolloutServer]]:
    """``create_app`` served by uvicorn on 127.0.0.1 in a thread, with its lifespan."""
    app = create_app(
        agents.ToolAgent(), api_key=SERVER_KEY, outbox_dir=tmp_path / "outbox", **options
    )
    with serve_in_thread(app, lifespan="on") as url:
        yield url, app.state.rollout_server


def _head(length: int) -> bytes:
    return (
        "POST /v1/rollout/init HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {SERVER_KEY}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def test_a_declared_20_mib_body_is_refused_at_once_from_content_length(tmp_path: Path) -> None:
    """Content-Length over the limit: 413 before a byte of the body is read (1 KiB sent)."""
    with threaded_server(tmp_path) as (url, server):
        server.body_timeout_s = 60  # a read of the body would hold the connection this long
        response, elapsed = _raw_request(url, _head(20 * 1024 * 1024), b"{" * 1024)

    assert response.startswith(b"HTTP/1.1 413")
    assert b"request body exceeds" in response
    assert elapsed < 30  # the body read would have waited 60 s


def test_a_slow_body_times_out_with_408(tmp_path: Path) -> None:
    """A client that declares 1000 bytes and sends 10 gets 408, and the connection closes."""
    with threaded_server(tmp_path) as (url, server):
        server.body_timeout_s = 0.5
        response, _ = _raw_request(url, _head(1000), b'{"rollout_')

    assert response.startswith(b"HTTP/1.1 408")
    assert b"request body not received within 0.5 s" in response


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({}, id="missing"),
        pytest.param({"Authorization": "Bearer wrong-key"}, id="wrong"),
        pytest.param({"Authorization": f"Basic {SERVER_KEY}"}, id="other-scheme"),
        pytest.param({"Authorization": "Bearer "}, id="empty-bearer"),
    ],
)
async def test_init_without_the_server_key_gets_401(
    tmp_path: Path, headers: dict[str, str]
) -> None:
    """A missing or wrong server key is a 401 with a fixed message, and nothing starts."""
    async with serving(agents.ToolAgent(), tmp_path) as s:
        response = await s.init(init_body(), key=None, **headers)
        health = await s.health()

    assert response.status_code == 401
    assert response.json() == {"detail": "Invalid or missing API key"}
    assert health.json()["status"] == "healthy"
    assert s.raw.calls == []


async def test_non_ascii_authorization_header_is_401_not_500(tmp_path: Path) -> None:
    """A UTF-8 Authorization header is refused with 401, and the server stays healthy."""
    async with serving(agents.ToolAgent(), tmp_path) as s:
        response = await s.http.post(
            "/v1/rollout/init",
            content=json.dumps(init_body()).encode(),
            headers={"Authorization": "Bearer ключ-🔑".encode()},
        )
        health = await s.health()

    assert response.status_code == 401
    assert response.json() == {"detail": "Invalid or missing API key"}
    assert health.status_code == 200
    assert s.raw.calls == []


@pytest.mark.parametrize("declared", ["²", "1²", "¹2"])
async def test_non_ascii_digits_in_content_length_are_400_not_500(
    tmp_path: Path, declared: str
) -> None:
    """A Content-Length of superscript digits ("²".isdigit() is true) is a 400, not a 500."""
    async with serving(agents.ToolAgent(), tmp_path) as s:
        response = await s.http.post(
            "/v1/rollout/init",
            content=json.dumps(init_body()).encode(),
            headers={
                "Authorization": f"Bearer {SERVER_KEY}",
                "Content-Type": "application/json",
                "Content-Length": declared.encode("latin-1"),
            },
        )
        health = await s.health()

    assert response.status_code == 400
    assert response.json() == {"detail": "Content-Length must be a whole number of bytes"}
    assert health.status_code == 200
    assert s.raw.calls == []


async def test_auth_is_checked_before_parsing(tmp_path: Path) -> None:
    """A wrong key with a malformed body gets 401, not 422: strangers learn nothing."""
    async with serving(agents.ToolAgent(), tmp_path) as s:
        response = await s.init(b"{not json", key="wrong")

    assert response.status_code == 401


@pytest.mark.parametrize(
    "authorization",
    [f"Bearer {SERVER_KEY}", f"bearer {SERVER_KEY}", f"BEARER  {SERVER_KEY} ", SERVER_KEY],
    ids=["Bearer", "bearer", "BEARER-spaces", "bare"],
)
async def test_server_key_forms_are_accepted(tmp_path: Path, authorization: str) -> None:
    """``Bearer <k>`` in any case, and a bare ``<k>``, authenticate an init."""
    async with serving(agents.ToolAgent(), tmp_path) as s:
        response = await s.init(init_body(), key=None, Authorization=authorization)
        await s.settle()

    assert response.status_code == 202
    assert len(s.completions("r-1")) == 1


async def test_platform_health_needs_the_server_key(tmp_path: Path) -> None:
    """/platform/health: 404 on a keyless server; 401 on a bad key; the /health body with it."""
    async with serving(agents.ToolAgent(), tmp_path, api_key=None) as keyless:
        unkeyed = await keyless.http.get("/platform/health")
    async with serving(agents.ToolAgent(), tmp_path) as s:
        missing = await s.http.get("/platform/health")
        bad = await s.http.get("/platform/health", headers={"Authorization": "Bearer nope"})
        good = await s.http.get("/platform/health", headers={"Authorization": SERVER_KEY})

    assert unkeyed.status_code == 404
    assert missing.status_code == 401
    assert bad.status_code == 401
    assert good.status_code == 200
    body = good.json()
    assert isinstance(body.pop("instance_id"), str)  # v2's key: the replica, or the platform's
    assert isinstance(body.pop("process_id"), str)  # the polling SDK's: this process's life
    assert body == {
        "status": "healthy",
        "agent_loop": "srv-tools",
        "active_rollouts": 0,
        "completed_rollouts": 0,
        "queued_rollouts": 0,
        "state": "memory",
        "state_reachable": True,
        "concurrency": {"max_concurrent": 100, "queued": 0, "running": 0},
        "lifecycle": {"accepting_rollouts": True, "active_rollouts": 0},
    }


async def test_keyless_server_accepts_inits_without_a_header(tmp_path: Path) -> None:
    """Without a server key, an init needs no Authorization header."""
    async with serving(agents.ToolAgent(), tmp_path, api_key=None) as s:
        response = await s.init(init_body(), key=None)
        await s.settle()

    assert response.status_code == 202
    assert len(s.completions("r-1")) == 1


# --------------------------------------------------------------------------------------------
# Idempotency
# --------------------------------------------------------------------------------------------


async def test_concurrent_duplicate_inits_start_one_rollout(tmp_path: Path) -> None:
    """50 concurrent identical inits: one run, one callback, and the same 202 body for all."""
    agent = agents.Gated()
    async with serving(agent, tmp_path) as s:
        body = init_body()
        s.gate.expect("r-1", api_key=TG_KEY)
        responses: list[httpx2.Response] = []

        async def send() -> None:
            responses.append(await s.init(body))

        async with anyio.create_task_group() as tasks:
            for _ in range(50):
                tasks.start_soon(send)
        agent.release.set()
        await s.settle()

    assert [r.status_code for r in responses] == [202] * 50
    assert len({r.content for r in responses}) == 1
    assert agent.runs == ["r-1"]
    assert len(s.completions("r-1")) == 1


async def test_duplicate_after_completion_replays_the_answer_and_starts_nothing(
    tmp_path: Path,
) -> None:
    """A duplicate within the record TTL gets the first 202 body again; nothing reruns."""
    agent = agents.Gated()
    agent.release.set()
    async with serving(agent, tmp_path) as s:
        first = await s.init(init_body(idempotency_key="k-1"))
        await s.settle()
        again = await s.init(init_body(idempotency_key="k-1"))
        await s.settle()
        health = (await s.health()).json()

    assert (first.status_code, again.status_code) == (202, 202)
    assert again.content == first.content
    assert agent.runs == ["r-1"]
    assert len(s.completions("r-1")) == 1
    assert health["completed_rollouts"] == 1


async def test_conflicting_duplicates_get_409(tmp_path: Path) -> None:
    """Same idempotency_key for another rollout_id, or a running rollout_id under a new key: 409."""
    agent = agents.Gated()
    async with serving(agent, tmp_path) as s:
        first = await s.init(init_body("r-1", idempotency_key="k-1"))
        await agent.started.wait()
        other_id = await s.init(init_body("r-2", idempotency_key="k-1"))
        other_key = await s.init(init_body("r-1", idempotency_key="k-2"))
        agent.release.set()
        await s.settle()

    assert first.status_code == 202
    assert other_id.status_code == 409
    assert "idempotency_key" in other_id.json()["detail"]
    assert other_key.status_code == 409
    assert "already running" in other_key.json()["detail"]
    assert agent.runs == ["r-1"]
    assert "r-2" not in {c.json()["rollout_id"] for c in s.raw.calls_to(COMPLETED)}
    assert len(s.raw.calls_to(COMPLETED)) == 1


async def test_record_ttl_expiry_forgets_finished_rollouts(tmp_path: Path) -> None:
    """After ``record_ttl_s`` the periodic cleanup drops the record; the id may run again."""
    agent = agents.Gated()
    agent.release.set()
    async with serving(agent, tmp_path, record_ttl_s=0.1) as s:
        await s.init(init_body())
        await s.settle()
        assert "r-1" in s.server.registry.by_key
        with anyio.fail_after(3):
            while s.server.registry.by_key:  # noqa: ASYNC110 - the cleanup is periodic
                await anyio.sleep(0.02)
        s.gate.records.pop("r-1")
        again = await s.init(init_body())
        await s.settle()
        health = (await s.health()).json()

    assert again.status_code == 202
    assert agent.runs == ["r-1", "r-1"]
    assert health["completed_rollouts"] == 2


# --------------------------------------------------------------------------------------------
# get_tools failures and admission
# --------------------------------------------------------------------------------------------


async def test_get_tools_failure_is_500_and_starts_nothing(tmp_path: Path) -> None:
    """get_tools raising gives 500 with the reason; nothing runs; a retry after the fix works."""
    agent = agents.Gated()
    agent.broken = True
    agent.release.set()
    async with serving(agent, tmp_path) as s:
        failed = await s.init(init_body())
        health = (await s.health()).json()
        calls_after_failure = list(s.raw.calls)
        agent.broken = False
        retried = await s.init(init_body())
        await s.settle()

    assert failed.status_code == 500
    assert failed.json() == {
        "detail": "get_tools failed: ValueError: tool registry is not loaded",
    }
    assert health["active_rollouts"] == 0
    assert health["queued_rollouts"] == 0
    assert calls_after_failure == []
    assert retried.status_code == 202
    assert agent.runs == ["r-1"]
    assert len(s.completions("r-1")) == 1


async def test_get_tools_that_hangs_is_refused_and_frees_the_key(tmp_path: Path) -> None:
    """get_tools past its timeout: 500 with a reason; the same key may be retried at once."""
    async with serving(rev.SlowToolsAgent(), tmp_path, settings=None) as s:
        s.server.settings = s.server.settings.model_copy(update={"get_tools_timeout_s": 0.2})
        first = await s.init(init_body())
        second = await s.init(init_body())

    assert first.status_code == 500
    assert "did not return within 0.2 s" in first.text
    assert second.status_code == 500  # retried, not stuck behind a pending entry
    assert s.completions("r-1") == []


class _OneListAgent(RolloutAgentLoop):
    """Rewrites one tools list in place for each rollout, from the init's metadata; each
    rollout reports the tools its context saw."""

    name = "one-list"

    def __init__(self) -> None:
        self.tools: list[dict[str, Any]] = []

    def get_tools(self, request: Any) -> list[dict[str, Any]]:
        self.tools[:] = [
            {"type": "function", "function": {"name": name}} for name in request.metadata["tools"]
        ]
        return self.tools

    async def run(self, ctx: Any) -> Any:
        seen = ",".join(tool.name for tool in ctx.tools)
        return ctx.complete([{"role": "assistant", "content": seen}])


async def test_each_init_lists_the_tools_get_tools_returned_for_it(tmp_path: Path) -> None:
    """Checked tool lists are cached, but never served stale: an agent that rewrites one list
    per rollout gets each rollout's own tools in its 202 and in its context."""
    plan = {"a": ["add"], "b": ["add", "mul"], "c": ["add"], "d": []}
    async with serving(_OneListAgent(), tmp_path) as s:
        answers = {
            rid: await s.init(init_body(rid, metadata={"tools": names}))
            for rid, names in plan.items()
        }
        await s.settle()

    for rid, names in plan.items():
        assert answers[rid].status_code == 202
        assert [t["function"]["name"] for t in answers[rid].json()["tools"]] == names
        [result] = s.completions(rid)
        assert result.final_messages[-1]["content"] == ",".join(names)


async def test_invalid_tools_are_500_and_start_nothing(tmp_path: Path) -> None:
    """get_tools returning an invalid tool name gives 500 naming the tool; no callback."""
    async with serving(agents.Broken(), tmp_path) as s:
        response = await s.init(init_body())

    assert response.status_code == 500
    assert "tools[0].function.name 'has spaces'" in response.json()["detail"]
    assert s.raw.calls == []


async def test_admission_control_refuses_beyond_the_queue(tmp_path: Path) -> None:
    """max_concurrent=1, max_queued=1: the third init gets 503 with Retry-After; health counts."""
    agent = agents.Gated()
    async with serving(agent, tmp_path, max_concurrent=1, max_queued=1) as s:
        first = await s.init(init_body("a"))
        await agent.started.wait()
        second = await s.init(init_body("b"))
        third = await s.init(init_body("c"))
        busy = (await s.health()).json()
        agent.release.set()
        await s.settle()
        done = (await s.health()).json()

    assert [first.status_code, second.status_code, third.status_code] == [202, 202, 503]
    assert third.headers["retry-after"]
    assert "retry later" in third.json()["detail"]
    assert (busy["active_rollouts"], busy["queued_rollouts"], busy["completed_rollouts"]) == (
        1,
        1,
        0,
    )
    assert (done["active_rollouts"], done["queued_rollouts"], done["completed_rollouts"]) == (
        0,
        0,
        2,
    )
    assert agent.runs == ["a", "b"]
    assert "c" not in s.gate.records or s.completions("c") == []


async def test_admission_control_holds_under_a_burst(tmp_path: Path) -> None:
    """A burst of inits sent together is bounded by max_concurrent + max_queued."""
    agent = agents.Gated()
    async with serving(agent, tmp_path, max_concurrent=2, max_queued=3) as s:
        statuses: list[int] = []

        async def send(i: int) -> None:
            statuses.append((await s.init(init_body(f"r-{i}"))).status_code)

        async with anyio.create_task_group() as tasks:
            for i in range(20):
                tasks.start_soon(send, i)
        agent.release.set()
        await s.settle()

    assert sorted(statuses) == [202] * 5 + [503] * 15
    assert len(agent.runs) == 5


# --------------------------------------------------------------------------------------------
# Debug traces, log lines and secrets
# --------------------------------------------------------------------------------------------


async def test_debug_dir_gets_one_jsonl_trace_per_rollout_without_secrets(tmp_path: Path) -> None:
    """With debug_dir, ``ctx.log_event`` lines land in ``<rollout_id>.jsonl``; no api_key."""
    debug = tmp_path / "traces"
    async with serving(agents.ToolAgent(), tmp_path, debug_dir=debug) as s:
        await s.init(init_body())
        await s.settle()

    assert [p.name for p in debug.iterdir()] == ["r-1.jsonl"]
    text = (debug / "r-1.jsonl").read_text(encoding="utf-8")
    events = [json.loads(line) for line in text.splitlines()]
    assert [e["event"] for e in events] == [
        "rollout_start",
        "turn",
        "tool_result",
        "turn",
        "rollout_end",
    ]
    assert all(e["rollout_id"] == "r-1" for e in events)
    assert events[2]["result"] == 7
    assert events[4]["status"] == "COMPLETED"
    assert TG_KEY not in text
    assert SERVER_KEY not in text


async def test_ctx_error_quoting_the_key_never_reaches_callback_or_outbox(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """ctx.error(f"... {key}") and a failing callback: neither the callback nor the outbox
    file (nor any log line) holds the key."""
    caplog.set_level(logging.INFO)
    async with serving(hrd.ErrorsWithKey(), tmp_path) as s:
        for _ in range(4):  # the first attempt and three retries
            s.raw.fail_next(COMPLETED, 500)
        await s.init(init_body("leaky", api_key=NASTY_KEY))
        await s.settle()
        s.raw.faults.clear()
        await s.init(init_body("delivered", api_key=NASTY_KEY))
        await s.settle()

    [delivered] = s.completions("delivered")
    assert delivered.error_message is not None
    assert REDACTED in delivered.error_message
    assert every_form_absent(delivered.error_message, NASTY_KEY) == []
    [outbox_file] = (tmp_path / "outbox").iterdir()
    saved = json.loads(outbox_file.read_text(encoding="utf-8"))
    assert REDACTED in saved["response"]["error_message"]
    assert every_form_absent(outbox_file.read_text(encoding="utf-8"), NASTY_KEY) == []
    assert every_form_absent(caplog.text, NASTY_KEY) == []


async def test_a_json_escaped_echo_of_the_key_is_scrubbed_from_logs_traces_and_outbox(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """TrainGate echoes the key JSON-escaped in its error bodies (chat and callback); the key
    has quotes and backslashes. No file written and no log line holds any form of it."""
    caplog.set_level(logging.DEBUG)
    debug = tmp_path / "traces"
    async with serving(hrd.ChatsOnce(), tmp_path, debug_dir=debug, replies=[ANSWER]) as s:
        echo = {"detail": f"key {NASTY_KEY} is not allowed", "auth": f"Bearer {NASTY_KEY}"}
        s.raw.faults[CHAT] = [JSONResponse(echo, 400)]
        s.raw.faults[COMPLETED] = [JSONResponse(echo, 500) for _ in range(4)]
        await s.init(init_body("echoed", api_key=NASTY_KEY))
        await s.settle()
    s.server.tracer.close() if s.server.tracer else None

    outbox = list((tmp_path / "outbox").iterdir())
    assert len(outbox) == 1
    assert "HTTP 400" in json.loads(outbox[0].read_text())["response"]["error_message"]
    assert list(debug.iterdir())
    assert every_form_absent(written_text(tmp_path), NASTY_KEY) == []
    assert every_form_absent(caplog.text, NASTY_KEY) == []
    assert "HTTP 500" in caplog.text  # the callback's failure was logged, scrubbed


async def test_a_rollout_id_with_a_newline_cannot_forge_a_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The id is escaped in every log line: ``\\n`` shows as the two characters ``\\n``."""
    caplog.set_level(logging.INFO)
    rid = "evil\nCRITICAL forged line\x1b[31m"
    async with serving(agents.ToolAgent(), tmp_path) as s:
        for _ in range(4):
            s.raw.fail_next(COMPLETED, 500)
        await s.init(init_body(rid, metadata={"raise_after_tools": True}))
        await s.settle()

    messages = [r.getMessage() for r in caplog.records if r.name.startswith("osmosis_rollout")]
    about = [m for m in messages if "forged" in m]
    assert about  # the failure and the outbox were logged
    for message in about:
        assert "\nCRITICAL forged" not in message
        assert "\x1b" not in message
        assert "evil\\nCRITICAL forged line\\x1b[31m" in message


@pytest.mark.usefixtures("no_inherited_settings")
@pytest.mark.anyio
async def test_a_completed_rollout_is_one_info_line(caplog: pytest.LogCaptureFixture) -> None:
    from osmosis_rollout.testing import Harness, ScriptedBackend

    agent = load_asset("tool_agent").ToolAgent()
    with caplog.at_level(logging.INFO, logger="osmosis_rollout"):
        async with Harness(agent, backend=ScriptedBackend([{"content": "done"}])) as harness:
            outcome = await harness.run([{"role": "user", "content": "hi"}], rollout_id="r-7")
    assert outcome.result is not None
    assert outcome.result.status == "COMPLETED"
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("rollout r-7 ")]
    assert len(lines) == 1
    assert re.fullmatch(r"rollout r-7 COMPLETED \(stop\), 1 turn, \d+\.\d\d s", lines[0])


async def test_server_log_never_holds_the_api_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Failures that quote TrainGate's reply still keep the per-rollout api_key out of the log."""
    caplog.set_level(logging.DEBUG)
    async with serving(agents.ToolAgent(), tmp_path) as s:
        for _ in range(4):
            s.raw.fail_next(CHAT, 503)
        await s.init(init_body())
        await s.settle()

    [result] = s.completions("r-1")
    assert result.status == "ERROR"
    assert "HTTP 503" in (result.error_message or "")
    assert caplog.records
    assert TG_KEY not in caplog.text
