"""``TrainGateClient``: the server's two outbound calls to TrainGate, with retries and auth.

One :class:`~osmosis_rollout.transport.PostTransport` is shared by every rollout (connection
pooling); by default the lean :class:`~osmosis_rollout.transport.Http1Transport` on asyncio, else an
``httpx2.AsyncClient`` (see :func:`default_transport`). The retry rules are
``protocol.md`` section 3: 5xx, 429 (honouring ``Retry-After``), timeouts and transport errors are
retried with exponential backoff and jitter; any other 4xx fails at once. Every attempt of one
turn carries the same ``X-Request-Id`` so TrainGate can deduplicate. Secrets never reach a log
line or an exception message.
"""

from __future__ import annotations

import logging
import os
import random
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import anyio
import httpx2
import sniffio
from pydantic import ValidationError

from . import telemetry
from .destinations import DestinationPolicy
from .errors import (
    ProtocolError,
    TrainGateError,
    TrainGateTimeout,
    TrainGateUnavailable,
    http_error,
)
from .protocol import (
    CompletionsRequest,
    CompletionsResponse,
    RolloutRequest,
    RolloutResponse,
    describe_validation_error,
    wire_json,
)
from .redaction import redact_url, scrub
from .transport import (
    MAX_REPLY_BYTES,
    DecodeFailure,
    Httpx2Transport,
    InvalidTarget,
    PostTransport,
    Reply,
    TransportFailure,
    guard_connections,
    parse_retry_after,
)

__all__ = ["ClientStats", "RetryPolicy", "RolloutChannel", "TrainGateClient"]

logger = logging.getLogger("osmosis_rollout.client")

