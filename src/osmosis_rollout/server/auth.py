"""The server key check: constant time, any scheme case, bare keys, non-ASCII rejected."""

from __future__ import annotations

import hmac

__all__ = ["key_matches"]


def key_matches(header: str | None, key: str) -> bool:
    """Whether an ``Authorization`` header carries ``key`` (``Bearer <k>`` or a bare ``<k>``)."""
    if not header:
        return False
    scheme, _, rest = header.strip().partition(" ")
    token = rest.strip() if scheme.lower() == "bearer" and rest else header.strip()
    if not token.isascii():
        return False
    return hmac.compare_digest(token.encode("ascii"), key.encode("utf-8"))
