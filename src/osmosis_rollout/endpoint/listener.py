"""The loopback listener: rollout endpoints for agents in other processes (harnesses).

One per server process and event loop, started on first use on 127.0.0.1 and a random port,
and closed when its last rollout ends (the next one starts it again: binding costs little).
Each rollout that asks gets its own base URL ``http://127.0.0.1:<port>/rollouts/<slug>/v1``
and a bearer token; both stop working when the rollout ends. A path naming no live rollout is
a 404, a wrong or missing token a 401: neither reaches the rollout, nor TrainGate.

It speaks just enough HTTP/1.1 for OpenAI clients (keep-alive, ``Content-Length`` bodies up to
:data:`MAX_BODY`): a full server (and its signal handlers) inside ``osmosis serve`` would buy
nothing here. Any local process can connect, so it is bounded as the main server is: the token
is checked from the head, before a byte of the body is read; at most :data:`MAX_CONNECTIONS`
connections are open (then 503 and close); a request's head must arrive within
:data:`HEAD_TIMEOUT_S` (an idle kept-alive connection is closed then too) and its body within
:data:`BODY_TIMEOUT_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import secrets
import socket
from dataclasses import dataclass

from .session import EndpointReply, RolloutEndpoint
from .translate import error_body

__all__ = [
    "BODY_TIMEOUT_S",
    "HEAD_TIMEOUT_S",
    "MAX_BODY",
    "MAX_CONNECTIONS",
    "Grant",
    "LoopbackListener",
    "listener",
]

logger = logging.getLogger("osmosis_rollout.endpoint")

#: The largest request body accepted (a long history with tool results).
MAX_BODY = 64 * 1024 * 1024
_MAX_HEAD = 64 * 1024
#: Open connections at most: a harness keeps a few; more is someone else.
MAX_CONNECTIONS = 256
#: How long a request's head may take to arrive (and an idle kept-alive connection may wait).
HEAD_TIMEOUT_S = 30.0
#: How long its body may take once the head is in.
BODY_TIMEOUT_S = 60.0
_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Payload Too Large",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
}


@dataclass(frozen=True, slots=True)
class Grant:
    """One rollout's way in: its base URL and bearer token."""

    base_url: str
    token: str
    slug: str
    listener: LoopbackListener

    def revoke(self) -> None:
        """The rollout ended: this URL and token stop working."""
        self.listener.revoke(self.slug)


