"""Keeping secrets out of text we write: ``scrub`` (every encoded form of a secret), the
``ApiKey`` type that never prints, and ``loggable`` for ids in log lines.

Its own module because every edge that writes text (logs, traces, the outbox, error messages)
needs it, and none of them should need the wire models to get it. Imports nothing of ours.
"""

from __future__ import annotations

import base64
import functools
import hmac
import html
import json
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, quote_plus, urlsplit, urlunsplit

from pydantic import SecretStr, SerializationInfo

__all__ = [
    "REDACTED",
    "REVEAL_SECRETS",
    "ApiKey",
    "dump_secret",
    "loggable",
    "redact_url",
    "scrub",
    "scrub_data",
    "secret_forms",
]

#: Context key that makes a dump include the per-rollout ``api_key`` (only for the wire).
REVEAL_SECRETS = "reveal_secrets"
REDACTED = "**********"


class ApiKey(SecretStr):
    """A ``SecretStr`` that still compares equal to the plain string it holds (in constant
    time), so legacy code such as ``request.api_key == "k"`` keeps working; it never prints."""

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


#: Forms a page or a header may give the secret or its JSON: HTML-escaped (both quote styles).
_HTML: tuple[Callable[[str], str], ...] = (
    lambda s: html.escape(s, quote=True),
    lambda s: html.escape(s, quote=True).replace("&#x27;", "&#39;"),
    lambda s: html.escape(s, quote=False),
)
#: Shorter secrets have no base64 core that is safe to replace (it would match other text).
_MIN_BASE64 = 6


@functools.lru_cache(maxsize=1024)
def secret_forms(secret: str) -> tuple[str, ...]:
    """Every form of ``secret`` that :func:`scrub` removes, longest first: the raw text and its
    encodings (JSON, repr, URL), each applied up to twice (a JSON error body quoted in a JSON
    log line, a ``repr`` of a message that quotes it...); those and the raw text HTML-escaped;
    and the raw text in base64 (standard and URL-safe), also inside a longer base64 text such
    as an ``Authorization: Basic`` value (the part that does not depend on its neighbours)."""
    forms = {secret}
    frontier = {secret}
    for _ in range(2):
        frontier = {encode(form) for form in frontier for encode in _ENCODINGS} - forms
        forms |= frontier
    forms |= {escape(form) for form in list(forms) for escape in _HTML}
    forms |= _base64_forms(secret)
    forms.discard("")
    return tuple(sorted(forms, key=len, reverse=True))


def _base64_forms(secret: str) -> set[str]:
    raw = secret.encode("utf-8", "surrogatepass")
    if len(raw) < _MIN_BASE64:
        return set()
    found: set[str] = set()
    for shift in range(3):  # the secret's first byte at each position of a 3-byte group
        encoded = base64.b64encode(b"\0" * shift + raw).decode()
        # Characters mixing the padding with the secret, or the secret with what follows it,
        # depend on the neighbours: keep only those made of the secret's bytes alone.
        start = (shift * 4 + 2) // 3 if shift else 0
        end = ((shift + len(raw)) // 3) * 4 + (shift + len(raw)) % 3  # + the pure characters
        core = encoded[start:end]
        for text in (core, core.replace("+", "-").replace("/", "_")):
            if len(text) >= _MIN_BASE64:
                found.add(text)
    found.add(base64.b64encode(raw).decode())
    found.add(base64.urlsafe_b64encode(raw).decode())
    return found


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


def redact_url(url: str) -> str:
    """``url`` with the password of a ``user:password@`` replaced by ``***`` (a URL written to a
    log line, a trace, an error message or the outbox must not carry it)."""
    if "@" not in url:
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        return f"***@{url.rpartition('@')[2]}"  # unparseable: nothing before the last @ kept
    if parts.password is None and "@" not in parts.netloc:
        return url
    user, _, host = parts.netloc.rpartition("@")
    name = user.partition(":")[0]
    netloc = f"{name}:***@{host}" if ":" in user else f"***@{host}"
    return urlunsplit(parts._replace(netloc=netloc))
