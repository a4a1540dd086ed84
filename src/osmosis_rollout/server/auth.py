"""The server key: the check (constant time, any scheme case, bare keys, non-ASCII rejected)
and the rule deciding which key a server runs with, shared by ``osmosis serve`` and ``serve()``.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from collections.abc import Callable

from pydantic import SecretStr

from ..config import ServerSettings

__all__ = ["decide_auth", "is_loopback", "key_matches"]


def key_matches(header: str | None, key: str) -> bool:
    """Whether an ``Authorization`` header carries ``key`` (``Bearer <k>`` or a bare ``<k>``)."""
    if not header:
        return False
    scheme, _, rest = header.strip().partition(" ")
    token = rest.strip() if scheme.lower() == "bearer" and rest else header.strip()
    if not token.isascii():
        return False
    return hmac.compare_digest(token.encode("ascii"), key.encode("utf-8"))


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` serves only this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def decide_auth(
    settings: ServerSettings, *, no_auth: bool, new_key: Callable[[], str] | None = None
) -> tuple[ServerSettings, bool]:
    """The server key to use, and whether it was generated (then it is printed once).

    ``no_auth`` wins; a configured key is kept (a blank one never gets here: the settings
    refuse it); a non-loopback host without one gets a fresh key, because a public rollout
    server without auth would run anyone's rollouts.
    """
    if no_auth:
        return settings.model_copy(update={"api_key": None}), False
    if settings.api_key is not None or is_loopback(settings.host):
        return settings, False
    key = new_key() if new_key is not None else secrets.token_urlsafe(32)
    return settings.model_copy(update={"api_key": SecretStr(key)}), True
