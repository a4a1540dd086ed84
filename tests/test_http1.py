"""``Http1Transport`` against real servers on 127.0.0.1: uvicorn, and raw asyncio servers that
misbehave on purpose (close idle connections, stall, send garbage)."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import socket
import ssl
import subprocess
import threading
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from osmosis_rollout import __version__
from osmosis_rollout.client import RetryPolicy, TrainGateClient, default_transport
from osmosis_rollout.errors import ProtocolError, TrainGateTimeout
from osmosis_rollout.transport import (
    DecodeFailure,
    Httpx2Transport,
    InvalidTarget,
    TransportFailure,
)
from osmosis_rollout.transport.http1 import Http1Transport

from .programs import require_program
from .support import serve_in_thread

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "uvloop"])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    """Every test on plain asyncio and on uvloop (what ``serve()`` runs on)."""
    return ("asyncio", {"use_uvloop": request.param == "uvloop"})


# --------------------------------------------------------------------------------------------
# A raw HTTP/1.1 server whose every answer the test scripts
# --------------------------------------------------------------------------------------------


@dataclass
class Seen:
    """One request as the server read it."""

    connection: int
    index: int  # the request's number on its connection
    head: bytes
    body: bytes
    reader: asyncio.StreamReader | None = None

    def header(self, name: str) -> str | None:
        for line in self.head.decode("latin-1").split("\r\n")[1:]:
            key, _, value = line.partition(":")
            if key.strip().lower() == name.lower():
                return value.strip()
        return None


#: What the script answers: bytes to send (then keep reading), or None to close at once.
Script = Callable[[Seen], Awaitable[bytes | None]]


def response(
    body: bytes = b"{}", status: int = 200, headers: tuple[str, ...] = (), version: str = "1.1"
) -> bytes:
    head = [f"HTTP/{version} {status} X", f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def ok(seen: Seen) -> bytes:
    return response(json.dumps({"echo": seen.body.decode()}).encode())


@dataclass
class RawServer:
    script: Script
    ssl_context: ssl.SSLContext | None = None
    #: Send each answer, then close the connection (without saying so in a header).
    close_after: bool = False
    connections: int = 0
    open_now: int = 0
    peak: int = 0
    closed_by_client: int = 0
    seen: list[Seen] = field(default_factory=list)
    url: str = ""
    _tasks: set[asyncio.Task[Any]] = field(default_factory=set)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        number = self.connections
        self.connections += 1
        self.open_now += 1
        self.peak = max(self.peak, self.open_now)
        try:
            index = 0
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    self.closed_by_client += 1
                    return
                seen = Seen(number, index, head, b"", reader)
                seen.body = await reader.readexactly(int(seen.header("content-length") or 0))
                self.seen.append(seen)
                answer = await self.script(seen)
                if answer is None:
                    return
                writer.write(answer)
                await writer.drain()
                if self.close_after:
                    return
                index += 1
        except ConnectionError:
            pass
        finally:
            self.open_now -= 1
            self._tasks.discard(task)
            writer.close()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[RawServer]:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.ssl_context)
        port = server.sockets[0].getsockname()[1]
        self.url = f"{'https' if self.ssl_context else 'http'}://127.0.0.1:{port}"
        try:
            yield self
        finally:
            server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await server.wait_closed()


@contextlib.asynccontextmanager
async def raw(script: Script = ok, **options: Any) -> AsyncIterator[RawServer]:
    async with RawServer(script, **options).running() as server:
        yield server


@contextlib.asynccontextmanager
async def lean(**options: Any) -> AsyncIterator[Http1Transport]:
    transport = Http1Transport(**options)
    try:
        yield transport
    finally:
        await transport.aclose()


async def _settle() -> None:
    """Let the loop run the callbacks of what just happened on the sockets."""
    for _ in range(5):
        await asyncio.sleep(0.01)


# --------------------------------------------------------------------------------------------
# Keep-alive
# --------------------------------------------------------------------------------------------


async def test_many_calls_reuse_one_connection() -> None:
    async with raw() as server, lean() as http:
        for i in range(30):
            reply = await http.post(f"{server.url}/v1/chat/completions", b"%d" % i, {})
            assert reply.json() == {"echo": str(i)}
        assert server.connections == 1
        assert [seen.index for seen in server.seen] == list(range(30))


async def test_a_connection_the_server_closed_while_idle_is_not_used() -> None:
    async with raw(close_after=True) as server, lean() as http:
        for i in range(10):
            reply = await http.post(server.url, b"%d" % i, {})
            assert reply.json() == {"echo": str(i)}
            if i % 2:
                await _settle()  # half the time the loop has seen the close, half it has not
        assert server.connections == 10
        assert len(server.seen) == 10  # each request sent once: the closed ones were not used


@contextlib.contextmanager
def closing_server_thread(calls: int) -> Iterator[str]:
    """A server in another thread that answers one request per connection, then closes it
    (without ``Connection: close``): its FIN arrives while the test's loop is not running."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        for _ in range(calls):
            conn, _ = listener.accept()
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                conn.sendall(response(b"ok"))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        thread.join(10)
        listener.close()


