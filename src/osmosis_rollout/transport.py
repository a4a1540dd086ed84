"""How ``TrainGateClient`` moves bytes: one small interface, several ways to carry a POST.

The client needs little of HTTP: POST a JSON body to a URL, get back the status, a few headers
and the body. Keeping that behind :class:`PostTransport` lets the hot path use the cheapest
carrier that is correct for the target (a lean keep-alive HTTP/1.1 pool, a direct call into an
in-process ASGI app) while ``httpx2`` stays the general fallback: proxies, anything unusual, and
clients that tests or users hand in. Retries, backoff and error wording stay in the client; a
transport only says what happened, with the exceptions below.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable
from urllib.parse import unquote, urlsplit

import anyio
import httpx2

from .destinations import DestinationPolicy, DestinationRefused

__all__ = [
    "MAX_REPLY_BYTES",
    "AsgiTransport",
    "DecodeFailure",
    "Httpx2Transport",
    "InvalidTarget",
    "PostTransport",
    "Reply",
    "TransportFailure",
    "decode_body",
    "size_text",
]

#: The largest reply body kept by default, raw and once decompressed: a TrainGate reply is a
#: few KB, and each call in flight may hold this much (twice: raw and decoded) at worst.
MAX_REPLY_BYTES = 4 * 2**20


@dataclass(slots=True)
class Reply:
    """One HTTP response, read whole. ``headers`` has lower-case names (last value wins)."""

    status_code: int
    headers: Mapping[str, str]
    content: bytes

    @property
    def text(self) -> str:
        """The body as text (UTF-8, undecodable bytes replaced: this is for error messages)."""
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        """The body parsed as JSON (``ValueError`` when it is not JSON)."""
        return json.loads(self.content)


class InvalidTarget(Exception):
    """The URL cannot be called at all (malformed, or a scheme we do not speak): not retried."""


class TransportFailure(Exception):
    """No response arrived (connect refused, reset, timed out...): the caller may retry.

    ``kind`` names the failure in httpx2's words (``ConnectError``, ``ReadTimeout``...) whatever
    the transport, so messages and logs read the same; ``timed_out`` tells a timeout from any
    other failure, for the error the user finally sees. The message is the detail (may be "").
    """

    def __init__(self, kind: str, detail: str = "", *, timed_out: bool = False) -> None:
        super().__init__(detail)
        self.kind = kind
        self.timed_out = timed_out


class DecodeFailure(Exception):
    """A response arrived but its body could not be decoded (bad ``Content-Encoding``...)."""


@runtime_checkable
class PostTransport(Protocol):
    """What ``TrainGateClient`` needs from a carrier of HTTP POSTs."""

    async def post(self, url: str, content: bytes, headers: Mapping[str, str]) -> Reply:
        """POST ``content`` to ``url`` with ``headers``; raise the exceptions of this module."""
        ...

    async def aclose(self) -> None:
        """Release connections; the transport is not used again."""
        ...


class Httpx2Transport:
    """:class:`PostTransport` over an ``httpx2.AsyncClient`` (the general fallback).

    ``owned`` says whether :meth:`aclose` closes the client: a client handed in by a caller is
    the caller's to close. With ``destinations`` each call's host is checked first: its
    resolved addresses when ``resolve`` (no proxy: httpx2 then resolves the same name a moment
    later), else only the URL's host (a proxy resolves names itself). The reply is read raw and
    decoded here, both bounded by ``max_reply_bytes`` (``httpx2`` would inflate a gzip bomb or
    read an endless body whole), and the whole call, body included, ends by ``deadline_s``
    (``httpx2``'s timeouts are per read, so a reply dripping a byte a second would never end).
    """

    def __init__(
        self,
        http: httpx2.AsyncClient,
        *,
        owned: bool = False,
        destinations: DestinationPolicy | None = None,
        resolve: bool = True,
        max_reply_bytes: int = MAX_REPLY_BYTES,
        deadline_s: float | None = None,
    ) -> None:
        self.http = http
        self._owned = owned
        self._destinations = destinations
        self._resolve = resolve
        self.max_reply_bytes = max_reply_bytes
        self.deadline_s = deadline_s

    async def post(self, url: str, content: bytes, headers: Mapping[str, str]) -> Reply:
        """POST through the wrapped client, mapping its exceptions onto this module's."""
        if self._destinations is not None:
            await check_call(self._destinations, url, resolve=self._resolve)
        sent = dict(headers)
        if not any(name.lower() == "accept-encoding" for name in sent):
            sent["Accept-Encoding"] = "gzip, deflate"  # what decode_body undoes
        if "@" in url:  # user:password@: sent as Basic auth, never in a URL httpx2 logs
            url, basic = _without_userinfo(url)
            if basic is not None:
                sent = {k: v for k, v in sent.items() if k.lower() != "authorization"}
                sent["Authorization"] = basic
        try:
            with anyio.fail_after(self.deadline_s):
                async with self.http.stream("POST", url, content=content, headers=sent) as reply:
                    if reply.is_stream_consumed:  # built whole in memory (a mock): decoded
                        return self._whole(reply)
                    raw = await self._read(reply)
        except TimeoutError:
            raise TransportFailure(
                "ReadTimeout",
                f"no complete response within {self.deadline_s:.3g}s",
                timed_out=True,
            ) from None
        except (httpx2.InvalidURL, httpx2.UnsupportedProtocol) as exc:
            raise InvalidTarget(str(exc)) from None
        except httpx2.DecodingError as exc:
            raise DecodeFailure(str(exc)) from None
        except httpx2.TransportError as exc:
            raise TransportFailure(
                type(exc).__name__, str(exc), timed_out=isinstance(exc, httpx2.TimeoutException)
            ) from None
        found = _lower(reply.headers.items())
        return Reply(reply.status_code, found, decode_body(found, raw, self.max_reply_bytes))

    def _whole(self, reply: httpx2.Response) -> Reply:
        if len(reply.content) > self.max_reply_bytes:
            raise DecodeFailure(
                f"the response body is larger than {size_text(self.max_reply_bytes)}"
            )
        return Reply(reply.status_code, _lower(reply.headers.items()), reply.content)

    async def _read(self, reply: httpx2.Response) -> bytes:
        limit = self.max_reply_bytes
        declared = reply.headers.get("content-length", "")
        if declared.strip().isdigit() and int(declared) > limit:
            raise DecodeFailure(f"the response body is larger than {size_text(limit)}")
        return await read_capped(reply.aiter_raw(), limit)

    async def aclose(self) -> None:
        """Close the client when this transport owns it."""
        if self._owned:
            await self.http.aclose()


async def check_call(policy: DestinationPolicy, url: str, *, resolve: bool) -> list[str]:
    """The addresses ``url``'s host resolves to, each allowed by ``policy`` (``InvalidTarget``
    when one is not; ``TransportFailure`` when the name does not resolve); only the URL's host
    is checked when not ``resolve``."""
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        host = parts.hostname or ""
        if not resolve:
            policy.check_host(host, port)
            return []
        return await policy.resolve(host, port)
    except DestinationRefused as exc:
        raise InvalidTarget(f"destination refused: {exc}") from None
    except ValueError as exc:
        raise InvalidTarget(f"invalid URL {url!r}: {exc}") from None
    except OSError as exc:
        raise TransportFailure("ConnectError", f"{host}: {exc.strerror or exc}") from None


def guard_connections(http: httpx2.AsyncClient, policy: DestinationPolicy) -> bool:
    """Make ``http``'s direct connections (not those through a proxy) check ``policy`` on the
    addresses they resolve to and connect to a checked one, as ``Http1Transport`` does; False
    when ``http`` is not built the way this expects (then check each call instead).

    httpx2 has no public hook for this: the network backend of its default pool is wrapped.
    """
    import httpcore2

    pool = getattr(getattr(http, "_transport", None), "_pool", None)
    inner = getattr(pool, "_network_backend", None)
    if not isinstance(pool, httpcore2.AsyncConnectionPool) or inner is None:
        return False
    pool._network_backend = _guarded_backend(inner, policy)
    return True


def _guarded_backend(inner: Any, policy: DestinationPolicy) -> Any:
    import httpcore2

    class GuardedBackend(httpcore2.AsyncNetworkBackend):
        """Resolves and checks before connecting; refusals are not retried."""

        async def connect_tcp(
            self,
            host: str,
            port: int,
            timeout: float | None = None,  # noqa: ASYNC109  # httpcore2's signature
            local_address: str | None = None,
            socket_options: Any = None,
        ) -> Any:
            try:
                addresses = await policy.resolve(host, port)
            except DestinationRefused as exc:
                raise httpcore2.UnsupportedProtocol(f"destination refused: {exc}") from None
            except OSError as exc:
                raise httpcore2.ConnectError(f"{host}: {exc.strerror or exc}") from None
            failure: Exception | None = None
            for address in addresses:
                try:
                    return await inner.connect_tcp(
                        address,
                        port,
                        timeout=timeout,
                        local_address=local_address,
                        socket_options=socket_options,
                    )
                except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as exc:
                    failure = exc
            assert failure is not None  # resolve never returns an empty list
            raise failure

        async def connect_unix_socket(self, *args: Any, **kwargs: Any) -> Any:
            return await inner.connect_unix_socket(*args, **kwargs)

        async def sleep(self, seconds: float) -> None:
            await inner.sleep(seconds)

    return GuardedBackend()


def _without_userinfo(url: str) -> tuple[str, str | None]:
    """``url`` without ``user:password@``, and the Basic ``Authorization`` value it meant."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url, None
    if parts.username is None:
        return url, None
    secret = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
    host = parts.netloc.rpartition("@")[2]
    plain = parts._replace(netloc=host).geturl()
    return plain, "Basic " + base64.b64encode(secret.encode()).decode()


async def read_capped(chunks: AsyncIterator[bytes], limit: int) -> bytes:
    """The chunks joined, or ``DecodeFailure`` as soon as they pass ``limit`` bytes."""
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise DecodeFailure(f"the response body is larger than {size_text(limit)}")
        parts.append(chunk)
    return b"".join(parts)


def size_text(size: int) -> str:
    """``4 MiB``, ``512 KiB``: a byte limit as people read it."""
    if size >= 2**20 and not size % 2**20:
        return f"{size // 2**20} MiB"
    if size >= 1024:
        return f"{size / 1024:g} KiB"
    return f"{size} bytes"


def decode_body(headers: Mapping[str, str], body: bytes, limit: int) -> bytes:
    """``body`` with its ``Content-Encoding`` undone (gzip, deflate; DecodeFailure otherwise),
    never inflated past ``limit`` bytes (a 64 KiB gzip bomb would be 64 MiB)."""
    coding = headers.get("content-encoding")
    if not coding or not body:
        return body
    for token in reversed(coding.split(",")):
        token = token.strip().lower()
        if token in ("", "identity"):
            continue
        if token in ("gzip", "x-gzip"):
            body = _inflate(body, zlib.MAX_WBITS | 16, limit)
        elif token == "deflate":
            try:
                body = _inflate(body, zlib.MAX_WBITS, limit)
            except DecodeFailure:  # some servers send raw deflate without the zlib wrapper
                body = _inflate(body, -zlib.MAX_WBITS, limit)
        else:
            raise DecodeFailure(f"unsupported Content-Encoding {token!r}")
    return body


def _inflate(data: bytes, wbits: int, limit: int) -> bytes:
    inflater: Any = zlib.decompressobj(wbits)
    try:
        out: bytes = inflater.decompress(data, limit + 1)
    except zlib.error as exc:
        raise DecodeFailure(f"the response body is not valid compressed data ({exc})") from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise DecodeFailure(f"the decompressed response is larger than {size_text(limit)}")
    if not inflater.eof:
        raise DecodeFailure("the compressed response body is truncated")
    return out


def _lower(items: Any) -> dict[str, str]:
    return {name.lower(): value for name, value in items}


_Message = MutableMapping[str, Any]
#: An ASGI application: ``await app(scope, receive, send)``.
AsgiApp = Callable[
    [_Message, Callable[[], Awaitable[_Message]], Callable[[_Message], Awaitable[None]]],
    Awaitable[None],
]


@dataclass(frozen=True, slots=True)
class _Target:
    """What an ASGI scope needs of a URL."""

    scheme: str
    host: str
    port: int
    path: str
    raw_path: bytes
    query: bytes
    host_header: bytes


class AsgiTransport:
    """:class:`PostTransport` into an ASGI app in this process: one call of the app per POST.

    The app sees what a real client would send (``host`` and ``content-length`` headers, the
    whole body in one ``http.request`` message, ``http.disconnect`` once the response is out),
    but nothing else is paid for: no request or URL objects, no task group, no stream
    wrappers. An exception raised by the app propagates to the caller, as with
    ``httpx2.ASGITransport``'s default. ``client`` is the peer address the app sees.
    """

    def __init__(self, app: AsgiApp, *, client: tuple[str, int] = ("127.0.0.1", 123)) -> None:
        self.app = app
        self.client = client

    async def post(self, url: str, content: bytes, headers: Mapping[str, str]) -> Reply:
        """Call the app with one POST and collect its response."""
        return await self.request("POST", url, content, headers)

    async def get(self, url: str, headers: Mapping[str, str]) -> Reply:
        """Call the app with one GET (a v2 controller's status reads)."""
        return await self.request("GET", url, b"", headers)

    async def request(
        self, method: str, url: str, content: bytes, headers: Mapping[str, str]
    ) -> Reply:
        """Call the app with one request and collect its response."""
        target = self._parse(url)
        raw_headers = [(b"host", target.host_header)]
        raw_headers += [
            (name.lower().encode("latin-1"), value.encode("latin-1"))
            for name, value in headers.items()
            if name.lower() not in ("host", "content-length")
        ]
        raw_headers.append((b"content-length", str(len(content)).encode()))
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": target.scheme,
            "path": target.path,
            "raw_path": target.raw_path,
            "query_string": target.query,
            "root_path": "",
            "headers": raw_headers,
            "server": (target.host, target.port),
            "client": self.client,
        }
        status: int | None = None
        reply_headers: dict[str, str] = {}
        body: list[bytes] = []
        request_sent = False
        finished = False
        finished_event: anyio.Event | None = None

        async def receive() -> _Message:
            nonlocal request_sent, finished_event
            if not request_sent:
                request_sent = True
                return {"type": "http.request", "body": content, "more_body": False}
            if not finished:  # the app listens for a disconnect: it comes after the response
                if finished_event is None:
                    finished_event = anyio.Event()
                await finished_event.wait()
            return {"type": "http.disconnect"}

        async def send(message: _Message) -> None:
            nonlocal status, finished
            kind = message["type"]
            if kind == "http.response.start":
                status = message["status"]
                for name, value in message.get("headers", ()):
                    reply_headers[name.decode("latin-1").lower()] = value.decode("latin-1")
            elif kind == "http.response.body" and not finished:
                chunk = message.get("body", b"")
                if chunk:
                    body.append(chunk)
                if not message.get("more_body", False):
                    finished = True
                    if finished_event is not None:
                        finished_event.set()

        await self.app(scope, receive, send)
        if status is None or not finished:
            raise TransportFailure(
                "RemoteProtocolError", f"the app at {url} returned without a complete response"
            )
        return Reply(status, reply_headers, body[0] if len(body) == 1 else b"".join(body))

    async def aclose(self) -> None:
        """Nothing to release: there are no connections."""

    def _parse(self, url: str) -> _Target:
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise InvalidTarget(f"invalid URL {url!r}: {exc}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidTarget(f"cannot POST to {url!r}: an http(s) URL with a host is needed")
        default = 443 if parts.scheme == "https" else 80
        path = parts.path or "/"
        return _Target(
            scheme=parts.scheme,
            host=parts.hostname,
            port=port or default,
            path=unquote(path),
            raw_path=path.encode("ascii", "replace"),
            query=parts.query.encode("ascii", "replace"),
            host_header=parts.netloc.rpartition("@")[2].encode("ascii", "replace"),
        )