_BODY_EXCERPT = 500


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try one call. Defaults are ``protocol.md``'s.

    ``retries`` counts retries after the first attempt. A ``Retry-After`` header replaces the
    computed backoff, capped at ``retry_after_cap_s`` so a hostile value cannot park a rollout.
    """

    retries: int = 3
    base_delay_s: float = 1.0
    max_delay_s: float = 30.0
    attempt_timeout_s: float = 300.0
    connect_timeout_s: float = 10.0
    retry_after_cap_s: float = 300.0
    #: The largest reply read, raw and once decompressed (``DecodeFailure`` beyond it, on every
    #: carrier): a hostile or broken TrainGate cannot make one call hold more memory.
    max_reply_bytes: int = MAX_REPLY_BYTES

    def backoff(self, retry: int, rand: float) -> float:
        """Delay before retry number ``retry`` (0-based): exponential, capped, equal jitter."""
        ceiling = min(self.max_delay_s, self.base_delay_s * float(2**retry))
        return ceiling / 2 + (ceiling / 2) * rand


@dataclass
class ClientStats:
    """Counters for the calls made through one client (for health pages and benchmarks)."""

    requests: int = 0
    retries: int = 0
    #: The part of ``retries`` that retried a completion callback.
    callback_retries: int = 0
    failures: int = 0
    by_status: dict[int, int] = field(default_factory=dict)


def _is_retryable(status: int) -> bool:
    return status == 429 or status >= 500


class TrainGateClient:
    """Sends chat turns and completion callbacks to TrainGate over one pooled transport.

    Pass ``transport`` (any :class:`~osmosis_rollout.transport.PostTransport`) or ``http`` (an
    ``httpx2.AsyncClient``, e.g. one with a mock transport) to choose the carrier; a carrier
    handed in is the caller's to close. Otherwise one is created here, with at most
    ``max_connections`` open at once (calls beyond wait for a free one), and closed by
    :meth:`aclose`. ``sleep`` and ``rand`` are injectable so tests can check the backoff
    without waiting.
    """

    def __init__(
        self,
        http: httpx2.AsyncClient | None = None,
        *,
        transport: PostTransport | None = None,
        retry: RetryPolicy | None = None,
        max_connections: int | None = 1000,
        sleep: Callable[[float], Awaitable[Any]] = anyio.sleep,
        rand: Callable[[], float] = random.random,
        destinations: DestinationPolicy | None = None,
    ) -> None:
        if http is not None and transport is not None:
            raise TypeError("give TrainGateClient either http or transport, not both")
        self.retry = retry or RetryPolicy()
        self._owns_transport = http is None and transport is None
        if http is not None:
            transport = Httpx2Transport(
                http,
                destinations=destinations,
                max_reply_bytes=self.retry.max_reply_bytes,
                deadline_s=self.retry.attempt_timeout_s,
            )
        elif transport is None:
            transport = default_transport(self.retry, max_connections, destinations)
        self.transport: PostTransport = transport
        self._sleep = sleep
        self._rand = rand
        self.stats = ClientStats()

    @property
    def http(self) -> httpx2.AsyncClient | None:
        """The ``httpx2`` client under the transport, when it is one (None otherwise)."""
        return self.transport.http if isinstance(self.transport, Httpx2Transport) else None

    async def __aenter__(self) -> TrainGateClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the transport if this object created it."""
        if self._owns_transport:
            await self.transport.aclose()

    def channel(self, request: RolloutRequest) -> RolloutChannel:
        """The view of this client that one rollout uses (its URL and its secret)."""
        return RolloutChannel(self, request.server_url, request.api_key_value)

    # -- the two calls ----------------------------------------------------------------------

    async def chat_completions(
        self,
        server_url: str,
        body: CompletionsRequest,
        *,
        api_key: str | None,
        request_id: str,
    ) -> CompletionsResponse:
        """POST one LLM turn and return the parsed reply (``ProtocolError`` if malformed)."""
        url = f"{server_url}/v1/chat/completions"
        response = await self._post(url, wire_json(body), api_key=api_key, request_id=request_id)
        try:
            return CompletionsResponse.model_validate_json(response.content)
        except ValidationError as exc:
            raise ProtocolError(
                f"TrainGate's reply to {redact_url(url)} is not a valid chat completion "
                f"({describe_validation_error(exc)}); it needs choices[0].message and usage"
            ) from None

    async def complete_rollout(
        self, server_url: str, result: RolloutResponse, *, api_key: str | None
    ) -> None:
        """POST the completion callback; any 2xx is success."""
        url = f"{server_url}/v1/rollout/completed"
        await self._post(
            url,
            wire_json(result),
            api_key=api_key,
            request_id=f"{result.rollout_id}:completed",
            callback=True,
        )

    async def post(
        self,
        url: str,
        content: bytes,
        *,
        api_key: str | None,
        request_id: str,
        callback: bool = False,
    ) -> Reply:
        """POST ``content`` (JSON) to ``url`` with this client's retries and auth: the carrier
        of protocol v2's chat turns and callbacks (``chat_v2.py``, ``server/wire/v2_target.py``),
        whose URLs the trainer gives whole."""
        return await self._post(
            url, content, api_key=api_key, request_id=request_id, callback=callback
        )

    # -- retries ----------------------------------------------------------------------------

    async def _post(
        self,
        url: str,
        content: bytes,
        *,
        api_key: str | None,
        request_id: str,
        callback: bool = False,
    ) -> Reply:
        headers = {"Content-Type": "application/json", "X-Request-Id": header_safe(request_id)}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        telemetry.inject_context(headers)  # W3C traceparent, when OpenTelemetry is installed
        policy = self.retry
        shown = redact_url(url)  # what messages and logs say: never a password in a URL
        for attempt in range(policy.retries + 1):
            last = attempt == policy.retries
            self.stats.requests += 1
            try:
                response = await self.transport.post(url, content, headers)
            except InvalidTarget as exc:
                self.stats.failures += 1
                raise TrainGateError(f"cannot call {shown}{_detail(exc, api_key)}") from None
            except DecodeFailure as exc:
                self.stats.failures += 1
                raise ProtocolError(
                    f"the reply from {shown} could not be decoded{_detail(exc, api_key)}"
                ) from None
            except TransportFailure as exc:
                if last:
                    self.stats.failures += 1
                    unavailable = TrainGateTimeout if exc.timed_out else TrainGateUnavailable
                    raise unavailable(
                        f"could not reach {shown} after {attempt + 1} attempt(s): "
                        f"{exc.kind}{_detail(exc, api_key)}"
                    ) from None
                delay = policy.backoff(attempt, self._rand())
                logger.warning(
                    "POST %s failed (%s); retry %d/%d in %.2fs",
                    shown,
                    exc.kind,
                    attempt + 1,
                    policy.retries,
                    delay,
                )
            else:
                status = response.status_code
                self.stats.by_status[status] = self.stats.by_status.get(status, 0) + 1
                if 200 <= status < 300:
                    return response
                if last or not _is_retryable(status):
                    self.stats.failures += 1
                    body = _excerpt(response, api_key)
                    raise http_error(
                        f"POST {shown} returned HTTP {status}"
                        + (f" after {attempt + 1} attempts" if attempt else "")
                        + (f": {body}" if body else ""),
                        status_code=status,
                        body=body,
                        url=shown,
                    )
                retry_after = parse_retry_after(response.headers.get("retry-after"))
                if retry_after is not None:
                    delay = min(retry_after, policy.retry_after_cap_s)
                else:
                    delay = policy.backoff(attempt, self._rand())
                logger.warning(
                    "POST %s returned HTTP %d; retry %d/%d in %.2fs",
                    shown,
                    status,
                    attempt + 1,
                    policy.retries,
                    delay,
                )
            self.stats.retries += 1
            self.stats.callback_retries += callback
            await self._sleep(delay)
        raise AssertionError("unreachable: the loop returns or raises")  # pragma: no cover