async def test_a_closed_idle_connection_is_seen_before_it_is_used() -> None:
    with closing_server_thread(3) as url:
        async with lean() as http:
            for _ in range(3):
                assert (await http.post(url, b"", {})).content == b"ok"
                time.sleep(0.05)  # noqa: ASYNC251 - the FIN arrives while the loop is stopped
            assert http.stale_retries == 0  # never sent on the closed connection


async def test_a_reused_connection_dropped_before_any_reply_is_retried_once_on_a_new_one() -> None:
    async def drop_second(seen: Seen) -> bytes | None:
        return None if seen.index == 1 else await ok(seen)

    async with raw(drop_second) as server, lean() as http:
        assert (await http.post(server.url, b"a", {})).json() == {"echo": "a"}
        assert (await http.post(server.url, b"b", {})).json() == {"echo": "b"}
        assert server.connections == 2
        assert [seen.body for seen in server.seen] == [b"a", b"b", b"b"]
        assert http.stale_retries == 1


async def test_a_new_connection_dropped_before_any_reply_is_not_retried() -> None:
    async def drop(seen: Seen) -> bytes | None:
        return None

    async with raw(drop) as server, lean() as http:
        with pytest.raises(TransportFailure) as caught:
            await http.post(server.url, b"a", {})
        assert caught.value.kind == "RemoteProtocolError"
        assert "without sending a response" in str(caught.value)
        assert len(server.seen) == 1


async def test_connection_close_and_http_1_0_are_not_reused() -> None:
    async def answer(seen: Seen) -> bytes:
        if seen.body == b"close":
            return response(b"closing", headers=("Connection: close",))
        return response(b"old", version="1.0")

    async with raw(answer) as server, lean() as http:
        for body in (b"close", b"old", b"close", b"old"):
            reply = await http.post(server.url, body, {})
            assert reply.content == (b"closing" if body == b"close" else b"old")
        assert server.connections == 4


async def test_idle_connections_expire() -> None:
    async with raw() as server, lean(idle_expiry_s=0.05) as http:
        await http.post(server.url, b"a", {})
        await asyncio.sleep(0.15)
        await http.post(server.url, b"b", {})
        assert server.connections == 2


# --------------------------------------------------------------------------------------------
# Responses
# --------------------------------------------------------------------------------------------


async def test_chunked_close_delimited_and_interim_responses() -> None:
    async def answer(seen: Seen) -> bytes | None:
        if seen.body == b"chunked":
            return (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
            )
        if seen.body == b"interim":
            return b"HTTP/1.1 100 Continue\r\n\r\n" + response(b"final")
        return b"HTTP/1.0 200 OK\r\nX-Kind: eof\r\n\r\nuntil the close"

    async with raw(answer) as server, lean() as http:
        chunked = await http.post(server.url, b"chunked", {})
        assert chunked.content == b"hello world"
        interim = await http.post(server.url, b"interim", {})
        assert (interim.status_code, interim.content) == (200, b"final")
        assert server.connections == 1  # both reused the first connection
        task = asyncio.create_task(http.post(server.url, b"eof", {}))
        await _settle()
        server._tasks.pop().cancel()  # the server closes the connection: the body ends there
        delimited = await task
        assert (delimited.headers["x-kind"], delimited.content) == ("eof", b"until the close")


