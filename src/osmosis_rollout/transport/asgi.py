"""``AsgiTransport``: :class:`~.types.PostTransport` into an ASGI app in this process, one
direct call of the app per request: how ``osmosis test`` sends each init to the real server app
(its routing, auth and limits run) with no socket and no HTTP client objects.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import anyio

from .types import InvalidTarget, Reply, TransportFailure

__all__ = ["AsgiApp", "AsgiTransport"]

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
