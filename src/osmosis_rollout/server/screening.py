"""Request screening: what every request to every route must pass before any handler runs.

A rollout server on 127.0.0.1 without a key trusts its network boundary, and a web page in the
user's browser sits inside it: the page can POST to ``http://127.0.0.1:9000`` (a "simple"
request, ``text/plain``, no preflight), or reach it under its own name after rebinding that
name to 127.0.0.1. Three checks close those doors, each on its own:

- a request carrying ``Origin`` (browsers add it to every cross-origin POST and fetch) is 403
  unless its origin is allowed (``--allow-origin``); TrainGate and curl send none;
- a ``Host`` that is not the server's own name (the address the request arrived at, the
  loopback names when that is loopback, names allowed with ``--allow-host``) is 400: a page
  that rebinds its own name still sends its own name as ``Host``. A server bound to a wildcard
  address (0.0.0.0, ::) answers to any name unless ``--allow-host`` is given: it is reachable
  from the network anyway, and has a key;
- a server configured for loopback without a key (the default) refuses a request that arrived
  at a network address (403): the app may be served by a command we do not control
  (``uvicorn v1_agent:app --host 0.0.0.0``), and what it trusts on loopback it must not trust
  from the network; give it a key, or serve it with ``osmosis serve``, which makes one up;
- a POST with a body must say ``Content-Type: application/json`` (parameters allowed), else
  415: the content types a page may send without a preflight are all refused. Authentication
  still comes first: a request without the server's key is left to its route's 401, so a
  caller without the key learns nothing about the body's format.

The middleware is pure ASGI (no request object) so the screened path costs a header scan.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from ..destinations import as_address
from .auth import is_loopback, key_matches

__all__ = ["HostRule", "Screening"]

_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_WILDCARDS = frozenset({"0.0.0.0", "::", ""})
_BODY_METHODS = frozenset({b"POST", b"PUT", b"PATCH"})
_MAX_PLACES = 256


class HostRule:
    """Which ``Host`` names a server answers to: its own, and those configured."""

    def __init__(self, bound_host: str, allowed: Iterable[str] = ()) -> None:
        names = {_host_name(name) for name in allowed}
        bound = bound_host.strip("[]").lower()
        self.any = "*" in names or (not names and bound in _WILDCARDS)
        self.names = frozenset(names - {"*"} | ({bound} - _WILDCARDS))

    def allows(self, host: str, arrived_at: str | None) -> bool:
        """Whether a request naming ``host`` that arrived at address ``arrived_at`` is served."""
        if self.any:
            return True
        name = _host_name(host)
        if name in self.names or (arrived_at is not None and name == _host_name(arrived_at)):
            return True
        local = arrived_at is not None and is_loopback(arrived_at)
        return local and (name in _LOOPBACK_NAMES or name.endswith(".localhost"))


def _from_network(arrived_at: str | None) -> bool:
    """Whether the listening address a request arrived at is a network one (an IP literal that
    is not loopback); an unknown or non-IP address (an in-process test client) is not."""
    if arrived_at is None:
        return False
    address = as_address(arrived_at.strip("[]"))
    return address is not None and not address.is_loopback


def _host_name(host: str) -> str:
    """``host`` (a ``Host`` header: name, ``name:port``, ``[v6]:port``) as a bare lower name."""
    text = host.strip().lower()
    if text.startswith("["):
        return text[1:].partition("]")[0]
    if text.count(":") == 1:
        text = text.partition(":")[0]
    return text.rstrip(".")


class Screening:
    """ASGI middleware refusing requests from web pages and to foreign host names."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        hosts: HostRule,
        origins: Iterable[str] = (),
        server_key: str | None = None,
        on_refusal: Callable[[str, str], None] | None = None,
        loopback_only: bool = False,
    ) -> None:
        self.app = app
        self.hosts = hosts
        self.server_key = server_key
        #: Configured for loopback with no key: a request that arrived at a network address is
        #: refused (the app is being served wider than it was built for).
        self.loopback_only = loopback_only and server_key is None
        #: Told (path, cause) of each refusal: the metrics count refused inits by cause.
        self.on_refusal = on_refusal
        allowed = {origin.strip().rstrip("/").lower() for origin in origins}
        self.any_origin = "*" in allowed
        self.origins = frozenset(allowed - {"*"})
        #: ``_place_refusal``'s verdicts by (Host header, address arrived at): the same two
        #: values on nearly every request, and parsing them was most of the screening's cost.
        #: Bounded (a client chooses the Host header): it starts over at ``_MAX_PLACES``.
        self._places: dict[tuple[bytes | None, str | None], tuple[int, str, str] | None] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self.refusal(scope)
            if refusal is not None:
                status, cause, message = refusal
                if self.on_refusal is not None:
                    self.on_refusal(scope["path"], cause)
                await _refuse(send, status, message)
                return
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope) -> tuple[int, str, str] | None:
        """The status, cause (a metrics label) and message to refuse ``scope`` with, or None
        to serve it."""
        host = origin = content_type = length = chunked = authorization = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value
            elif name == b"host":
                host = value
            elif name == b"origin":
                origin = value
            elif name == b"content-type":
                content_type = value
            elif name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                chunked = value
        if origin is not None and not self._origin_allowed(origin):
            return (
                403,
                "web_page",
                (
                    "requests from web pages are refused (the request has an Origin header); "
                    "to serve this page start the server with --allow-origin ORIGIN"
                ),
            )
        server = scope.get("server")
        arrived_at = str(server[0]) if server else None
        place = (host, arrived_at)
        try:
            refused = self._places[place]
        except KeyError:
            refused = self._place_refusal(host, arrived_at)
            if len(self._places) >= _MAX_PLACES:
                self._places.clear()
            self._places[place] = refused
        if refused is not None:
            return refused
        if scope["method"].encode() in _BODY_METHODS and (
            chunked is not None or (length is not None and length.strip() not in (b"", b"0"))
        ):
            media = (content_type or b"").partition(b";")[0].strip().lower()
            if media != b"application/json" and self._authorized(authorization):
                return 415, "not_json", "the body must be JSON: send Content-Type: application/json"
        return None

    def _place_refusal(
        self, host: bytes | None, arrived_at: str | None
    ) -> tuple[int, str, str] | None:
        """The refusal owed to where a request arrived and the name it gives (or None): a
        function of the two alone, so ``refusal`` keeps each verdict (``_places``)."""
        if self.loopback_only and _from_network(arrived_at):
            return (
                403,
                "network_without_key",
                (
                    "this server has no API key, so it answers only on loopback; give it a key "
                    "(api_key=..., --api-key) or serve it with `osmosis serve`, which makes one up"
                ),
            )
        if host is not None and not self.hosts.allows(host.decode("latin-1"), arrived_at):
            return (
                400,
                "foreign_host",
                (
                    "the Host header does not name this server (a DNS rebinding page?); "
                    "to serve this name start the server with --allow-host NAME"
                ),
            )
        return None

    def _authorized(self, header: bytes | None) -> bool:
        if self.server_key is None:
            return True
        return header is not None and key_matches(header.decode("latin-1"), self.server_key)

    def _origin_allowed(self, origin: bytes) -> bool:
        if self.any_origin:
            return True
        return origin.decode("latin-1").strip().rstrip("/").lower() in self.origins


async def _refuse(send: Send, status: int, message: str) -> None:
    body = json.dumps({"detail": message}).encode()
    # The body (if any) is not read: the connection closes after the answer.
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
