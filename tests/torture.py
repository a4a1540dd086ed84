"""Torture kit: hostile inits, a TrainGate that misbehaves on purpose (politely, as an ASGI app
that fails calls; or on the wire, as a raw server sending bombs, endless and dripping replies),
and the accounting.

Used by ``tests/test_torture.py`` (short runs on every CI run) and by ``benchmarks/soak.py`` and
``benchmarks/fuzz_inits.py`` (the long runs); usable against your own deployment too, from a
checkout::

    from tests.torture import FaultyGate, HostileGate, hostile_inits, tally

Everything is seeded, so a failing run can be replayed exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gzip
import json
import random
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from osmosis_rollout.testing import MockTrainGate

__all__ = ["FaultyGate", "HostileRequest", "Tally", "hostile_inits", "hostile_requests", "tally"]
__all__ = ["HOSTILE_REPLIES", "FaultyGate", "HostileGate", "Tally", "hostile_inits", "tally"]

CHAT_PATH = "/v1/chat/completions"
COMPLETED_PATH = "/v1/rollout/completed"

#: Values that break a field's type, size or format in one way or another.
_HOSTILE_VALUES: list[Any] = [
    None,
    True,
    -1,
    0,
    2**64,
    1e308,
    "",
    " \t",
    "\u0000",
    "line\nbreak",
    "\u202eevil",
    "x" * 300,
    [],
    {},
    [None],
    {"": None},
    "../../etc/passwd",
    "http://\u0000/",
    "javascript:alert(1)",
    "file:///etc/passwd",
    "http://[::1",
    "http://%00/",
    "https://host:99999/",
    "http://h/\u0001",
    "ftp://x",
]


def _big_list(rng: random.Random, scale: int) -> list[Any]:
    item: Any = rng.choice([1, "x", None, [], {"role": 1}])
    return [item] * rng.randint(scale // 4, scale)


def _field_value(rng: random.Random, scale: int) -> Any:
    roll = rng.random()
    if roll < 0.6:
        return rng.choice(_HOSTILE_VALUES)
    if roll < 0.8:
        return _big_list(rng, scale)
    if roll < 0.9:
        return "y" * rng.randint(1, scale)
    return {f"k{i}": rng.choice(_HOSTILE_VALUES) for i in range(rng.randint(1, 50))}


def _raw_garbage(rng: random.Random, scale: int) -> bytes:
    depth = rng.randint(100, 5000)
    choices = [
        b"",
        b"{",
        b"null",
        b"[]",
        b'"a string"',
        b"12345",
        b"NaN",
        b'{"rollout_id": NaN}',
        b'{"a": 1, "a": 2}',
        b"\xff\xfe\x00garbage",
        b"{" + b'"k":' * 100 + b"1",
        b"[" * depth + b"]" * depth,
        b'{"m":' + b"[" * depth + b"]" * depth + b"}",
        b'{"rollout_id": "\\ud800"}',
        bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 512))),
        b"[" + b"1," * rng.randint(1, scale) + b"1]",
    ]
    return rng.choice(choices)


def valid_init(rollout_id: str, server_url: str, api_key: str | None) -> dict[str, Any]:
    """A well-formed init body the fuzzer mutates."""
    body: dict[str, Any] = {
        "rollout_id": rollout_id,
        "server_url": server_url,
        "messages": [{"role": "user", "content": "What is 3 + 4?"}],
        "completion_params": {"temperature": 0.7, "max_tokens": 64},
        "metadata": {"fuzz": True},
    }
    if api_key is not None:
        body["api_key"] = api_key
    return body


def hostile_inits(
    seed: int, count: int, *, server_url: str, api_key: str | None = None, scale: int = 20_000
) -> Iterator[bytes]:
    """``count`` init bodies, most of them hostile: fields of the wrong type, size or format,
    huge lists (up to ``scale`` items), deep nesting, broken JSON, invalid UTF-8, lone
    surrogates; about one in ten is valid (so the server also runs rollouts meanwhile)."""
    rng = random.Random(seed)
    fields = list(valid_init("r", server_url, api_key))
    optional = ["tool_server_url", "max_turns", "max_tokens_total", "idempotency_key", "api_key"]
    for i in range(count):
        kind = rng.random()
        body = valid_init(f"fuzz-{seed}-{i}", server_url, api_key)
        if kind < 0.1:
            pass
        elif kind < 0.25:
            yield _raw_garbage(rng, scale)
            continue
        elif kind < 0.35:
            for name in rng.sample(fields, rng.randint(1, len(fields))):
                body.pop(name, None)
        else:
            for name in rng.sample(fields + optional, rng.randint(1, 4)):
                body[name] = _field_value(rng, scale)
            if rng.random() < 0.2:
                body["messages"] = [
                    {"role": rng.choice(["user", 1, None]), "content": _field_value(rng, 50)}
                    for _ in range(rng.randint(1, 200))
                ]
        yield json.dumps(body).encode()


@dataclass
class FaultyGate:
    """An ASGI wrapper that answers about ``rate`` of the calls with a fault instead of passing
    them on: chat 500 or 429 (retried), callback 500 (retried) or 400 (final: the outbox).
    Every error body echoes the caller's bearer token, JSON-escaped, as careless servers do.
    ``refused`` holds the ids whose callback got the final 400 (their results go to the outbox).
    """

    app: ASGIApp
    rate: float = 0.1
    seed: int = 0
    injected: dict[str, int] = field(default_factory=dict)
    refused: set[str] = field(default_factory=set)
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or self._rng.random() >= self.rate:
            await self.app(scope, receive, send)
            return
        if path == CHAT_PATH:
            status = self._rng.choice([500, 429])
        elif path == COMPLETED_PATH:
            status = self._rng.choice([500, 500, 400])
        else:
            await self.app(scope, receive, send)
            return
        body = await _read_body(receive)
        if path == COMPLETED_PATH and status == 400:
            self.refused.add(_rollout_id(body))
        token = ""
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                token = value.decode("latin-1").partition(" ")[2]
        name = f"{path.rsplit('/', 1)[1]} {status}"
        self.injected[name] = self.injected.get(name, 0) + 1
        headers = {"Retry-After": "0"} if status == 429 else None
        echo = {"detail": f"injected {status}", "token_seen": token}
        await JSONResponse(echo, status, headers=headers)(scope, receive, send)


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    more = True
    while more:
        message: Message = await receive()
        chunks.append(message.get("body", b""))
        more = bool(message.get("more_body", False)) and message["type"] == "http.request"
    return b"".join(chunks)


def _rollout_id(body: bytes) -> str:
    try:
        value = json.loads(body).get("rollout_id")
    except (ValueError, AttributeError):
        return ""
    return value if isinstance(value, str) else ""


@dataclass
class Tally:
    """What happened to a set of accepted rollouts."""

    accepted: int = 0
    delivered: int = 0
    outboxed: int = 0
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every accepted rollout ended exactly once."""
        return not self.lost and not self.duplicated


