"""Reaching Redis: the optional client package, the connection pool, URLs and errors.

Everything ``RedisState`` needs from redis-py beyond its scripts goes through here, so a missing
extra, a bad URL and a lost store each become one of our errors (``ConfigError`` or
``StateUnavailable``) in one place, and no URL password reaches a message.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar
from urllib.parse import urlsplit, urlunsplit

from ...errors import ConfigError
from .base import StateUnavailable

try:
    import redis.asyncio as aioredis
    from redis import exceptions as redis_errors
except ModuleNotFoundError as exc:
    if (exc.name or "").partition(".")[0] != "redis":  # a dependency *of* redis: show it
        raise
    raise ConfigError(
        "a redis:// state URL needs the redis client package; install it with "
        "pip install 'osmosis-rollout[redis]'"
    ) from None

__all__ = ["call", "connect", "redact_url"]

T = TypeVar("T")

#: Connections to Redis per server process (each call holds one for one round trip).
_MAX_CONNECTIONS = 64


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for banners, logs and /health)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    netloc = f"{user}:***@{host}{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def connect(url: str) -> aioredis.Redis:
    """A client for ``url``; a ``ConfigError`` (password redacted) if redis-py cannot parse it."""
    try:
        # A blocking pool: a burst of inits waits for a free connection (bounded, so Redis
        # is not flooded) instead of failing with "too many connections".
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=_MAX_CONNECTIONS,
            timeout=10.0,
            socket_connect_timeout=2.0,
            socket_timeout=5.0,
        )
        return aioredis.Redis.from_pool(pool)
    except ValueError as exc:
        raise ConfigError(f"invalid state URL {redact_url(url)!r}: {exc}") from None


async def call(operation: Awaitable[T], describe: Callable[[], str]) -> T:
    """Await one Redis operation; a lost or refusing store is ``StateUnavailable``.

    ``describe`` names the store (password redacted) and is called only for the message.
    """
    try:
        return await operation
    except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError) as exc:
        raise StateUnavailable(
            f"the rollout state store {describe()} is unreachable "
            f"({type(exc).__name__}); retry once it is back"
        ) from None
    except redis_errors.ResponseError as exc:
        raise StateUnavailable(
            f"the rollout state store {describe()} refused a command: {exc}"
        ) from None
