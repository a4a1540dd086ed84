"""How ``TrainGateClient`` moves bytes: one small interface, several ways to carry a POST.

The client needs little of HTTP: POST a JSON body to a URL, get back the status, a few headers
and the body. Keeping that behind :class:`PostTransport` lets the hot path use the cheapest
carrier that is correct for the target (a lean keep-alive HTTP/1.1 pool, a direct call into an
in-process ASGI app) while ``httpx2`` stays the general fallback: proxies, anything unusual, and
clients that tests or users hand in. Retries, backoff and error wording stay in the client; a
transport only says what happened, with the exceptions below.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable
from urllib.parse import unquote, urlsplit

import anyio
import httpx2

__all__ = [
    "AsgiTransport",
    "DecodeFailure",
    "Httpx2Transport",
    "InvalidTarget",
    "PostTransport",
    "Reply",
    "TransportFailure",
]


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
    the caller's to close.
    """

    def __init__(self, http: httpx2.AsyncClient, *, owned: bool = False) -> None:
        self.http = http
        self._owned = owned

    async def post(self, url: str, content: bytes, headers: Mapping[str, str]) -> Reply:
        """POST through the wrapped client, mapping its exceptions onto this module's."""
        try:
            response = await self.http.post(url, content=content, headers=dict(headers))
        except (httpx2.InvalidURL, httpx2.UnsupportedProtocol) as exc:
            raise InvalidTarget(str(exc)) from None
        except httpx2.DecodingError as exc:
            raise DecodeFailure(str(exc)) from None
        except httpx2.TransportError as exc:
            raise TransportFailure(
                type(exc).__name__, str(exc), timed_out=isinstance(exc, httpx2.TimeoutException)
            ) from None
        return Reply(response.status_code, _lower(response.headers.items()), response.content)

    async def aclose(self) -> None:
        """Close the client when this transport owns it."""
        if self._owned:
            await self.http.aclose()


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