def outbox_ids(outbox: Path) -> list[str]:
    """The ``rollout_id`` of every outbox file (one entry per file)."""
    if not outbox.exists():
        return []
    ids = []
    for path in outbox.glob("*.json"):
        if path.name.startswith("."):  # a file being written (renamed into place when done)
            continue
        ids.append(json.loads(path.read_text(encoding="utf-8"))["response"]["rollout_id"])
    return ids


def tally(accepted: list[str], gate: MockTrainGate, outbox: Path) -> Tally:
    """Each accepted rollout must end in exactly one accepted callback or one outbox file."""
    saved: dict[str, int] = {}
    for rid in outbox_ids(outbox):
        saved[rid] = saved.get(rid, 0) + 1
    result = Tally(accepted=len(accepted))
    for rid in accepted:
        record = gate.records.get(rid)
        calls = len(record.completions) if record is not None else 0
        ends = calls + saved.get(rid, 0)
        result.delivered += calls
        result.outboxed += saved.get(rid, 0)
        if ends == 0:
            result.lost.append(rid)
        elif ends > 1:
            result.duplicated.append(rid)
    return result


# -- what a web page or a hostile init sends to make the server call elsewhere (CSRF, SSRF) ----

#: ``server_url`` values that must never be called, each refused at init (a 422).
SSRF_URLS: list[str] = [
    "http://169.254.169.254/latest/meta-data",
    "http://169.254.170.2/v2/credentials",
    "http://metadata.google.internal/computeMetadata/v1",
    "http://metadata.goog",
    "http://[fe80::1]:80",
    "http://[fd00:ec2::254]",
    "http://[::ffff:169.254.169.254]",
    "http://100.100.100.200",
    "http://0.0.0.0:9000",
    "http://2130706433:9000",
    "http://0x7f.0.0.1:9000",
    "http://127.1:9000",
    "http://0177.0.0.1:9000",
    f"http://{'a' * 64}.example",
]
#: Content types a web page may POST without a CORS preflight (all refused: 415).
PAGE_CONTENT_TYPES = ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]


