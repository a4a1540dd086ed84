"""Which ``server_url`` (TrainGate's base for chat turns and callbacks) a rollout may name.

It is a URL the server will call later, so it is checked once, at init, against the same parser
the HTTP client sends with: what passes here can be called, and a typo is a 422 at init instead
of a failed callback at the end of the rollout. ``protocol.RolloutRequest`` applies it.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import httpx2

__all__ = ["normal_server_url"]

#: A host name (letters, digits, ``.-_``) or an IPv4/IPv6 address, as ``urlsplit`` reports it.
_HOST = re.compile(r"[A-Za-z0-9_.-]+|[0-9A-Fa-f:.]+(%[A-Za-z0-9_.-]+)?")


def normal_server_url(value: str) -> str:
    """``value`` stripped of spaces and trailing ``/``; a ``ValueError`` saying why if refused."""
    parts = urlsplit(value.strip())
    try:
        parts.port  # noqa: B018  # raises ValueError for a port out of range or not a number
    except ValueError:
        raise ValueError("server_url has an invalid port") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("server_url must be an http:// or https:// URL with a host")
    if not value.isascii() or any(c.isspace() or not c.isprintable() for c in value.strip()):
        raise ValueError(
            "server_url must be printable ASCII without spaces (percent-encode the rest)"
        )
    if not _HOST.fullmatch(parts.hostname):
        raise ValueError("server_url's host must be a DNS name or an IP address")
    # The parser the client sends with, on a URL the client builds: what passes here, works.
    try:
        httpx2.URL(f"{value.strip().rstrip('/')}/v1/rollout/completed")
    except httpx2.InvalidURL:
        raise ValueError("server_url is not a URL the HTTP client can call") from None
    return value.strip().rstrip("/")
