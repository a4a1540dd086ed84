"""Limits on the server's connections, so that idle or slow peers cannot use up its files.

uvicorn bounds neither the number of open connections (``limit_concurrency`` answers 503 only
once a request's headers are in, and keeps the idle socket), nor the time a request's head may
take (its keep-alive timer restarts on every byte: a header sent one byte every 2 s was still
accepted after 70 s), nor, with httptools, the head's size (60 MB of headers got a 200). The
protocol classes below are uvicorn's own with three additions:

- past ``max_connections`` open connections, a new one is answered ``503`` at once and closed
  (its file handle is freed at once, not when a timer fires);
- a request's line and headers must be complete within ``header_timeout_s`` of the connection's
  start or of the previous response (then ``408`` and close; an idle connection is just closed);
- they must be at most ``max_header_bytes`` (then ``431`` and close; counted as they arrive, so
  at most one read beyond the bound is ever buffered).

``raise_file_limit`` lifts the soft file limit to the hard one at start: the default soft limit
(often 1,024) is what let idle sockets starve a server of files. docs/security.md, "Resource
limits", says what a deployer should know.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass
from typing import Any

import uvicorn

__all__ = [
    "ConnectionLimits",
    "LimitedConfig",
    "auto_max_connections",
    "file_limit",
    "protocol_class",
    "raise_file_limit",
]

logger = logging.getLogger("osmosis_rollout.server")

#: The most connections the automatic bound allows, whatever the file limit.
_MAX_AUTO_CONNECTIONS = 4096


@dataclass(frozen=True)
class ConnectionLimits:
    """What one server allows each connection (``LimitedConfig`` carries it to the protocol)."""

    max_connections: int
    header_timeout_s: float = 10.0
    max_header_bytes: int = 64 * 1024


class LimitedConfig(uvicorn.Config):
    """uvicorn's ``Config`` with the :class:`ConnectionLimits` the protocol classes read."""

    def __init__(self, app: Any, *, limits: ConnectionLimits, **options: Any) -> None:
        super().__init__(app, **options)
        self.limits = limits


def file_limit() -> tuple[int, int]:
    """The process's (soft, hard) limit on open files (a large number where there is none)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return (_MAX_AUTO_CONNECTIONS * 4, _MAX_AUTO_CONNECTIONS * 4)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    infinite = resource.RLIM_INFINITY
    return (2**31 if soft == infinite else soft, 2**31 if hard == infinite else hard)


def raise_file_limit() -> tuple[int, int]:
    """Lift the soft limit on open files to the hard limit; returns (soft, hard) after."""
    with contextlib.suppress(ImportError, ValueError, OSError):
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return file_limit()


def auto_max_connections(soft_file_limit: int) -> int:
    """A quarter of the file limit (the rest is for TrainGate calls, traces, the outbox),
    at least 16 and at most 4,096."""
    return max(16, min(_MAX_AUTO_CONNECTIONS, soft_file_limit // 4))


def _reply(status: bytes, detail: str) -> bytes:
    body = json.dumps({"detail": detail}).encode()
    return (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)
    ) + body


class _HeadGuard:
    """The additions, mixed into a uvicorn HTTP protocol class (see the module docstring)."""

    # What the uvicorn class provides.
    config: Any
    connections: set[Any]
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    _limits: ConnectionLimits
    _in_head: bool
    _head_bytes: int
    _head_timer: asyncio.TimerHandle | None

    def _guard_start(self, transport: asyncio.Transport) -> bool:
        """At connection_made: False when the connection was refused."""
        limits = getattr(self.config, "limits", None)
        self._limits = limits if isinstance(limits, ConnectionLimits) else ConnectionLimits(10**9)
        self._head_timer = None
        if len(self.connections) > self._limits.max_connections:
            logger.warning(
                "connection refused: %d open connections (max_connections)",
                self._limits.max_connections,
            )
            detail = f"too many open connections (the limit is {self._limits.max_connections})"
            transport.write(_reply(b"503 Service Unavailable", f"{detail}; retry later"))
            transport.close()
            return False
        self._await_head()
        return True

    def _await_head(self) -> None:
        """A request's head is due: start counting its bytes and its time."""
        self._in_head = True
        self._head_bytes = 0
        self._cancel_timer()
        self._head_timer = self.loop.call_later(self._limits.header_timeout_s, self._head_late)

    def _head_done(self) -> None:
        self._in_head = False
        self._cancel_timer()

    def _cancel_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if not self._in_head or self.transport.is_closing():
            return
        if self._head_bytes:  # a request started but its head dripped in too slowly
            late = f"the request headers took longer than {self._limits.header_timeout_s:g} s"
            self.transport.write(_reply(b"408 Request Timeout", late))
        self.transport.close()

    def _head_too_big(self) -> None:
        self._in_head = False
        self._cancel_timer()
        limit = self._limits.max_header_bytes
        detail = f"the request line and headers are larger than {limit // 1024} KiB"
        self.transport.write(_reply(b"431 Request Header Fields Too Large", detail))
        self.transport.close()