@dataclass(frozen=True)
class HostileRequest:
    """One request shape: its headers (the caller adds the server key), body, and the status
    the server must answer."""

    shape: str
    headers: dict[str, str]
    body: bytes
    expected: int


def hostile_requests(
    seed: int, count: int, *, server_url: str, internal_url: str, api_key: str | None = None
) -> Iterator[HostileRequest]:
    """``count`` requests of the reviewed CSRF/SSRF shapes, seeded: inits as a page sends them
    (``text/plain``, an ``Origin``), under a rebinding name (a foreign ``Host``), naming
    ``internal_url`` with a path, query, ``#`` or credentials, a metadata or oddly spelled
    address, and ``completion_params`` with unknown keys or non-finite numbers. None may start a
    rollout, so nothing may ever reach ``internal_url`` (or any ``server_url``)."""
    rng = random.Random(seed)
    json_type = {"Content-Type": "application/json"}
    for i in range(count):
        body = valid_init(f"csrf-{seed}-{i}", server_url, api_key)
        roll = rng.randrange(6)
        if roll == 0:
            kind = rng.choice(PAGE_CONTENT_TYPES)
            headers = {"Content-Type": kind}
            if rng.random() < 0.5:
                headers["Origin"] = "https://evil.example"
                yield HostileRequest("page-origin", headers, json.dumps(body).encode(), 403)
            else:
                yield HostileRequest("page-content-type", headers, json.dumps(body).encode(), 415)
        elif roll == 1:
            origin = rng.choice(["https://evil.example", "null", "http://127.0.0.1:8080"])
            headers = {**json_type, "Origin": origin}
            yield HostileRequest("origin", headers, json.dumps(body).encode(), 403)
        elif roll == 2:
            host = rng.choice(["evil.example", "rebind.evil.example:9000", "10.9.8.7"])
            headers = {**json_type, "Host": host}
            yield HostileRequest("rebinding-host", headers, json.dumps(body).encode(), 400)
        elif roll == 3:
            suffix = rng.choice(["/internal/admin/reset?confirm=yes#", "/x#", "/?a=1"])
            url = rng.choice([f"{internal_url}{suffix}", internal_url.replace("://", "://u:p@")])
            body["server_url"] = url
            yield HostileRequest("internal-url", json_type, json.dumps(body).encode(), 422)
        elif roll == 4:
            body["server_url"] = rng.choice(SSRF_URLS)
            yield HostileRequest("ssrf-destination", json_type, json.dumps(body).encode(), 422)
        else:
            params = rng.choice(
                [
                    '{"temperature": NaN}',
                    '{"temperature": 1e999}',
                    '{"action": "reset"}',
                    '{"extra_body": {"messages": []}}',
                    '{"logit_bias": {"1": -Infinity}}',
                ]
            )
            body["completion_params"] = "PARAMS"
            text = json.dumps(body).replace('"PARAMS"', params)
            yield HostileRequest("completion-params", json_type, text.encode(), 422)


