"""One connection of ``Http1Transport``'s pool: an ``asyncio.Protocol`` that sends a request and
reads its response with ``httptools``' C parser, bounded (head, body, decoded body), and knows
whether it is clean enough to be reused. ``http1.py`` owns the pool and the requests.
"""

from __future__ import annotations

import asyncio
import select
import ssl
from typing import Protocol, cast

import httptools
import httpx2

from .bodies import decode_body, size_text
from .types import DecodeFailure, TransportFailure

__all__ = [
    "Connection",
    "Pool",
    "decode_body",
    "default_ssl_context",
    "describe",
    "protocol_error",
    "settle",
]

#: The most bytes of status line and headers read before the body starts.
_MAX_HEAD_BYTES = 64 * 1024


class Pool(Protocol):
    """What a connection tells its pool: the server closed it while it sat idle."""

    def _forget(self, conn: Connection) -> None: ...


class Connection(asyncio.Protocol):
    """One TCP (or TLS) connection and the response being read on it."""

    # The response being read (reset by _start).
    _reply: asyncio.Future[tuple[int, dict[str, str], bytes]] | None
    _status: int
    _headers: dict[str, str]
    _body: list[bytes]
    _size: int
    _head_size: int
    _header_bytes: int
    _oversized: bool
    _framed: bool
    _headers_done: bool
    #: Bytes of a second response arrived with the first: the connection is dirty.
    _extra: bool

    def __init__(self, pool: Pool, key: tuple[str, str, int], limit: int) -> None:
        self.pool = pool
        self.key = key
        self.limit = limit
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.fd = -1
        self.counted = True
        self.closed = False
        self.pooled = False
        self.reused = False
        self.idle_since = 0.0
        self.keep_alive = False
        self.answered = False
        self._drain: asyncio.Future[None] | None = None
        self._paused = False
        self._timeout = 0.0
        self._start(None)

    # -- used by the pool -------------------------------------------------------------------

    async def exchange(self, request: bytes, deadline: float) -> tuple[int, dict[str, str], bytes]:
        """Send ``request`` and read the whole response, by ``deadline`` (loop time)."""
        transport = self.transport
        assert transport is not None
        if self.closed:  # the server hung up between connect and now
            raise protocol_error("the server closed the connection before the request was sent")
        loop = asyncio.get_running_loop()
        reply: asyncio.Future[tuple[int, dict[str, str], bytes]] = loop.create_future()
        self._start(reply)
        self.answered = False
        self._timeout = deadline - loop.time()
        timer = loop.call_at(deadline, self._timed_out)
        try:
            transport.write(request)
            if self._paused:
                drain = self._drain = loop.create_future()
                try:
                    await drain
                finally:
                    self._drain = None
            return await reply
        finally:
            timer.cancel()
            if reply.done() and not reply.cancelled():
                reply.exception()  # retrieved: a failure after a write error is not "lost"

    def sent(self) -> bool:
        """Whether the whole request left (a server may answer before reading all of it)."""
        return self.transport is not None and not self.transport.get_write_buffer_size()

    def clean(self) -> bool:
        """Safe to send on: open, and nothing (EOF, stray bytes) waiting to be read."""
        return not self.closed and not _readable(self.fd)

    def abort(self) -> None:
        """Drop the connection at once (mid-response, after an error or a cancellation)."""
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        """Close a clean connection politely (FIN, or TLS close_notify)."""
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            self.fd = sock.fileno()

    def data_received(self, data: bytes) -> None:
        reply = self._reply
        if reply is None or reply.done():
            self._stray()  # bytes nobody asked for: this connection cannot be trusted again
            return
        self.answered = True
        if not self._headers_done:
            self._head_size += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if not reply.done():
                self._fail(protocol_error("the server switched protocols (101)"))
            self._stray()
            return
        except httptools.HttpParserError as exc:
            if not reply.done():
                self._fail(protocol_error(f"malformed HTTP response: {exc}"))
            self._stray()
            return
        if self._extra:  # bytes of a response nobody asked for: never reuse this connection
            self._stray()
            return
        if self._head_size > _MAX_HEAD_BYTES and (self._oversized or not self._headers_done):
            self._fail(protocol_error("the response headers are larger than 64 KiB"))
        elif self._size > self.limit and not reply.done():
            self._fail(DecodeFailure(f"the response body is larger than {size_text(self.limit)}"))

    def eof_received(self) -> bool | None:
        self.closed = True
        self._ended(None)
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._ended(exc)
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_exception(TransportFailure("WriteError", describe(exc, "connection lost")))
        if self.pooled:
            self.pool._forget(self)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_result(None)

    # -- httptools callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        reply = self._reply
        if reply is None or reply.done():  # a second response in the same read as the first
            self._extra = True

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._extra:  # never into the first response's header map
            return
        self._header_bytes += len(name) + len(value)
        if self._header_bytes > _MAX_HEAD_BYTES:
            self._oversized = True
            self._head_size = self._header_bytes
        lower = name.decode("latin-1").lower()
        if lower == "content-length" or lower == "transfer-encoding":
            self._framed = True
        self._headers[lower] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        if self._extra:
            return
        self._headers_done = True
        self._status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()
        declared = self._headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.limit:  # refused before it is read
            self._fail(DecodeFailure(f"the response body is larger than {size_text(self.limit)}"))

    def on_body(self, body: bytes) -> None:
        if self._extra:
            return
        self._size += len(body)
        if self._size <= self.limit:
            self._body.append(body)

    def on_message_complete(self) -> None:
        reply = self._reply
        if reply is None or reply.done() or self._extra:
            return
        if 100 <= self._status < 200 and self._status != 101:  # interim (100 Continue...)
            self._start(reply)
            return
        reply.set_result((self._status, self._headers, b"".join(self._body)))

    # -- internals --------------------------------------------------------------------------

    def _start(self, reply: asyncio.Future[tuple[int, dict[str, str], bytes]] | None) -> None:
        """Forget the last response: ``reply`` is the future the next one settles."""
        self._reply = reply
        self._status = 0
        self._headers = {}
        self._body = []
        self._size = 0
        self._head_size = 0
        self._header_bytes = 0
        self._oversized = False
        self._framed = False
        self._headers_done = False
        self._extra = False
        self.keep_alive = False

    def _ended(self, exc: Exception | None) -> None:
        """The peer closed (EOF) or the connection was lost: settle the pending response."""
        reply = self._reply
        if reply is None or reply.done():
            return
        self.keep_alive = False
        if exc is None and self._headers_done and not self._framed:
            # a body delimited by the close (HTTP/1.0 style)
            reply.set_result((self._status, self._headers, b"".join(self._body)))
        elif exc is not None:
            self._fail(TransportFailure("ReadError", describe(exc)))
        elif not self.answered:
            self._fail(protocol_error("Server disconnected without sending a response."))
        else:
            self._fail(protocol_error("peer closed connection without sending complete message"))

    def _fail(self, exc: Exception) -> None:
        self.keep_alive = False
        reply = self._reply
        if reply is not None and not reply.done():
            reply.set_exception(exc)
        self.abort()

    def _stray(self) -> None:
        self.keep_alive = False
        if self.pooled:
            self.pool._forget(self)
        else:
            self.abort()

    def _timed_out(self) -> None:
        drain = self._drain
        if drain is not None and not drain.done():
            kind = "WriteTimeout"
            drain.set_exception(TransportFailure(kind, self._late(kind), timed_out=True))
        elif self._reply is not None and not self._reply.done():
            self._fail(TransportFailure("ReadTimeout", self._late("response"), timed_out=True))

    def _late(self, what: str) -> str:
        if what == "response":
            return f"no complete response within {self._timeout:.3g}s"
        return f"the request could not be sent within {self._timeout:.3g}s"


def settle(waiter: asyncio.Future[bool], value: bool) -> None:
    if not waiter.done():
        waiter.set_result(value)


def protocol_error(detail: str) -> TransportFailure:
    return TransportFailure("RemoteProtocolError", detail)


def describe(exc: BaseException | None, default: str = "") -> str:
    if exc is None:
        return default
    return str(exc) or type(exc).__name__


def _readable(fd: int) -> bool:
    """Whether ``fd`` has something to read now (EOF included): never block."""
    if fd < 0:
        return False
    poll = getattr(select, "poll", None)
    if poll is None:  # pragma: no cover - Windows
        return bool(select.select([fd], [], [], 0)[0])
    poller = poll()
    poller.register(fd, select.POLLIN | select.POLLPRI)
    return bool(poller.poll(0))


def default_ssl_context() -> ssl.SSLContext:
    """The trust ``httpx2`` uses by default: its own builder, so ``SSL_CERT_FILE`` and
    ``SSL_CERT_DIR`` are honoured and the system's CAs used otherwise."""
    context = httpx2.create_ssl_context()
    context.set_alpn_protocols(["http/1.1"])
    return context
