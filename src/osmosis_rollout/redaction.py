"""Keeping secrets out of text we write: ``scrub`` (every encoded form of a secret), the
``ApiKey`` type that never prints, and ``loggable`` for ids in log lines.

Its own module because every edge that writes text (logs, traces, the outbox, error messages)
needs it, and none of them should need the wire models to get it. Imports nothing of ours.
"""

from __future__ import annotations

import functools
import hmac
import json
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, quote_plus

from pydantic import SecretStr, SerializationInfo

__all__ = [
    "REDACTED",
    "REVEAL_SECRETS",
    "ApiKey",
    "dump_secret",
    "loggable",
    "scrub",
    "scrub_data",
    "secret_forms",
]

#: Context key that makes a dump include the per-rollout ``api_key`` (only for the wire).
REVEAL_SECRETS = "reveal_secrets"
REDACTED = "**********"


class ApiKey(SecretStr):
    """A ``SecretStr`` that still compares equal to the plain string it holds (in constant
    time), so v1 code such as ``request.api_key == "k"`` keeps working; it never prints."""

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SecretStr):
            other = other.get_secret_value()
        if isinstance(other, str):
            return hmac.compare_digest(
                self.get_secret_value().encode("utf-8", "surrogatepass"),
                other.encode("utf-8", "surrogatepass"),
            )
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.get_secret_value())


def dump_secret(value: SecretStr | None, info: SerializationInfo) -> str | None:
    """Serialise a secret as ``**********``, or as itself when the dump context reveals secrets
    (only :func:`wire` and the reloader hand-off do)."""
    if value is None:
        return None
    if isinstance(info.context, dict) and info.context.get(REVEAL_SECRETS):
        return value.get_secret_value()
    return REDACTED


#: How a secret gets re-encoded on its way into text we write: JSON strings (also with ``\\/``),
#: ``repr()`` of a string or an exception, URL query and path encodings.
_ENCODINGS: tuple[Callable[[str], str], ...] = (
    lambda s: json.dumps(s)[1:-1],
    lambda s: json.dumps(s)[1:-1].replace("/", "\\/"),
    lambda s: repr(s)[1:-1],
    lambda s: quote(s, safe=""),
    lambda s: quote(s),
    lambda s: quote_plus(s, safe=""),
)


@functools.lru_cache(maxsize=1024)
def secret_forms(secret: str) -> tuple[str, ...]:
    """Every form of ``secret`` that :func:`scrub` removes, longest first: the raw text and its
    encodings (JSON, repr, URL), each applied up to twice (a JSON error body quoted in a JSON
    log line, a ``repr`` of a message that quotes it...)."""
    forms = {secret}
    frontier = {secret}
    for _ in range(2):
        frontier = {encode(form) for form in frontier for encode in _ENCODINGS} - forms
        forms |= frontier
    return tuple(sorted(forms, key=len, reverse=True))


def scrub(text: str, secret: str | None) -> str:
    """``text`` with every form of ``secret`` (see :func:`secret_forms`) replaced by
    ``**********``. The one scrubber: every path that writes text a secret may reach uses it."""
    if not secret:
        return text
    for form in secret_forms(secret):
        if form in text:
            text = text.replace(form, REDACTED)
    return text


def scrub_data(value: Any, secret: str | None) -> Any:
    """A copy of JSON-like ``value`` whose strings (keys too) are :func:`scrub`-bed."""
    if not secret:
        return value
    if isinstance(value, str):
        return scrub(value, secret)
    if isinstance(value, dict):
        return {scrub_data(k, secret): scrub_data(v, secret) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [scrub_data(v, secret) for v in value]
    return value


def loggable(value: str) -> str:
    """``value`` safe to put in a log line: control characters (a newline that would forge a
    second line, terminal escapes) are shown as Python escapes; printable text is unchanged."""
    return value if value.isprintable() else repr(value)[1:-1]
