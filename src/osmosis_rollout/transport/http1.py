"""``Http1Transport``: a lean keep-alive HTTP/1.1 client for the server's two TrainGate calls.

Profiling a one-turn rollout showed more than half of the server's CPU in the general-purpose
client (``httpx2`` over ``httpcore2`` and ``h11``) for two small POSTs. This carrier does only
what those calls need, on asyncio (plain or uvloop) with ``httptools``' C parser: a keep-alive
pool per (scheme, host, port), ``Content-Length``/chunked/read-to-close bodies, gzip and
deflate, timeouts, TLS with the trust ``httpx2`` uses. Anything it does not speak (proxies, other
async libraries) stays on ``httpx2``: :func:`osmosis_rollout.client.default_transport` chooses.

Why it is kept (the house keeps a second carrier only while it moves a user-visible figure by
10% or more): **server CPU per one-turn rollout** (docs/benchmarks.md, summary row 11), measured
by ``benchmarks/bench_carriers.py`` with ``httpx2`` in the same run, rounds alternating: 1.00 ms
against 3.39 ms (medians of 6 rounds, 2,000 rollouts each, fast stack, 16 in flight; the ratio
0.25-0.35 in every round, 0.32 at the median). The same run has it cutting the real-model
backend's CPU per POST to 0.06-0.15x and ``osmosis test --llm-url``'s CPU per row to 0.34-0.68x,
so that backend uses it too (``testing/openai_backend.py``).

It must hold on a hostile network, not just be fast: responses are bounded, a connection is
reused only when it is known clean, a half-read connection is never pooled, and every failure is
reported in ``httpx2``'s words (``ConnectError``, ``ReadTimeout``...) so messages do not change
with the carrier.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from .._version import __version__
from ..destinations import DestinationPolicy
from ..redaction import redact_url
from .bodies import decode_body
from .destination import check_call
from .http1_connection import Connection, default_ssl_context, describe, settle
from .types import MAX_REPLY_BYTES, InvalidTarget, Reply, TransportFailure

__all__ = ["MAX_RESPONSE_BYTES", "Http1Transport", "check_host_name"]

#: The largest response body kept (raw and decoded): a TrainGate reply is a few KB.
MAX_RESPONSE_BYTES = MAX_REPLY_BYTES
_DEFAULT_PORTS = {"http": 80, "https": 443}
_MAX_NAMES = 256  # header names (and URLs) remembered with their parsed form
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
#: Headers that frame the message: ours to write, never the caller's.
_FRAMING = frozenset({"host", "content-length", "transfer-encoding", "connection"})
_DEFAULTS = {
    "user-agent": f"User-Agent: osmosis-rollout/{__version__}\r\n".encode(),
    "accept": b"Accept: */*\r\n",
    "accept-encoding": b"Accept-Encoding: gzip, deflate\r\n",
}
_DEFAULT_BLOCK = b"".join(_DEFAULTS.values())


@dataclass(frozen=True, slots=True)
class _Target:
    """One URL, parsed: where to connect and the request line + Host header to send."""

    key: tuple[str, str, int]
    host: str
    port: int
    tls: bool
    head: bytes
    #: The URL carries user:password (sent as Basic auth, which wins over the caller's header,
    #: as in httpx2).
    auth: bool = False


class Http1Transport:
    """A :class:`~osmosis_rollout.transport.PostTransport` over pooled HTTP/1.1 connections.

    At most ``max_connections`` are open at once (None: no bound); a caller beyond waits up to
    ``connect_timeout_s`` for one (then ``PoolTimeout``). Up to ``max_idle`` idle connections
    are kept, each for ``idle_expiry_s``. ``connect_timeout_s`` bounds opening a connection (TLS
    handshake included), ``attempt_timeout_s`` the whole call. ``ssl_context`` defaults to the
    one ``httpx2`` builds by default (``SSL_CERT_FILE``/``SSL_CERT_DIR`` honoured).
    """

    def __init__(
        self,
        *,
        connect_timeout_s: float = 10.0,
        attempt_timeout_s: float = 300.0,
        max_connections: int | None = 1000,
        max_idle: int = 200,
        idle_expiry_s: float = 5.0,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        ssl_context: ssl.SSLContext | None = None,
        destinations: DestinationPolicy | None = None,
    ) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.attempt_timeout_s = attempt_timeout_s
        self.max_connections = max_connections
        self.max_idle = max_idle
        self.idle_expiry_s = idle_expiry_s
        self.max_response_bytes = max_response_bytes
        self._ssl = ssl_context
        #: Checks the addresses of every new connection and connects to a checked one, so a
        #: name that resolves elsewhere a second later cannot slip past (docs/security.md).
        self.destinations = destinations
        self._names: dict[str, tuple[str, bytes]] = {}
        #: Each URL's parsed target (a TrainGate has a few). Parsing per call cost 10-25% more
        #: CPU per LLM turn through ``ctx.chat`` (bench_turn_overhead.py, docs/benchmarks.md
        #: section 18); cleared when it grows past _MAX_NAMES (many TrainGates).
        self._targets: dict[str, _Target] = {}
        #: Parsed origins (``scheme://authority``) with their Host lines: protocol v2 calls a new
        #: URL per rollout (the id in its path), on a few origins.
        self._origins: dict[str, tuple[_Target, bytes]] = {}
        self._idle: dict[tuple[str, str, int], collections.deque[Connection]] = {}
        self._idle_count = 0
        #: Connections counted against ``max_connections`` (connecting, busy or idle).
        self._open = 0
        self._waiters: collections.deque[asyncio.Future[bool]] = collections.deque()
        self._closed = False
        #: Calls sent again after a kept-alive connection failed before any reply byte.
        self.stale_retries = 0

    # -- the call ---------------------------------------------------------------------------

    async def post(self, url: str, content: bytes, headers: Mapping[str, str]) -> Reply:
        """POST ``content`` to ``url``; see :class:`~osmosis_rollout.transport.PostTransport`."""
        target = self._targets.get(url) or self._target(url)
        request = self._request(target, content, headers)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.attempt_timeout_s
        fresh = False
        while True:
            conn = await self._acquire(target, loop, deadline, fresh)
            try:
                status, reply_headers, body = await conn.exchange(request, deadline)
            except TransportFailure as exc:
                self._discard(conn)
                # A kept-alive connection the server dropped just as we used it fails before
                # any response byte: send again, once, on a new connection. Safe for TrainGate's
                # two calls even if the first copy did arrive: it deduplicates by X-Request-Id.
                if conn.reused and not conn.answered and not exc.timed_out and not fresh:
                    fresh = True
                    self.stale_retries += 1
                    continue
                raise
            except BaseException:
                self._discard(conn)  # cancelled mid-call: never pool a half-read connection
                raise
            if conn.keep_alive and conn.sent():
                self._release(conn, loop)
            else:
                self._close(conn)
            return Reply(
                status, reply_headers, decode_body(reply_headers, body, self.max_response_bytes)
            )

    async def aclose(self) -> None:
        """Close every idle connection; busy ones close when their call ends."""
        self._closed = True
        for idle in self._idle.values():
            while idle:
                self._close(idle.pop())
        self._idle_count = 0
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(True)

    # -- URLs and requests ------------------------------------------------------------------

    def _target(self, url: str) -> _Target:
        start = url.find("://")
        slash = url.find("/", start + 3) if start > 0 else -1
        if slash > 0:
            known = self._origins.get(url[:slash])
            path = url[slash:]
            if (
                known is not None
                and path.isascii()
                and not any(c in path for c in " ?#")
                and not _BAD_VALUE.search(path)
            ):
                origin, tail = known
                target = _Target(
                    origin.key,
                    origin.host,
                    origin.port,
                    origin.tls,
                    b"POST " + path.encode() + b" HTTP/1.1\r\n" + tail,
                    origin.auth,
                )
                return self._remember(url, target)
        target = self._parse_target(url)
        if slash > 0 and not any(c in url[slash:] for c in "?#"):
            line = b"POST " + url[slash:].encode() + b" HTTP/1.1\r\n"
            if target.head.startswith(line):
                if len(self._origins) >= _MAX_NAMES:
                    self._origins.clear()
                self._origins[url[:slash]] = (target, target.head[len(line) :])
        return self._remember(url, target)

    def _remember(self, url: str, target: _Target) -> _Target:
        if len(self._targets) >= _MAX_NAMES:
            self._targets.clear()
        self._targets[url] = target
        return target

    def _parse_target(self, url: str) -> _Target:
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise InvalidTarget(f"invalid URL {_shown(url)}: {exc}") from None
        scheme = parts.scheme.lower()
        if scheme not in _DEFAULT_PORTS:
            raise InvalidTarget(
                f"unsupported URL scheme {parts.scheme!r} in {_shown(url)}: use http:// or https://"
            )
        host = parts.hostname
        if not host:
            raise InvalidTarget(f"invalid URL {_shown(url)}: no host")
        try:
            host = check_host_name(host)
        except ValueError as exc:
            raise InvalidTarget(f"invalid host name in {_shown(url)}: {exc}") from None
        default = _DEFAULT_PORTS[scheme]
        port = default if port is None else port
        shown = f"[{host}]" if ":" in host else host
        authority = shown if port == default else f"{shown}:{port}"
        path = parts.path or "/"
        if parts.query:
            path = f"{path}?{parts.query}"
        if not path.isascii() or _BAD_VALUE.search(path) or " " in path:
            raise InvalidTarget(
                f"invalid path in {_shown(url)}: percent-encode spaces and non-ASCII"
            )
        head = f"POST {path} HTTP/1.1\r\nHost: {authority}\r\n"
        if parts.username is not None:  # user:password@host, as httpx2 sends it
            secret = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            head += f"Authorization: Basic {base64.b64encode(secret.encode()).decode()}\r\n"
        return _Target(
            (scheme, host, port), host, port, scheme == "https", head.encode(), "@" in parts.netloc
        )

    def _request(self, target: _Target, content: bytes, headers: Mapping[str, str]) -> bytes:
        parts = [target.head, b"Content-Length: %d\r\n" % len(content)]
        defaults = _DEFAULT_BLOCK
        for name, value in headers.items():
            lower, prefix = self._names.get(name) or self._name(name)
            if lower in _FRAMING or (target.auth and lower == "authorization"):
                continue
            if lower in _DEFAULTS:
                defaults = defaults.replace(_DEFAULTS[lower], b"")
            if not value.isprintable() and _BAD_VALUE.search(value):
                raise InvalidTarget(f"header {name!r} has a control character in its value")
            try:
                parts += (prefix, value.encode("ascii"), b"\r\n")
            except UnicodeEncodeError:
                raise InvalidTarget(f"header {name!r} has a non-ASCII value") from None
        parts += (defaults, b"\r\n", content)
        return b"".join(parts)

    def _name(self, name: str) -> tuple[str, bytes]:
        if not name.isascii() or not _TOKEN.fullmatch(name):
            raise InvalidTarget(f"invalid header name {name!r}")
        entry = (name.lower(), f"{name}: ".encode())
        if len(self._names) < _MAX_NAMES:
            self._names[name] = entry
        return entry

    # -- the pool ---------------------------------------------------------------------------

    async def _acquire(
        self, target: _Target, loop: asyncio.AbstractEventLoop, deadline: float, fresh: bool
    ) -> Connection:
        if not fresh:
            conn = self._take_idle(target.key, loop)
            if conn is not None:
                return conn
        connect_deadline = min(loop.time() + self.connect_timeout_s, deadline)
        while True:
            if self._closed:
                raise TransportFailure("ConnectError", "the HTTP client is closed")
            if self.max_connections is None or self._open < self.max_connections:
                break
            if self._evict_one():
                continue
            if not await self._wait_for_slot(loop, connect_deadline):
                raise TransportFailure(
                    "PoolTimeout",
                    f"all {self.max_connections} connections stayed busy for "
                    f"{self.connect_timeout_s:g}s",
                    timed_out=True,
                )
            if not fresh:
                conn = self._take_idle(target.key, loop)
                if conn is not None:
                    return conn
        self._open += 1
        try:
            return await self._connect(target, loop, connect_deadline)
        except BaseException:
            self._open -= 1
            self._wake_one()
            raise

    async def _wait_for_slot(self, loop: asyncio.AbstractEventLoop, deadline: float) -> bool:
        """Wait until a connection is released (True) or ``deadline`` passes (False)."""
        waiter: asyncio.Future[bool] = loop.create_future()
        self._waiters.append(waiter)
        timer = loop.call_at(deadline, settle, waiter, False)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.result():
                self._wake_one()  # the wake-up was ours: pass it on
            raise
        finally:
            timer.cancel()
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(True)
                return

    async def _connect(
        self, target: _Target, loop: asyncio.AbstractEventLoop, deadline: float
    ) -> Connection:
        where = f"{target.host}:{target.port}"
        context = None
        if target.tls:
            context = self._ssl
            if context is None:  # built at the first https call, as httpx2 builds it
                context = self._ssl = default_ssl_context()
        try:
            async with asyncio.timeout_at(deadline):
                hosts = [target.host]
                if self.destinations is not None:
                    shown = f"[{target.host}]" if ":" in target.host else target.host
                    url = f"{target.key[0]}://{shown}:{target.port}/"
                    hosts = await check_call(self.destinations, url, resolve=True)
                conn = await self._open_first(target, loop, hosts, context)
        except TimeoutError:
            raise TransportFailure(
                "ConnectTimeout",
                f"no connection to {where} within {self.connect_timeout_s:g}s",
                timed_out=True,
            ) from None
        except OSError as exc:  # refused, unreachable, DNS, TLS verification...
            raise TransportFailure("ConnectError", f"{where}: {describe(exc)}") from None
        except UnicodeError:  # a name the resolver's IDNA codec refuses (checked at _target)
            raise InvalidTarget(f"invalid host name {target.host!r}") from None
        return conn

    async def _open_first(
        self,
        target: _Target,
        loop: asyncio.AbstractEventLoop,
        hosts: list[str],
        context: ssl.SSLContext | None,
    ) -> Connection:
        """A connection to the first of ``hosts`` that answers (TLS checks ``target.host``)."""
        failure: OSError | None = None
        for host in hosts:
            try:
                _, conn = await loop.create_connection(
                    lambda: Connection(self, target.key, self.max_response_bytes),
                    host,
                    target.port,
                    ssl=context,
                    server_hostname=target.host if context is not None else None,
                )
            except OSError as exc:
                failure = exc
                continue
            return conn
        assert failure is not None  # hosts is never empty
        raise failure

    def _take_idle(
        self, key: tuple[str, str, int], loop: asyncio.AbstractEventLoop
    ) -> Connection | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        cutoff = loop.time() - self.idle_expiry_s
        while idle:
            conn = idle.pop()
            self._idle_count -= 1
            conn.pooled = False
            if conn.idle_since >= cutoff and conn.clean():
                conn.reused = True
                return conn
            self._close(conn)
        return None

    def _release(self, conn: Connection, loop: asyncio.AbstractEventLoop) -> None:
        if self._closed or conn.closed:
            self._discard(conn)
            return
        now = loop.time()
        conn.idle_since = now
        conn.pooled = True
        idle = self._idle.get(conn.key)
        if idle is None:
            idle = self._idle[conn.key] = collections.deque()
        idle.append(conn)
        self._idle_count += 1
        cutoff = now - self.idle_expiry_s
        while idle and (idle[0].idle_since < cutoff or self._idle_count > self.max_idle):
            self._drop_idle(idle.popleft())
        self._wake_one()

    def _evict_one(self) -> bool:
        """Close one idle connection (to any host) to make room for a new one."""
        for idle in self._idle.values():
            if idle:
                self._drop_idle(idle.popleft())
                return True
        return False

    def _drop_idle(self, conn: Connection) -> None:
        self._idle_count -= 1
        conn.pooled = False
        self._close(conn)

    def _forget(self, conn: Connection) -> None:
        """An idle connection the server closed: out of the pool now, not at its next use."""
        idle = self._idle.get(conn.key)
        if idle is not None and conn in idle:
            idle.remove(conn)
            self._drop_idle(conn)

    def _discard(self, conn: Connection) -> None:
        """A connection that cannot be reused (error, cancellation, ``Connection: close``)."""
        self._uncount(conn)
        conn.abort()

    def _close(self, conn: Connection) -> None:
        """A clean idle connection we no longer want."""
        self._uncount(conn)
        conn.close()

    def _uncount(self, conn: Connection) -> None:
        if conn.counted:
            conn.counted = False
            self._open -= 1
            self._wake_one()


#: A DNS label: letters, digits, ``-`` and ``_`` (seen in the wild), 1-63 characters.
_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")


def check_host_name(host: str) -> str:
    """``host`` as the resolver will be asked for it (IDNA for non-ASCII names), or a
    ``ValueError`` saying why no resolver would take it: a label over 63 characters raises a
    bare ``UnicodeError`` deep in ``getaddrinfo`` otherwise."""
    if ":" in host:  # an IPv6 literal: urlsplit has parsed it
        return host
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError as exc:
            raise ValueError(f"not a valid international name ({exc})") from None
    name = host[:-1] if host.endswith(".") else host
    if len(name) > 253:
        raise ValueError("longer than 253 characters")
    for label in name.split("."):
        if not _LABEL.fullmatch(label):
            what = "longer than 63 characters" if len(label) > 63 else "empty or not a DNS label"
            raise ValueError(f"the label {label[:70]!r} is {what}")
    return host


def _shown(url: str) -> str:
    """``url`` for an error message: a password in it replaced by ``***``."""
    return repr(redact_url(url))