async def test_a_response_dribbled_byte_by_byte_is_read_whole() -> None:
    whole = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-A: b\r\n\r\n3\r\nabc\r\n0\r\n\r\n"

    async def dribble(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        for i in range(len(whole)):
            writer.write(whole[i : i + 1])
            await writer.drain()
            await asyncio.sleep(0)
        await reader.read()  # until the client closes
        writer.close()
        await writer.wait_closed()
        finished.set()

    finished = asyncio.Event()
    server = await asyncio.start_server(dribble, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with lean() as http:
            reply = await http.post(f"http://127.0.0.1:{port}/", b"", {})
            assert (reply.headers["x-a"], reply.content) == ("b", b"abc")
        await asyncio.wait_for(finished.wait(), 5)
    finally:
        server.close()
        await server.wait_closed()


async def test_traingate_client_retries_over_the_lean_transport() -> None:
    async def flaky(seen: Seen) -> bytes:
        if len(server.seen) == 1:
            return response(b"busy", status=503, headers=("Retry-After: 0",))
        return await ok(seen)

    async with raw(flaky) as server, TrainGateClient(retry=RetryPolicy(retries=2)) as client:
        reply = await client._post(f"{server.url}/v1/x", b"{}", api_key=None, request_id="r-7")
        assert reply.json() == {"echo": "{}"}
        assert [seen.header("x-request-id") for seen in server.seen] == ["r-7", "r-7"]
        assert (client.stats.retries, client.stats.by_status) == (1, {503: 1, 200: 1})
        assert server.connections == 1  # the 503 kept the connection alive


async def test_error_statuses_come_back_with_their_bodies() -> None:
    async def answer(seen: Seen) -> bytes:
        status = int(seen.body)
        return response(b'{"error": "%d"}' % status, status=status, headers=("Retry-After: 2",))

    async with raw(answer) as server, lean() as http:
        for status in (400, 404, 429, 500, 503):
            reply = await http.post(server.url, str(status).encode(), {})
            assert reply.status_code == status
            assert reply.json() == {"error": str(status)}
            assert reply.headers["retry-after"] == "2"
        assert server.connections == 1


async def test_large_bodies_both_ways_and_the_size_bound() -> None:
    big = bytes(range(256)) * 20_000  # 5 MB

    async def echo(seen: Seen) -> bytes:
        return response(seen.body)

    async with raw(echo) as server, lean(max_response_bytes=8 * 2**20) as http:
        assert (await http.post(server.url, big, {})).content == big
    async with raw(echo) as server, lean() as http:  # the default bound: 4 MiB
        with pytest.raises(DecodeFailure, match="larger than 4 MiB"):
            await http.post(server.url, big, {})
    async with raw(echo) as server, lean(max_response_bytes=1_000_000) as http:
        with pytest.raises(DecodeFailure, match="larger than"):
            await http.post(server.url, big, {})
        assert (await http.post(server.url, b"small", {})).content == b"small"


async def test_gzip_and_deflate_are_decoded_and_unknown_encodings_refused() -> None:
    payload = json.dumps({"choices": ["x" * 1000]}).encode()
    bodies = {
        b"gzip": (gzip.compress(payload), "gzip"),
        b"deflate": (zlib.compress(payload), "deflate"),
        b"raw": (zlib.compress(payload)[2:-4], "deflate"),
        b"br": (payload, "br"),
        b"bomb": (gzip.compress(b"\0" * 3_000_000), "gzip"),
    }

    async def answer(seen: Seen) -> bytes:
        body, coding = bodies[seen.body]
        return response(body, headers=(f"Content-Encoding: {coding}",))

    async with raw(answer) as server, lean(max_response_bytes=1_000_000) as http:
        for name in (b"gzip", b"deflate", b"raw"):
            assert (await http.post(server.url, name, {})).content == payload
        with pytest.raises(DecodeFailure, match="unsupported Content-Encoding 'br'"):
            await http.post(server.url, b"br", {})
        with pytest.raises(DecodeFailure, match="larger than"):
            await http.post(server.url, b"bomb", {})
        assert server.seen[0].header("accept-encoding") == "gzip, deflate"


async def test_malformed_responses_are_remote_protocol_errors() -> None:
    answers = {
        b"garbage": b"SPDY/9 what\r\n\r\n",
        b"double-length": b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nx",
        b"short": b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
        b"huge-head": b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 100_000 + b"\r\n\r\n",
    }

    async def answer(seen: Seen) -> bytes | None:
        if seen.body == b"ok":
            return response(b"fine")
        await asyncio.sleep(0)
        return answers[seen.body] if seen.body != b"short" else answers[b"short"]

    async with raw(answer, close_after=True) as server, lean() as http:
        for name in answers:
            with pytest.raises(TransportFailure) as caught:
                await http.post(server.url, name, {})
            assert caught.value.kind == "RemoteProtocolError", name
            assert not caught.value.timed_out
        assert (await http.post(server.url, b"ok", {})).content == b"fine"
        assert http._open <= 1


# --------------------------------------------------------------------------------------------
# Failures and timeouts
# --------------------------------------------------------------------------------------------


async def test_refused_port_is_a_connect_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connections are refused
        async with lean() as http:
            with pytest.raises(TransportFailure) as caught:
                await http.post(f"http://127.0.0.1:{port}/v1/x", b"", {})
    assert caught.value.kind == "ConnectError"
    assert not caught.value.timed_out
    assert f"127.0.0.1:{port}" in str(caught.value)


async def test_a_slow_server_is_a_read_timeout_and_the_pool_recovers() -> None:
    async def slow(seen: Seen) -> bytes:
        if seen.body == b"slow":
            await asyncio.sleep(30)
        return await ok(seen)

    async with raw(slow) as server, lean(attempt_timeout_s=0.3) as http:
        with pytest.raises(TransportFailure) as caught:
            await http.post(server.url, b"slow", {})
        assert (caught.value.kind, caught.value.timed_out) == ("ReadTimeout", True)
        assert (await http.post(server.url, b"fast", {})).json() == {"echo": "fast"}
        assert server.connections == 2  # the timed-out connection was not reused
        assert http._open == 1


async def test_a_server_that_stops_reading_is_a_write_timeout() -> None:
    stop = asyncio.Event()

    finished = asyncio.Event()

    async def never_read(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await stop.wait()
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
        finished.set()

    server = await asyncio.start_server(never_read, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with lean(attempt_timeout_s=0.5) as http:
            with pytest.raises(TransportFailure) as caught:  # more than the socket buffers hold
                await http.post(f"http://127.0.0.1:{port}/", b"x" * 64_000_000, {})
            assert (caught.value.kind, caught.value.timed_out) == ("WriteTimeout", True)
            assert http._open == 0
    finally:
        stop.set()
        await asyncio.wait_for(finished.wait(), 5)
        server.close()
        await server.wait_closed()


async def test_cancellation_closes_that_connection_and_leaves_the_pool_usable() -> None:
    started = asyncio.Event()

    dropped = asyncio.Event()

    async def hang(seen: Seen) -> bytes | None:
        if seen.body == b"hang":
            started.set()
            assert seen.reader is not None
            with contextlib.suppress(ConnectionError):
                await seen.reader.read()  # returns at the client's close
            dropped.set()
            return None
        return await ok(seen)

    async with raw(hang) as server, lean(max_connections=1) as http:
        await http.post(server.url, b"warm", {})
        task = asyncio.create_task(http.post(server.url, b"hang", {}))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        reply = await asyncio.wait_for(http.post(server.url, b"after", {}), 5)
        assert reply.json() == {"echo": "after"}
        await asyncio.wait_for(dropped.wait(), 5)  # the half-read connection was closed
        assert server.connections == 2
        assert (http._open, http._idle_count) == (1, 1)


async def test_calls_beyond_max_connections_wait_then_time_out() -> None:
    async def slowish(seen: Seen) -> bytes:
        await asyncio.sleep(0.05)
        return await ok(seen)

    async with raw(slowish) as server, lean(max_connections=3) as http:
        replies = await asyncio.gather(*(http.post(server.url, b"%d" % i, {}) for i in range(12)))
        assert [r.json()["echo"] for r in replies] == [str(i) for i in range(12)]
        assert server.peak <= 3
        assert server.connections == 3

    async def stall(seen: Seen) -> bytes:
        await asyncio.sleep(30)
        return b""

    async with raw(stall) as server, lean(max_connections=1, connect_timeout_s=0.2) as http:
        first = asyncio.create_task(http.post(server.url, b"1", {}))
        await _settle()
        with pytest.raises(TransportFailure) as caught:
            await http.post(server.url, b"2", {})
        assert (caught.value.kind, caught.value.timed_out) == ("PoolTimeout", True)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first


async def test_many_concurrent_calls_through_uvicorn() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        ports.add(scope["client"][1])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body.upper()})

    ports: set[int] = set()
    with serve_in_thread(app) as url:
        async with lean(max_connections=50) as http:
            calls = [http.post(f"{url}/v1/chat/completions", b"r%d" % i, {}) for i in range(300)]
            replies = await asyncio.gather(*calls)
            assert [r.content for r in replies] == [b"R%d" % i for i in range(300)]
            again = await http.post(url, b"x", {})  # chunked by uvicorn: no Content-Length
            assert again.content == b"X"
    assert len(ports) <= 50


# --------------------------------------------------------------------------------------------
# Requests and URLs
# --------------------------------------------------------------------------------------------


async def test_the_request_carries_host_length_agent_and_the_callers_headers() -> None:
    async with raw() as server, lean() as http:
        port = server.url.rsplit(":", 1)[1]
        await http.post(
            f"{server.url}/v1/rollout/completed?x=1#frag",
            b'{"a": 1}',
            {"Content-Type": "application/json", "X-Request-Id": "r-1:completed"},
        )
        seen = server.seen[0]
        assert seen.head.startswith(b"POST /v1/rollout/completed?x=1 HTTP/1.1\r\n")
        assert seen.header("host") == f"127.0.0.1:{port}"
        assert seen.header("content-length") == "8"
        assert seen.header("user-agent") == f"osmosis-rollout/{__version__}"
        assert seen.header("content-type") == "application/json"
        assert seen.header("x-request-id") == "r-1:completed"
        assert seen.body == b'{"a": 1}'
        assert seen.header("authorization") is None
        await http.post(
            server.url.replace("//", "//gate:s%3Acret@"), b"", {"Authorization": "Bearer k"}
        )
        assert server.seen[1].header("authorization") == "Basic Z2F0ZTpzOmNyZXQ="  # gate:s:cret
        assert server.seen[1].head.count(b"Authorization") == 1
        assert server.seen[1].header("host") == f"127.0.0.1:{port}"


async def test_urls_of_one_origin_each_send_their_own_path() -> None:
    """Protocol v2 calls a new URL per rollout on one origin: each request line carries its own
    path (the origin's parsed form is reused), the Host and the Basic auth of the origin stay,
    and a bad path on a known origin is still refused."""
    async with raw() as server, lean() as http:
        port = server.url.rsplit(":", 1)[1]
        base = server.url.replace("//", "//gate:pw@")
        for rid in ("a", "b", "c-1"):
            await http.post(f"{base}/v1/rollouts/{rid}/completion", b"{}", {})
        heads = [seen.head.split(b"\r\n", 1)[0] for seen in server.seen]
        assert heads == [
            b"POST /v1/rollouts/a/completion HTTP/1.1",
            b"POST /v1/rollouts/b/completion HTTP/1.1",
            b"POST /v1/rollouts/c-1/completion HTTP/1.1",
        ]
        assert {seen.header("host") for seen in server.seen} == {f"127.0.0.1:{port}"}
        assert {seen.header("authorization") for seen in server.seen} == {"Basic Z2F0ZTpwdw=="}
        with pytest.raises(InvalidTarget, match="invalid path"):
            await http.post(f"{base}/v1/rollouts/a b/completion", b"", {})


async def test_ipv6_literals_and_default_ports() -> None:
    if not socket.has_ipv6:
        pytest.skip("this machine has no IPv6")
    try:
        server = await asyncio.start_server(lambda r, w: None, "::1", 0)
    except OSError:
        pytest.skip("::1 is not configured on this machine")
    server.close()
    await server.wait_closed()
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(response(b"v6"))
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    server = await asyncio.start_server(handle, "::1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with lean() as http:
            assert (await http.post(f"http://[::1]:{port}/x", b"", {})).content == b"v6"
    finally:
        server.close()
        await server.wait_closed()
    assert f"Host: [::1]:{port}\r\n".encode() in seen[0]
    target = Http1Transport()._target("https://[::1]/v1")
    assert (target.port, b"Host: [::1]\r\n" in target.head) == (443, True)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("ftp://example.com/x", "unsupported URL scheme 'ftp'"),
        ("http:///nohost", "no host"),
        ("http://example.com:99999/", "invalid URL"),
        ("http://example.com:port/", "invalid URL"),
        ("not a url", "unsupported URL scheme"),
        ("http://example.com/a b", "invalid path"),
    ],
)
async def test_bad_urls_are_invalid_targets(url: str, words: str) -> None:
    async with lean() as http:
        with pytest.raises(InvalidTarget, match=words):
            await http.post(url, b"", {})


async def test_header_injection_is_refused_without_echoing_the_value() -> None:
    async with raw() as server, lean() as http:
        with pytest.raises(InvalidTarget) as caught:
            await http.post(server.url, b"", {"Authorization": "Bearer sk-1\r\nX-Evil: 1"})
        assert "sk-1" not in str(caught.value)
        with pytest.raises(InvalidTarget, match="invalid header name"):
            await http.post(server.url, b"", {"Bad Name": "x"})
        assert server.seen == []


# --------------------------------------------------------------------------------------------
# TLS
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A throwaway CA and a server certificate for 127.0.0.1/localhost, made by ``openssl``."""
    openssl = require_program("openssl")
    folder = tmp_path_factory.mktemp("tls")

    def run(command: str, *quoted: str) -> None:
        args = [openssl, *command.split(), *quoted]
        subprocess.run(args, cwd=folder, check=True, capture_output=True)

    (folder / "leaf.ext").write_text(
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "authorityKeyIdentifier=keyid\n"
        "subjectKeyIdentifier=hash\n"
    )
    # The CA's keyUsage: Python 3.13's strict verification requires it.
    ca = "req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -addext"
    run(ca, "keyUsage=critical,keyCertSign,cRLSign", "-subj", "/CN=osmosis test CA")
    run("req -new -newkey rsa:2048 -nodes -keyout leaf.key -out leaf.csr -subj /CN=localhost")
    run("x509 -req -in leaf.csr -CA ca.pem -CAkey ca.key -days 2 -CAcreateserial -out leaf.pem "
        "-extfile leaf.ext")  # fmt: skip
    return folder


def _server_context(certs: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certs / "leaf.pem", certs / "leaf.key")
    return context


async def test_tls_with_the_default_trust_and_sni(
    certs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names: list[str | None] = []

    def note_name(sock: ssl.SSLObject, name: str | None, context: ssl.SSLContext) -> None:
        names.append(name)

    server_context = _server_context(certs)
    server_context.sni_callback = note_name

    async with raw(ssl_context=server_context) as server:
        url = server.url.replace("127.0.0.1", "localhost")
        async with lean(connect_timeout_s=5) as http:  # the system's CAs: ours is not trusted
            with pytest.raises(TransportFailure) as caught:
                await http.post(url, b"", {})
            assert caught.value.kind == "ConnectError"
            assert "certificate" in str(caught.value).lower()
        monkeypatch.setenv("SSL_CERT_FILE", str(certs / "ca.pem"))  # as httpx2 honours it
        async with lean() as http:
            for i in range(5):
                assert (await http.post(url, b"%d" % i, {})).json() == {"echo": str(i)}
            assert server.connections == 1  # kept alive
        assert names[-1] == "localhost"


async def test_tls_with_a_given_context_by_ip_address(certs: Path) -> None:
    async with raw(ssl_context=_server_context(certs)) as server:
        trust = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        async with lean(ssl_context=trust) as http:
            assert server.url.startswith("https://127.0.0.1:")
            replies = await asyncio.gather(*(http.post(server.url, b"x", {}) for _ in range(20)))
            assert {r.content for r in replies} == {b'{"echo": "x"}'}


# --------------------------------------------------------------------------------------------
# TrainGateClient's choice of carrier
# --------------------------------------------------------------------------------------------


async def test_the_client_uses_the_lean_transport_by_default_and_closes_it() -> None:
    async with raw() as server:
        client = TrainGateClient(retry=RetryPolicy(retries=0))
        assert isinstance(client.transport, Http1Transport)
        assert client.http is None
        await client._post(f"{server.url}/v1/x", b"{}", api_key="sk", request_id="r1")
        assert server.seen[0].header("authorization") == "Bearer sk"
        await client.aclose()
        await _settle()
        assert server.closed_by_client == 1


@pytest.mark.parametrize(
    "env",
    [
        {"HTTPS_PROXY": "http://proxy:3128"},
        {"all_proxy": "http://proxy:3128"},
        {"OSMOSIS_HTTP_CLIENT": "httpx2"},
    ],
)
async def test_proxies_and_the_escape_hatch_keep_httpx2(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    transport = default_transport(RetryPolicy(), 10)
    assert isinstance(transport, Httpx2Transport)
    await transport.aclose()


def test_outside_an_event_loop_the_client_keeps_httpx2() -> None:
    transport = default_transport(RetryPolicy(), 10)
    assert isinstance(transport, Httpx2Transport)


async def test_a_slow_traingate_through_the_client_reads_as_before() -> None:
    async def slow(seen: Seen) -> bytes:
        await asyncio.sleep(30)
        return b""

    retry = RetryPolicy(retries=1, base_delay_s=0.01, attempt_timeout_s=0.2)
    async with raw(slow) as server, TrainGateClient(retry=retry) as client:
        with pytest.raises(TrainGateTimeout, match=r"after 2 attempt\(s\): ReadTimeout"):
            await client._post(f"{server.url}/v1/x", b"{}", api_key=None, request_id="r")

    async def gzip_bomb(seen: Seen) -> bytes:
        return response(b"not gzip", headers=("Content-Encoding: gzip",))

    async with raw(gzip_bomb) as server, TrainGateClient(retry=retry) as client:
        with pytest.raises(ProtocolError, match="could not be decoded"):
            await client._post(f"{server.url}/v1/x", b"{}", api_key=None, request_id="r")


async def test_a_second_response_in_the_same_read_is_dropped_and_the_connection_not_reused() -> (
    None
):
    """Two responses in one write: the caller gets the first with only its own headers (the
    second's never overwrite them), and the connection is closed, not pooled with the stray
    response waiting in it."""

    async def two(seen: Seen) -> bytes:
        first = response(b'{"n": 1}', headers=("X-First: 1",))
        second = response(b"{}", 500, headers=("X-First: overwritten", "X-Second: 2"))
        return first + second

    async with raw(two) as server, lean() as http:
        for _ in range(2):
            reply = await http.post(server.url, b"{}", {})
            assert reply.status_code == 200
            assert reply.headers["x-first"] == "1"
            assert "x-second" not in reply.headers
            assert reply.json() == {"n": 1}
        await _settle()
    assert server.connections == 2


async def test_a_host_with_a_64_character_label_is_an_invalid_target_not_a_unicode_error() -> None:
    """A DNS label over 63 characters is refused before any connection, in the transport's
    words (a bare UnicodeError came out of getaddrinfo before)."""
    async with lean() as http:
        for host in ("a" * 64 + ".example", "ok." + "b" * 64, "x" * 254, "a..b"):
            with pytest.raises(InvalidTarget, match="invalid host name"):
                await http.post(f"http://{host}/v1/x", b"{}", {})
        with pytest.raises(InvalidTarget, match="longer than 63 characters"):
            await http.post(f"http://{'c' * 64}.example/", b"{}", {})


async def test_a_url_password_never_appears_in_an_error() -> None:
    """A user:password URL that cannot be called names the URL with the password as ***."""
    async with lean() as http:
        with pytest.raises(InvalidTarget) as caught:
            await http.post(f"ftp://user:hunter2@{'d' * 5}/x", b"{}", {})
    assert "hunter2" not in str(caught.value)
    assert "user:***@" in str(caught.value)
