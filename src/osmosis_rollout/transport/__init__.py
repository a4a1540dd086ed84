"""How the toolkit carries HTTP: one small interface, several carriers, one reader for each
thing every caller reads.

The server's ``TrainGateClient`` needs little of HTTP: POST a JSON body to a URL, get back the
status, a few headers and the body. Keeping that behind :class:`PostTransport` lets the hot path
use the cheapest carrier that is correct for the target while ``httpx2`` stays the general one:

- :class:`Http1Transport` (``http1.py`` + ``http1_connection.py``): a lean keep-alive HTTP/1.1
  pool on asyncio and ``httptools``, the default on asyncio without a proxy (it needs
  ``httptools``, so it is imported on first use);
- :class:`Httpx2Transport` (``httpx2.py``): over an ``httpx2.AsyncClient``: proxies, trio,
  clients that tests or users hand in;
- :class:`AsgiTransport` (``asgi.py``): a direct call of an ASGI app in this process.

Retries, backoff and error wording stay with the callers; a carrier only says what happened,
with the exceptions of ``types.py``. What every caller reads the same way lives here once: a
reply body, bounded (``bodies.py``), a ``Retry-After`` header (``retry_after.py``) and a
chat-completions event stream (``sse.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .asgi import AsgiApp, AsgiTransport
from .bodies import decode_body, read_capped, size_text
from .destination import check_call
from .httpx2 import Httpx2Transport, guard_connections
from .retry_after import parse_retry_after
from .sse import read_event_stream
from .types import (
    MAX_REPLY_BYTES,
    DecodeFailure,
    InvalidTarget,
    PostTransport,
    Reply,
    TransportFailure,
)

if TYPE_CHECKING:
    from .http1 import Http1Transport

__all__ = [
    "MAX_REPLY_BYTES",
    "AsgiApp",
    "AsgiTransport",
    "DecodeFailure",
    "Http1Transport",
    "Httpx2Transport",
    "InvalidTarget",
    "PostTransport",
    "Reply",
    "TransportFailure",
    "check_call",
    "decode_body",
    "guard_connections",
    "parse_retry_after",
    "read_capped",
    "read_event_stream",
    "size_text",
]


def __getattr__(name: str) -> Any:
    """``Http1Transport`` on first use: it imports ``httptools``, which a pure-Python install
    may lack (``ImportError`` then, which ``client.default_transport`` takes as "use httpx2")."""
    if name == "Http1Transport":
        from .http1 import Http1Transport

        return Http1Transport
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
