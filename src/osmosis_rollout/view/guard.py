"""What every answer of ``osmosis view`` passes through: the Host check and the browser's rules.

The viewer serves every rollout it indexed to whoever asks 127.0.0.1, and a web page can make
the user's browser ask: with DNS rebinding (``attacker.example`` resolving to 127.0.0.1) its
script reads the answers as same-origin. So a request naming any host but the bound names is
refused before routing, and an API request a browser marks as sent by another site is too.
Every response carries a Content-Security-Policy that runs only the viewer's own script file
(nothing inline, nothing from elsewhere) and, with Trusted Types, lets only the page's one
render function write HTML, so a value from a crafted trace that slipped past escaping still
could not run.
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["CONTENT_SECURITY_POLICY", "LOOPBACK_NAMES", "ViewGuard"]

#: The names a browser uses for the viewer's 127.0.0.1 socket.
LOOPBACK_NAMES = ("127.0.0.1", "localhost")

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
        "require-trusted-types-for 'script'",
        "trusted-types osmosis-view",
    ]
)

_HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
]
_HEADER_NAMES = {name for name, _ in _HEADERS}
#: Sec-Fetch-Site values of a request the page itself made (or the user typed).
_OWN_SITE = {b"same-origin", b"none"}


class ViewGuard:
    """ASGI middleware: refuse foreign Host names and cross-site API reads; add the headers."""

    def __init__(self, app: ASGIApp, hosts: Iterable[str] = LOOPBACK_NAMES) -> None:
        self.app = app
        self.hosts = {h.lower() for h in hosts}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        problem = self._refusal(scope, headers)
        if problem is not None:
            await _plain(send, *problem)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", []) if k not in _HEADER_NAMES]
                message = {**message, "headers": kept + _HEADERS}
            await send(message)

        await self.app(scope, receive, send_with_headers)

    def _refusal(self, scope: Scope, headers: dict[bytes, bytes]) -> tuple[int, str] | None:
        host = _host_name(headers.get(b"host", b""))
        if host not in self.hosts:
            names = " or ".join(sorted(self.hosts))
            return 421, f"osmosis view answers only requests for {names}; open {self._url(scope)}"
        site = headers.get(b"sec-fetch-site")
        if str(scope.get("path", "")).startswith("/api/") and site and site not in _OWN_SITE:
            return 403, "osmosis view's data is only for its own page"
        return None

    def _url(self, scope: Scope) -> str:
        server = scope.get("server")
        port = f":{server[1]}" if server and server[1] else ""
        return f"http://127.0.0.1{port}/"


def _host_name(raw: bytes) -> str:
    """The name part of a Host header, lower case (``[::1]:8080`` -> ``[::1]``)."""
    text = raw.decode("latin-1").strip().lower()
    if text.startswith("["):
        return text.split("]", 1)[0] + "]"
    return text.rsplit(":", 1)[0] if ":" in text else text


async def _plain(send: Send, status: int, text: str) -> None:
    body = (text + "\n").encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                (b"cache-control", b"no-store"),
                *_HEADERS,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