def protocol_class(http: str) -> type[asyncio.Protocol]:
    """The guarded protocol class for uvicorn's ``http`` choice (``httptools`` or ``h11``)."""
    if http == "httptools":
        return _httptools_class()
    return _h11_class()


def _httptools_class() -> type[asyncio.Protocol]:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class GuardedHttpTools(_HeadGuard, HttpToolsProtocol):
        """uvicorn's httptools protocol with the connection limits."""

        _too_big = False
        _head_size = 0  # bytes of the current head's line and headers, as parsed

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._guard_start(transport)

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_timer()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self.transport.is_closing():
                return
            if self._in_head:
                self._head_bytes += len(data)
            super().data_received(data)
            # Still in the head after all these bytes: every one of them was head.
            if self._in_head and self._head_bytes > self._limits.max_header_bytes:
                self._head_too_big()

        def on_url(self, url: bytes) -> None:
            self._count(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count(len(name) + len(value) + 4)
            super().on_header(name, value)

        def _count(self, size: int) -> None:
            self._head_size += size
            if self._head_size > self._limits.max_header_bytes:
                self._too_big = True

        def on_message_begin(self) -> None:
            self._head_size = 0
            super().on_message_begin()

        def on_headers_complete(self) -> None:
            self._head_done()
            if self._too_big:  # the whole head came in one read, larger than allowed
                self._head_too_big()
                return
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if not self._too_big:
                super().on_body(body)

        def on_message_complete(self) -> None:
            if not self._too_big:
                super().on_message_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and not self.pipeline:
                self._await_head()

    return GuardedHttpTools


def _h11_class() -> type[asyncio.Protocol]:
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11(_HeadGuard, H11Protocol):
        """uvicorn's h11 protocol with the connection limits (the head's size counted up to
        its blank line, as h11's own bound does not count a head that arrives in one read)."""

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._guard_start(transport)

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_timer()
            super().connection_lost(exc)

        _tail = b""  # the last bytes of the head so far: its end may span two reads

        def data_received(self, data: bytes) -> None:
            if self.transport.is_closing():
                return
            if self._in_head:
                if self._head_bytes == 0:
                    self._tail = b""
                seen = self._tail + data
                end = seen.find(b"\r\n\r\n")
                grown = end + 4 - len(self._tail) if end >= 0 else len(data)
                self._head_bytes += grown
                self._tail = seen[-3:]
                if self._head_bytes > self._limits.max_header_bytes:  # h11 only bounds a
                    self._head_too_big()  # head still incomplete, not one read whole
                    return
            super().data_received(data)
            if self._in_head and self.conn.their_state is not h11.IDLE:
                self._head_done()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self._await_head()

    return GuardedH11