# -- a TrainGate hostile on the wire ----------------------------------------------------------

#: The reply shapes of :class:`HostileGate`; each costs a careless client memory or time.
HOSTILE_REPLIES = ("bomb", "endless", "long-length", "drip", "pipelined")
#: A valid chat completion (what the first of two pipelined replies carries).
COMPLETION = {
    "id": "c1",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}


@functools.lru_cache(maxsize=4)
def gzip_bomb(mib: int) -> bytes:
    """``mib`` MiB of zeros, gzipped (about 1/1000 of that on the wire)."""
    return gzip.compress(b"\0" * (mib * 2**20), compresslevel=9)


@dataclass
class HostileGate:
    """A raw HTTP/1.1 server on 127.0.0.1 that answers every POST with ``shape``:

    - ``bomb``: a small gzip reply that inflates to ``bomb_mib`` MiB;
    - ``endless``: a chunked body that never ends (until the client hangs up, or 4 GiB);
    - ``long-length``: ``Content-Length: 10**12``, then zeros for as long as they are read;
    - ``drip``: a 1,000-byte body sent one byte every ``drip_s``;
    - ``pipelined``: a valid 200 and, in the same write, a second response nobody asked for
      (``X-Smuggled`` header): a client must return the first and not reuse the connection;
    - ``ok``: a normal chat completion (a baseline to compare with).

    ``connections`` counts the connections made; ``sent`` the body bytes written.
    """

    shape: str
    bomb_mib: int = 64
    drip_s: float = 0.05
    connections: int = 0
    sent: int = 0
    url: str = ""
    _tasks: set[asyncio.Task[Any]] = field(default_factory=set)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
                await self._answer(writer)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.transport.abort()  # at once: a hostile peer says no goodbye
            if task is not None:
                self._tasks.discard(task)

    async def _answer(self, writer: asyncio.StreamWriter) -> None:
        ok = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        if self.shape == "bomb":
            body = gzip_bomb(self.bomb_mib)
            writer.write(ok + b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(body))
            writer.write(body)
            self.sent += len(body)
        elif self.shape == "endless":
            writer.write(ok + b"Transfer-Encoding: chunked\r\n\r\n")
            chunk = b"%x\r\n%s\r\n" % (65536, b"x" * 65536)
            while self.sent < 4 * 2**30:
                writer.write(chunk)
                self.sent += 65536
                await writer.drain()
        elif self.shape == "long-length":
            writer.write(ok + b"Content-Length: %d\r\n\r\n" % 10**12)
            while self.sent < 4 * 2**30:
                writer.write(b"\0" * 65536)
                self.sent += 65536
                await writer.drain()
        elif self.shape == "drip":
            writer.write(ok + b"Content-Length: 1000\r\n\r\n")
            for _ in range(1000):
                writer.write(b" ")
                self.sent += 1
                await writer.drain()
                await asyncio.sleep(self.drip_s)
        elif self.shape == "ok":  # a normal reply: the baseline a benchmark compares with
            body = json.dumps(COMPLETION).encode()
            writer.write(ok + b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            self.sent += len(body)
        elif self.shape == "pipelined":
            body = json.dumps(COMPLETION).encode()
            first = ok + b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            second = b"HTTP/1.1 500 Oops\r\nX-Smuggled: yes\r\nContent-Length: 2\r\n\r\n{}"
            writer.write(first + second)
            self.sent += len(body) + 2
        else:
            raise ValueError(f"unknown shape {self.shape!r}; one of {HOSTILE_REPLIES}")
        await writer.drain()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[HostileGate]:
        """Listen on 127.0.0.1 (an ephemeral port, in ``url``) while the block runs."""
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        try:
            yield self
        finally:
            server.close()
            for task in list(self._tasks):  # a drip or an endless body still being sent
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 5)