def default_transport(
    retry: RetryPolicy,
    max_connections: int | None,
    destinations: DestinationPolicy | None = None,
) -> PostTransport:
    """The carrier TrainGate calls use when none is given.

    The lean :class:`~osmosis_rollout.transport.Http1Transport` when it can do the job: running on
    asyncio (plain or uvloop), ``httptools`` importable, and no proxy configured in the
    environment (``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``, any case: ``httpx2`` honours
    them and ``NO_PROXY``). ``OSMOSIS_HTTP_CLIENT=httpx2`` forces ``httpx2``; so does anything
    else, e.g. a client made outside an event loop or under trio. ``destinations`` checks the
    addresses each call reaches (behind a proxy, which resolves names itself, only the URL's).
    """
    proxied = _proxy_configured()
    if (
        os.environ.get("OSMOSIS_HTTP_CLIENT", "").strip().lower() != "httpx2"
        and _on_asyncio()
        and not proxied
    ):
        try:
            from .transport.http1 import Http1Transport
        except ImportError:  # httptools missing (a pure-Python install)
            pass
        else:
            return Http1Transport(
                connect_timeout_s=retry.connect_timeout_s,
                attempt_timeout_s=retry.attempt_timeout_s,
                max_connections=max_connections,
                destinations=destinations,
                max_response_bytes=retry.max_reply_bytes,
            )
    http = default_http_client(retry, max_connections)
    # Direct connections check the addresses they connect to; every call checks the URL's host
    # (behind a proxy, which resolves names itself, that is all that can be checked).
    guarded = destinations is not None and guard_connections(http, destinations)
    resolve = not proxied and not guarded
    return Httpx2Transport(
        http,
        owned=True,
        destinations=destinations,
        resolve=resolve,
        max_reply_bytes=retry.max_reply_bytes,
        deadline_s=retry.attempt_timeout_s,
    )


def _on_asyncio() -> bool:
    try:
        return sniffio.current_async_library() == "asyncio"
    except sniffio.AsyncLibraryNotFoundError:
        return False


def _proxy_configured() -> bool:
    """Whether ``httpx2`` would route through a proxy from the environment."""
    return any(scheme != "no" for scheme in urllib.request.getproxies())


def default_http_client(retry: RetryPolicy, max_connections: int | None) -> httpx2.AsyncClient:
    """The ``httpx2`` client TrainGate calls use when no carrier is given."""
    return httpx2.AsyncClient(
        timeout=httpx2.Timeout(retry.attempt_timeout_s, connect=retry.connect_timeout_s),
        # Bounded: draining thousands of callbacks at once must not exhaust file handles.
        limits=httpx2.Limits(max_connections=max_connections, max_keepalive_connections=200),
    )


def header_safe(value: str) -> str:
    """``value`` as an HTTP header value: printable ASCII kept, anything else percent-encoded
    (a non-ASCII ``rollout_id`` must not make every call of its rollout fail)."""
    if value.isascii() and value.isprintable():
        return value
    return quote(value, safe="".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%"))


def _detail(exc: Exception, secret: str | None) -> str:
    text = scrub(str(exc), secret)
    return f" ({text[:200]})" if text else ""


def _excerpt(response: Reply, secret: str | None) -> str:
    try:
        text = response.text
    except (UnicodeDecodeError, LookupError):
        return ""
    text = scrub(" ".join(text.split()), secret)
    return text[:_BODY_EXCERPT] + ("..." if len(text) > _BODY_EXCERPT else "")


class RolloutChannel:
    """One rollout's door to TrainGate for LLM turns: its ``server_url`` and ``api_key`` bound in.

    It deliberately has no way to send the completion callback: that is the server's job, once.
    """

    def __init__(self, client: TrainGateClient, server_url: str, api_key: str | None) -> None:
        self.client = client
        self.server_url = server_url
        self._api_key = api_key

    def __repr__(self) -> str:
        return f"RolloutChannel(server_url={redact_url(self.server_url)!r})"

    async def chat_completions(
        self, request: CompletionsRequest, *, request_id: str
    ) -> CompletionsResponse:
        """One LLM turn for this rollout."""
        return await self.client.chat_completions(
            self.server_url, request, api_key=self._api_key, request_id=request_id
        )
