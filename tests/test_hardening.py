"""Hardening: a hostile or broken peer cannot exhaust the server, leak the key, or stall shutdown.

One regression test (or a few) per item of issue 13: bounded 422s and body limits, the key
scrubbed in every form on every path that writes, one drain that writes the outbox at once,
``server_url`` checked with the client's parser, escaped ids in log lines, compact records.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import anyio
import httpx2
import pytest
from starlette.responses import JSONResponse

from osmosis_rollout.client import RetryPolicy, TrainGateClient
from osmosis_rollout.redaction import REDACTED, scrub
from osmosis_rollout.server import RolloutServer, create_app
from osmosis_rollout.server.registry import FinishedRecord
from osmosis_rollout.testing import MockTrainGate, ScriptedBackend

from .support import load_asset, serve_in_thread
from .test_server import ANSWER, CHAT, COMPLETED, SERVER_KEY, init_body, serving

pytestmark = pytest.mark.anyio

agents = load_asset("srv_agents")
hrd = load_asset("hrd_agents")

#: A key with every character that JSON, repr and URL encoding rewrite.
NASTY_KEY = 'tg-"quoted"\\back/slash%20&plus+\'tick-9876'


def key_forms(secret: str) -> set[str]:
    """How a key shows up in text: raw, JSON-escaped (once, twice), repr'd, URL-encoded."""
    json_once = json.dumps(secret)[1:-1]
    return {
        secret,
        json_once,
        json.dumps(json_once)[1:-1],
        repr(secret)[1:-1],
        quote(secret, safe=""),
        quote_plus(secret),
    }


def every_form_absent(text: str, secret: str) -> list[str]:
    """The forms of ``secret`` (see :func:`key_forms`) that ``text`` still contains."""
    return sorted(form for form in key_forms(secret) if form in text)


def written_text(root: Path) -> str:
    """Every file under ``root``, concatenated (what a user would grep for a leaked key)."""
    return "\n".join(
        p.read_text(encoding="utf-8", errors="replace") for p in root.rglob("*") if p.is_file()
    )


# --------------------------------------------------------------------------------------------
# 1. Bounded 422s, 413 from Content-Length, slow bodies
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# 2. The key never leaks, in any form
# --------------------------------------------------------------------------------------------


def test_scrub_removes_every_form_of_a_key_with_quotes_and_backslashes() -> None:
    """Raw, JSON-escaped (once and twice), repr-escaped and URL-encoded forms all go."""
    key = NASTY_KEY
    texts = [
        f"raw {key}",
        json.dumps({"detail": f"bad key {key}"}),
        json.dumps({"outer": json.dumps({"detail": key})}),
        repr(ValueError(f"bad {key}")),
        f"url ?key={quote(key, safe='')}",
        f"url ?key={quote_plus(key)}",
    ]
    for text in texts:
        cleaned = scrub(text, key)
        assert REDACTED in cleaned
        assert every_form_absent(cleaned, key) == [], text


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


# --------------------------------------------------------------------------------------------
# 3. Shutdown: drain once, the outbox written as soon as a delivery is given up
# --------------------------------------------------------------------------------------------


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
# 4. server_url checked with the client's parser
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# 5. Log injection
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# 6. Finished records are compact and capped
# --------------------------------------------------------------------------------------------


async def test_finished_records_are_compact_share_their_tools_and_replay_the_same_202(
    tmp_path: Path,
) -> None:
    """A finished rollout leaves an id, a fingerprint and an outcome (the tools JSON shared by
    every record with the same tools); a duplicate still gets the first 202, byte for byte."""
    async with serving(agents.ToolAgent(), tmp_path) as s:
        first = await s.init(init_body("a", metadata={"no_chat": True}))
        await s.init(init_body("b", metadata={"no_chat": True}))
        await s.settle()
        records = [s.server.registry.by_key[k] for k in ("a", "b")]
        replay = await s.init(init_body("a", metadata={"no_chat": True}))

    a, b = records
    assert isinstance(a, FinishedRecord)
    assert isinstance(b, FinishedRecord)
    assert (a.rollout_id, a.outcome) == ("a", "COMPLETED")
    assert a.fingerprint != b.fingerprint  # the bodies differ by their rollout_id
    assert a.tools is b.tools  # one copy of the tools for every record
    assert replay.status_code == 202
    assert replay.content == first.content
    assert len(s.completions("a")) == 1


async def test_finished_records_are_capped_oldest_first(tmp_path: Path) -> None:
    """Past ``max_records`` the oldest records go, so a long run's memory stays bounded."""
    async with serving(agents.ToolAgent(), tmp_path) as s:
        s.server.registry.max_records = 3
        for i in range(5):
            await s.init(init_body(f"r{i}", metadata={"no_chat": True}))
            await s.settle()
        kept = sorted(s.server.registry.by_key)
        count = s.server.registry.records

    assert kept == ["r2", "r3", "r4"]
    assert count == 3


async def test_an_undelivered_rollout_leaves_an_outbox_record(tmp_path: Path) -> None:
    """The record's outcome says where the result went: the callback's status, or the outbox."""
    async with serving(agents.ToolAgent(), tmp_path) as s:
        for _ in range(4):
            s.raw.fail_next(COMPLETED, 500)
        await s.init(init_body("lost", metadata={"no_chat": True}))
        await s.settle()
        record = s.server.registry.by_key["lost"]

    assert isinstance(record, FinishedRecord)
    assert record.outcome == "outbox"


async def test_the_append_only_warning_escapes_the_rollout_id(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The SDK's history-rewrite warning names the rollout too: its id is escaped there as well."""
    caplog.set_level(logging.WARNING)
    fnd = load_asset("fnd_history")
    rid = "evil\nCRITICAL forged line"
    async with serving(fnd.EditsEarlierMessageAgent(), tmp_path, replies=[ANSWER, ANSWER]) as s:
        await s.init(init_body(rid))
        await s.settle()

    about = [r.getMessage() for r in caplog.records if "rewrote the history" in r.getMessage()]
    assert about
    for message in about:
        assert "\nCRITICAL forged" not in message
        assert "evil\\nCRITICAL forged line" in message
