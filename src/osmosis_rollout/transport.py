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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import httpx2

__all__ = [
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
        #: Parsed URLs by string: every rollout posts to the same two or so, and parsing one
        #: costs httpx2 ~0.05 ms. Cleared when it grows past _MAX_URLS (many TrainGates).
        self._urls: dict[str, httpx2.URL] = {}

    async def post(self, url: str, content: bytes, headers: Mapping[str, str]) -> Reply:
        """POST through the wrapped client, mapping its exceptions onto this module's."""
        try:
            target = self._urls.get(url) or self._parse(url)
            response = await self.http.post(target, content=content, headers=dict(headers))
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

    def _parse(self, url: str) -> httpx2.URL:
        parsed = httpx2.URL(url)  # InvalidURL for a bad one: nothing is kept
        if len(self._urls) >= _MAX_URLS:
            self._urls.clear()
        self._urls[url] = parsed
        return parsed


_MAX_URLS = 256


def _lower(items: Any) -> dict[str, str]:
    return {name.lower(): value for name, value in items}
