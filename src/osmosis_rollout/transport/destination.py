"""The destination check a carrier makes before it connects: the addresses a call's host
resolves to, each allowed by the server's :class:`~osmosis_rollout.destinations.DestinationPolicy`
(``--traingate`` allow-list, link-local and cloud metadata refused), in the carriers' words.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from ..destinations import DestinationPolicy, DestinationRefused
from .types import InvalidTarget, TransportFailure

__all__ = ["check_call"]


async def check_call(policy: DestinationPolicy, url: str, *, resolve: bool) -> list[str]:
    """The addresses ``url``'s host resolves to, each allowed by ``policy`` (``InvalidTarget``
    when one is not; ``TransportFailure`` when the name does not resolve); only the URL's host
    is checked when not ``resolve``."""
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        host = parts.hostname or ""
        if not resolve:
            policy.check_host(host, port)
            return []
        return await policy.resolve(host, port)
    except DestinationRefused as exc:
        raise InvalidTarget(f"destination refused: {exc}") from None
    except ValueError as exc:
        raise InvalidTarget(f"invalid URL {url!r}: {exc}") from None
    except OSError as exc:
        raise TransportFailure("ConnectError", f"{host}: {exc.strerror or exc}") from None