class LoopbackListener:
    """The listening socket and the live rollouts' grants (slug -> token, endpoint)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        sock.setblocking(False)
        self.port: int = sock.getsockname()[1]
        self.loop = loop
        self._sock = sock
        self._grants: dict[str, tuple[str, RolloutEndpoint]] = {}
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        # The socket listens now (connections wait in its backlog); serving starts on the loop.
        self._starting = loop.create_task(self._start(sock))

    async def _start(self, sock: socket.socket) -> None:
        self._server = await asyncio.start_server(self._serve, sock=sock, limit=_MAX_HEAD)

    def grant(self, endpoint: RolloutEndpoint) -> Grant:
        """A new base URL and token for ``endpoint``'s rollout."""
        slug = secrets.token_urlsafe(12)
        token = "osr-" + secrets.token_urlsafe(24)
        self._grants[slug] = (token, endpoint)
        return Grant(f"http://127.0.0.1:{self.port}/rollouts/{slug}/v1", token, slug, self)

    def revoke(self, slug: str) -> None:
        """End a grant: its URL is a 404 from now on. The last one closes the listener."""
        self._grants.pop(slug, None)
        if not self._grants:
            self.close()

    def close(self) -> None:
        """Stop listening now; this loop's next grant starts a new listener."""
        if _listeners.get(self.loop) is self:
            del _listeners[self.loop]
        for writer in list(self._writers):  # kept-alive connections end with it
            writer.close()
        if self._server is not None:
            self._server.close()
        else:
            self._starting.cancel()
            self._sock.close()

    @property
    def live(self) -> int:
        """How many rollouts hold a grant."""
        return len(self._grants)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._writers) >= MAX_CONNECTIONS:
            message = "too many connections to the rollout endpoint; retry later"
            with contextlib.suppress(ConnectionError):
                await _send(writer, EndpointReply(503, error_body(message, "server_error")))
            writer.close()
            return
        self._writers.add(writer)
        try:
            while True:
                keep = await self._one(reader, writer)
                if not keep:
                    break
        except (
            ConnectionError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            TimeoutError,
        ):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Read and answer one request; whether the connection stays open."""
        async with asyncio.timeout(HEAD_TIMEOUT_S):
            head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3:
            await _send(writer, EndpointReply(400, error_body("bad request line", "bad_request")))
            return False
        method, target, _ = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            reply = EndpointReply(400, error_body("send a Content-Length body", "bad_request"))
            await _send(writer, reply)
            return False
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError:
            length = -1
        found = self._grant_of(target, headers.get("authorization", ""))
        if isinstance(found, EndpointReply):  # no such rollout, or not its token: body unread
            await _send(writer, found)
            return False
        if not 0 <= length <= MAX_BODY:
            message = f"the body must be at most {MAX_BODY} bytes, with a Content-Length"
            await _send(writer, EndpointReply(413, error_body(message, "bad_request")))
            return False
        async with asyncio.timeout(BODY_TIMEOUT_S):
            body = await reader.readexactly(length) if length else b""
        try:
            reply = await self._answer(method, target, found, body)
        except Exception as exc:  # our bug or the agent's, never the harness's: say so, once
            logger.warning("the rollout endpoint failed on a call: %s", type(exc).__name__)
            message = f"the rollout endpoint failed ({type(exc).__name__}); see the server's log"
            await _send(writer, EndpointReply(500, error_body(message, "server_error")))
            return False
        keep = headers.get("connection", "").lower() != "close"
        await _send(writer, reply, keep=keep)
        return keep

    def _grant_of(self, target: str, auth: str) -> RolloutEndpoint | EndpointReply:
        """The endpoint a request's path and token name, or the 404/401 to answer, from the
        head alone."""
        pieces = _pieces(target)
        grant = self._grants.get(pieces[2]) if len(pieces) > 2 and pieces[1] == "rollouts" else None
        if grant is None:
            message = (
                "no live rollout at this URL: it ended, or it was never handed out "
                "(use the rollout's ctx.openai_base_url)"
            )
            return EndpointReply(404, error_body(message, "not_found_error"))
        token, endpoint = grant
        scheme, _, given = auth.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), token.encode()):
            message = "wrong or missing API key: send this rollout's ctx.openai_api_key as Bearer"
            return EndpointReply(401, error_body(message, "authentication_error", "invalid_key"))
        return endpoint

    async def _answer(
        self, method: str, target: str, endpoint: RolloutEndpoint, body: bytes
    ) -> EndpointReply:
        pieces = _pieces(target)
        if pieces[3:] != ["v1", "chat", "completions"]:
            message = (
                f"{method} {'/'.join(pieces[3:])} is not served: this endpoint answers "
                "POST <base_url>/chat/completions only (the Responses API is not supported)"
            )
            return EndpointReply(404, error_body(message, "not_found_error"))
        if method != "POST":
            return EndpointReply(405, error_body("use POST", "invalid_request_error"))
        return await endpoint.handle(body)


def _pieces(target: str) -> list[str]:
    """A request target's path segments: "", "rollouts", slug, "v1", "chat", "completions"."""
    return target.split("?", 1)[0].rstrip("/").split("/")


async def _send(writer: asyncio.StreamWriter, reply: EndpointReply, *, keep: bool = False) -> None:
    reason = _REASONS.get(reply.status, "Error")
    head = (
        f"HTTP/1.1 {reply.status} {reason}\r\n"
        f"content-type: {reply.content_type}\r\n"
        f"content-length: {len(reply.body)}\r\n"
        f"connection: {'keep-alive' if keep else 'close'}\r\n\r\n"
    )
    writer.write(head.encode("latin-1") + reply.body)
    await writer.drain()


_listeners: dict[asyncio.AbstractEventLoop, LoopbackListener] = {}


def listener() -> LoopbackListener:
    """This event loop's listener, started on first use (asyncio only: a harness is a
    subprocess, and anyio's subprocesses run on asyncio in the server)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError(
            "ctx.openai_base_url needs a running asyncio event loop: read it inside run(ctx)"
        ) from None
    current = _listeners.get(loop)
    if current is None:
        for old in [lp for lp in _listeners if lp.is_closed()]:
            del _listeners[old]
        current = _listeners[loop] = LoopbackListener(loop)
    return current
