"""What a carrier of HTTP POSTs is, as ``TrainGateClient`` sees it: :class:`PostTransport`,
the :class:`Reply` it returns and the three failures it may raise, whatever the carrier.

A leaf: it imports nothing of ours, so every carrier and every caller can import it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "MAX_REPLY_BYTES",
    "DecodeFailure",
    "InvalidTarget",
    "PostTransport",
    "Reply",
    "TransportFailure",
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
