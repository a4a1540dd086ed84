"""The in-process carriers of ``osmosis test``: ``GateTransport`` (server -> mock TrainGate,
straight to its handlers) and ``AsgiTransport`` (mock TrainGate -> the server's ASGI app).

Each must answer exactly what the HTTP route would: same status, same body bytes, same findings.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import anyio.lowlevel
import httpx2
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from osmosis_rollout.client import RetryPolicy, TrainGateClient
from osmosis_rollout.errors import TrainGateError
from osmosis_rollout.evaluation.runner import RowInput, RunOptions, run_batch
from osmosis_rollout.protocol import CompletionsRequest
from osmosis_rollout.testing import Harness, MockLLMBackend, MockTrainGate, ScriptedBackend
from osmosis_rollout.transport import AsgiTransport, InvalidTarget, TransportFailure

from .support import calculator_agent

pytestmark = pytest.mark.anyio

KEY = "rollout-secret"
GATE = "http://traingate.test"


def _chat(rollout_id: str, text: str = "hi") -> bytes:
    return json.dumps(
        {"rollout_id": rollout_id, "messages": [{"role": "user", "content": text}]}
    ).encode()


#: (path, body, headers): every kind of answer the two endpoints give.
CASES: list[tuple[str, bytes, dict[str, str]]] = [
    ("/v1/chat/completions", _chat("r-1"), {"Authorization": f"Bearer {KEY}"}),
    ("/v1/chat/completions", _chat("r-1", "again"), {"authorization": f"bearer {KEY}"}),
    ("/v1/chat/completions", _chat("r-1"), {"Authorization": "Bearer wrong"}),
    ("/v1/chat/completions", _chat("r-unknown"), {}),
    ("/v1/chat/completions", b"{not json", {}),
    ("/v1/chat/completions", b'{"rollout_id": 3}', {}),
    ("/v1/rollout/completed", b'{"rollout_id": "r-1", "status": "NOPE"}', {}),
    (
        "/v1/rollout/completed",
        json.dumps(
            {
                "rollout_id": "r-1",
                "status": "COMPLETED",
                "final_messages": [{"role": "user", "content": "hi"}],
                "finish_reason": "stop",
            }
        ).encode(),
        {"Authorization": f"Bearer {KEY}"},
    ),
    ("/v1/rollout/completed", b'{"rollout_id": "r-1", "status": "COMPLETED"}', {}),
    ("/v1/rollout/elsewhere", b"{}", {}),
]


def _gate() -> MockTrainGate:
    gate = MockTrainGate(ScriptedBackend([{"content": "one"}, {"content": "two"}]))
    gate.expect("r-1", api_key=KEY, tools=[])
    return gate


def _findings(gate: MockTrainGate) -> list[tuple[str, str, str | None, int | None]]:
    return [(f.code, f.message, f.rollout_id, f.turn) for f in gate.findings]


async def test_gate_transport_answers_what_the_http_routes_answer() -> None:
    """Every case through the handlers directly and through the Starlette app over HTTP: the
    same status, body bytes and content type, and the same records and findings."""
    direct, over_http = _gate(), _gate()
    transport = direct.post_transport()
    async with httpx2.AsyncClient(transport=over_http.transport(), base_url=GATE) as http:
        for path, body, headers in CASES:
            mine = await transport.post(f"{GATE}{path}", body, headers)
            theirs = await http.post(path, content=body, headers=headers)
            assert (mine.status_code, mine.content) == (theirs.status_code, theirs.content), path
            assert mine.headers["content-type"] == theirs.headers["content-type"]
            chat_reply = path.endswith("completions") and mine.status_code == 200
            if mine.headers["content-type"] == "application/json" and not chat_reply:
                # the bytes Starlette's JSONResponse (the routes' old answer) would send
                assert mine.content == JSONResponse(json.loads(mine.content)).body
    assert _findings(direct) == _findings(over_http)
    assert {code for code, *_ in _findings(direct)} >= {
        "bad_api_key",
        "unknown_rollout",
        "malformed_request",
    }
    mine_record, their_record = direct.records["r-1"], over_http.records["r-1"]
    assert mine_record.chats == their_record.chats
    assert mine_record.replies == their_record.replies
    assert mine_record.completions == their_record.completions


async def test_gate_transport_refuses_urls_it_cannot_call() -> None:
    transport = _gate().post_transport()
    with pytest.raises(InvalidTarget, match="http"):
        await transport.post("ftp://traingate.test/v1/chat/completions", b"{}", {})


async def test_gate_transport_goes_through_a_replaced_app() -> None:
    """A test that wraps ``gate.app`` (to record or break requests) still sees every call."""
    gate = _gate()
    seen: list[str] = []
    inner = gate.app

    async def wrapper(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["path"])
        await inner(scope, receive, send)

    gate.app = wrapper
    reply = await gate.post_transport().post(
        f"{GATE}/v1/chat/completions", _chat("r-1"), {"Authorization": f"Bearer {KEY}"}
    )
    assert reply.status_code == 200
    assert seen == ["/v1/chat/completions"]


async def test_a_client_over_the_gate_transport_gets_replies_and_http_errors() -> None:
    gate = _gate()
    client = TrainGateClient(transport=gate.post_transport(), retry=RetryPolicy(retries=0))
    request = CompletionsRequest.model_validate(json.loads(_chat("r-1")))
    reply = await client.chat_completions(GATE, request, api_key=KEY, request_id="r-1:1")
    assert reply.message.content == "one"
    with pytest.raises(TrainGateError, match="HTTP 401"):
        await client.chat_completions(GATE, request, api_key="nope", request_id="r-1:2")


def _echo_app() -> Starlette:
    async def echo(request: Request) -> Response:
        body = await request.body()
        return JSONResponse(
            {
                "path": request.url.path,
                "query": request.url.query,
                "host": request.headers.get("host"),
                "length": request.headers.get("content-length"),
                "type": request.headers.get("content-type"),
                "body": body.decode(),
                "client": request.client.host if request.client else None,
            },
            status_code=201,
            headers={"Retry-After": "3"},
        )

    async def chunks(request: Request) -> Response:
        async def parts() -> Any:
            for part in (b"one,", b"two,", b"three"):
                yield part

        return StreamingResponse(parts(), media_type="text/plain")

    async def boom(request: Request) -> Response:
        raise RuntimeError("the app broke")

    return Starlette(
        routes=[
            Route("/echo/{name}", echo, methods=["POST"]),
            Route("/chunks", chunks, methods=["POST"]),
            Route("/boom", boom, methods=["POST"]),
        ]
    )


async def test_asgi_transport_sends_what_a_client_sends_and_reads_the_whole_reply() -> None:
    transport = AsgiTransport(_echo_app())
    reply = await transport.post(
        "http://server.test:8080/echo/a%20b?x=1",
        b'{"k": "v"}',
        {"Content-Type": "application/json", "Content-Length": "999"},
    )
    assert reply.status_code == 201
    assert reply.headers["retry-after"] == "3"
    assert reply.json() == {
        "path": "/echo/a b",
        "query": "x=1",
        "host": "server.test:8080",
        "length": "10",  # the real length, whatever the caller claimed
        "type": "application/json",
        "body": '{"k": "v"}',
        "client": "127.0.0.1",
    }
    streamed = await transport.post("http://server.test/chunks", b"", {})
    assert streamed.content == b"one,two,three"


async def test_asgi_transport_errors() -> None:
    transport = AsgiTransport(_echo_app())
    with pytest.raises(RuntimeError, match="the app broke"):
        await transport.post("http://server.test/boom", b"", {})
    with pytest.raises(InvalidTarget):
        await transport.post("not a url", b"", {})
    with pytest.raises(InvalidTarget):
        await transport.post("http://server.test:99999/echo/x", b"", {})

    async def silent(scope: Any, receive: Any, send: Any) -> None:
        await receive()

    with pytest.raises(TransportFailure, match="without a complete response"):
        await AsgiTransport(silent).post("http://server.test/", b"", {})


async def test_asgi_transport_tells_a_listening_app_of_the_disconnect_after_the_reply() -> None:
    """An app that waits for ``http.disconnect`` (as streaming responses do) gets it once its
    response is complete, not before."""
    events: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        events.append((await receive())["type"])

        async def listen() -> None:
            events.append((await receive())["type"])

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(listen)
            await anyio.lowlevel.checkpoint()
            events.append("respond")
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

    reply = await AsgiTransport(app).post("http://server.test/", b"x", {})
    assert reply.content == b"ok"
    assert events == ["http.request", "respond", "http.disconnect"]


async def test_harness_keeps_server_http_for_other_calls() -> None:
    """Inits go without httpx2; ``server_http`` still reaches the same in-process server."""
    agent = calculator_agent()
    async with Harness(agent, backend=MockLLMBackend()) as harness:
        rows = [RowInput(index=1, messages=[{"role": "user", "content": "What is 2 + 3?"}])]
        report = await run_batch(harness, rows, RunOptions())
        assert report.rows[0].status == "COMPLETED"
        http = harness.server_http
        assert http is not None
        assert harness.server_http is http  # made once
        health = (await http.get("/health")).json()
        assert health["completed_rollouts"] == 1
    assert Harness(agent).server_http is None  # not entered
    async with Harness(agent, backend=MockLLMBackend()) as unused:
        pass
    assert unused.server_http is None  # never made, and not made once the server is gone


async def test_asgi_transport_gets_too() -> None:
    """A v2 controller reads status with a GET: the app sees the method, the raw path and the
    headers, and no body."""
    seen: dict[str, Any] = {}

    async def status(request: Request) -> JSONResponse:
        seen.update(
            method=request.method,
            raw_path=request.scope["raw_path"],
            key=request.headers.get("authorization"),
            body=await request.body(),
        )
        return JSONResponse({"status": "success"})

    app = Starlette(routes=[Route("/rollout/{rid:path}/status", status, methods=["GET"])])
    reply = await AsgiTransport(app).get(
        "http://server.test/rollout/a%2Fb/status", {"Authorization": "Bearer k"}
    )
    assert (reply.status_code, reply.json()) == (200, {"status": "success"})
    assert seen == {
        "method": "GET",
        "raw_path": b"/rollout/a%2Fb/status",
        "key": "Bearer k",
        "body": b"",
    }
