"""``Httpx2Transport``: :class:`~.types.PostTransport` over an ``httpx2.AsyncClient``, the
general carrier: proxies, trio, a client a test or a user hands in, anything the lean
``Http1Transport`` does not speak. What ``httpx2`` leaves unbounded (a reply's size once
inflated, a body dripping a byte a second) is bounded here.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

import anyio
import httpx2

from ..destinations import DestinationPolicy, DestinationRefused
from .bodies import decode_body, read_capped, size_text
from .destination import check_call
from .types import MAX_REPLY_BYTES, DecodeFailure, InvalidTarget, Reply, TransportFailure

__all__ = ["Httpx2Transport", "guard_connections"]


class Httpx2Transport:
    """:class:`PostTransport` over an ``httpx2.AsyncClient`` (the general fallback).

    ``owned`` says whether :meth:`aclose` closes the client: a client handed in by a caller is
    the caller's to close. With ``destinations`` each call's host is checked first: its
    resolved addresses when ``resolve`` (no proxy: httpx2 then resolves the same name a moment
    later), else only the URL's host (a proxy resolves names itself). The reply is read raw and
    decoded here, both bounded by ``max_reply_bytes`` (``httpx2`` would inflate a gzip bomb or
    read an endless body whole), and the whole call, body included, ends by ``deadline_s``
    (``httpx2``'s timeouts are per read, so a reply dripping a byte a second would never end).
    """

    def __init__(
        self,
        http: httpx2.AsyncClient,
        *,
        owned: bool = False,
        destinations: DestinationPolicy | None = None,
        resolve: bool = True,
        max_reply_bytes: int = MAX_REPLY_BYTES,
        deadline_s: float | None = None,
    ) -> None:
        self.http = http
        self._owned = owned
        self._destinations = destinations
        self._resolve = resolve
        self.max_reply_bytes = max_reply_bytes
        self.deadline_s = deadline_s

    async def post(self, url: str, content: bytes, headers: Mapping[str, str]) -> Reply:
        """POST through the wrapped client, mapping its exceptions onto this module's."""
        if self._destinations is not None:
            await check_call(self._destinations, url, resolve=self._resolve)
        sent = dict(headers)
        if not any(name.lower() == "accept-encoding" for name in sent):
            sent["Accept-Encoding"] = "gzip, deflate"  # what decode_body undoes
        if "@" in url:  # user:password@: sent as Basic auth, never in a URL httpx2 logs
            url, basic = _without_userinfo(url)
            if basic is not None:
                sent = {k: v for k, v in sent.items() if k.lower() != "authorization"}
                sent["Authorization"] = basic
        try:
            with anyio.fail_after(self.deadline_s):
                async with self.http.stream("POST", url, content=content, headers=sent) as reply:
                    if reply.is_stream_consumed:  # built whole in memory (a mock): decoded
                        return self._whole(reply)
                    raw = await self._read(reply)
        except TimeoutError:
            raise TransportFailure(
                "ReadTimeout",
                f"no complete response within {self.deadline_s:.3g}s",
                timed_out=True,
            ) from None
        except (httpx2.InvalidURL, httpx2.UnsupportedProtocol) as exc:
            raise InvalidTarget(str(exc)) from None
        except httpx2.DecodingError as exc:
            raise DecodeFailure(str(exc)) from None
        except httpx2.TransportError as exc:
            raise TransportFailure(
                type(exc).__name__, str(exc), timed_out=isinstance(exc, httpx2.TimeoutException)
            ) from None
        found = _lower(reply.headers.items())
        return Reply(reply.status_code, found, decode_body(found, raw, self.max_reply_bytes))

    def _whole(self, reply: httpx2.Response) -> Reply:
        if len(reply.content) > self.max_reply_bytes:
            raise DecodeFailure(
                f"the response body is larger than {size_text(self.max_reply_bytes)}"
            )
        return Reply(reply.status_code, _lower(reply.headers.items()), reply.content)

    async def _read(self, reply: httpx2.Response) -> bytes:
        limit = self.max_reply_bytes
        declared = reply.headers.get("content-length", "")
        if declared.strip().isdigit() and int(declared) > limit:
            raise DecodeFailure(f"the response body is larger than {size_text(limit)}")
        return await read_capped(reply.aiter_raw(), limit)

    async def aclose(self) -> None:
        """Close the client when this transport owns it."""
        if self._owned:
            await self.http.aclose()


def guard_connections(http: httpx2.AsyncClient, policy: DestinationPolicy) -> bool:
    """Make ``http``'s direct connections (not those through a proxy) check ``policy`` on the
    addresses they resolve to and connect to a checked one, as ``Http1Transport`` does; False
    when ``http`` is not built the way this expects (then check each call instead).

    httpx2 has no public hook for this: the network backend of its default pool is wrapped.
    """
    import httpcore2

    pool = getattr(getattr(http, "_transport", None), "_pool", None)
    inner = getattr(pool, "_network_backend", None)
    if not isinstance(pool, httpcore2.AsyncConnectionPool) or inner is None:
        return False
    pool._network_backend = _guarded_backend(inner, policy)
    return True


def _guarded_backend(inner: Any, policy: DestinationPolicy) -> Any:
    import httpcore2

    class GuardedBackend(httpcore2.AsyncNetworkBackend):
        """Resolves and checks before connecting; refusals are not retried."""

        async def connect_tcp(
            self,
            host: str,
            port: int,
            timeout: float | None = None,  # noqa: ASYNC109  # httpcore2's signature
            local_address: str | None = None,
            socket_options: Any = None,
        ) -> Any:
            try:
                addresses = await policy.resolve(host, port)
            except DestinationRefused as exc:
                raise httpcore2.UnsupportedProtocol(f"destination refused: {exc}") from None
            except OSError as exc:
                raise httpcore2.ConnectError(f"{host}: {exc.strerror or exc}") from None
            failure: Exception | None = None
            for address in addresses:
                try:
                    return await inner.connect_tcp(
                        address,
                        port,
                        timeout=timeout,
                        local_address=local_address,
                        socket_options=socket_options,
                    )
                except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as exc:
                    failure = exc
            assert failure is not None  # resolve never returns an empty list
            raise failure

        async def connect_unix_socket(self, *args: Any, **kwargs: Any) -> Any:
            return await inner.connect_unix_socket(*args, **kwargs)

        async def sleep(self, seconds: float) -> None:
            await inner.sleep(seconds)

    return GuardedBackend()


def _without_userinfo(url: str) -> tuple[str, str | None]:
    """``url`` without ``user:password@``, and the Basic ``Authorization`` value it meant."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url, None
    if parts.username is None:
        return url, None
    secret = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
    host = parts.netloc.rpartition("@")[2]
    plain = parts._replace(netloc=host).geturl()
    return plain, "Basic " + base64.b64encode(secret.encode()).decode()


def _lower(items: Any) -> dict[str, str]:
    return {name.lower(): value for name, value in items}
