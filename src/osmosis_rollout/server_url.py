"""Which ``server_url`` (TrainGate's base for chat turns and callbacks) a rollout may name.

It is a URL the server will call later, so it is checked once, at init, against the same parser
the HTTP client sends with: what passes here can be called, and a typo is a 422 at init instead
of a failed callback at the end of the rollout. ``protocol.RolloutRequest`` applies it.

It is also a URL a hostile init chooses (docs/security.md), so only a base URL is taken: no
user name or password (they would be sent, and logged), no query and no fragment (a ``#``
would swallow the path the client appends), and an IPv4 address only as four decimal numbers
(``127.1``, ``0x7f.0.0.1`` and ``2130706433`` all mean 127.0.0.1 to a resolver, and would slip
past a check of the written host). Where the URL may point is ``destinations.py``'s question.
"""

from __future__ import annotations

import functools
import ipaddress
import re
import socket
from urllib.parse import urlsplit, urlunsplit

import httpx2

__all__ = [
    "check_called_url",
    "check_host_spelling",
    "destination",
    "normal_server_url",
    "redacted_url",
]

#: A host name (letters, digits, ``.-_``) or an IPv4/IPv6 address, as ``urlsplit`` reports it.
_HOST = re.compile(r"[A-Za-z0-9_.-]+|[0-9A-Fa-f:.]+(%[A-Za-z0-9_.-]+)?")
#: A last label that a resolver reads as a number: the name is an IPv4 address in disguise.
_NUMERIC_LABEL = re.compile(r"(0x[0-9a-f]*|[0-9]+)", re.IGNORECASE)


#: Values accepted before, and their normal form: a training run's inits name one or a few
#: ``server_url``s, and the client's parser costs most of an init's validation (30-50 µs of
#: about 60: docs/benchmarks.md, issue 41). Only accepted values are kept, at most
#: ``_MAX_ACCEPTED`` (then it starts over), so a flood of distinct URLs costs no memory.
_ACCEPTED: dict[str, str] = {}
_MAX_ACCEPTED = 1024


def normal_server_url(value: str) -> str:
    """``value`` stripped of spaces and trailing ``/``; a ``ValueError`` saying why if refused."""
    known = _ACCEPTED.get(value)
    if known is not None:
        return known
    normal = _normal_server_url(value)
    if len(_ACCEPTED) >= _MAX_ACCEPTED:
        _ACCEPTED.clear()
    _ACCEPTED[value] = normal
    return normal


def _normal_server_url(value: str) -> str:
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
    if "@" in parts.netloc:
        raise ValueError(
            "server_url must not hold a user name or password: TrainGate's key is the api_key field"
        )
    if "?" in value or "#" in value:
        raise ValueError(
            "server_url must be a base URL without a query (?) or fragment (#): the server "
            "appends /v1/chat/completions and /v1/rollout/completed to it"
        )
    check_host_spelling(parts.hostname)
    # The parser the client sends with, on a URL the client builds: what passes here, works.
    try:
        httpx2.URL(f"{value.strip().rstrip('/')}/v1/rollout/completed")
    except httpx2.InvalidURL:
        raise ValueError("server_url is not a URL the HTTP client can call") from None
    return value.strip().rstrip("/")


def check_host_spelling(host: str) -> None:
    """A ``ValueError`` unless ``host`` is an IP address in its usual form or a DNS name whose
    labels IDNA accepts (1-63 characters each)."""
    if ":" in host:
        return  # IPv6: urlsplit and the client's parser have checked it
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        pass
    else:
        return
    last = host.rstrip(".").rpartition(".")[2]
    if _NUMERIC_LABEL.fullmatch(last) or _inet_aton_accepts(host):
        raise ValueError(
            "server_url's host looks like an IPv4 address but is not written as one: "
            "use four decimal numbers such as 127.0.0.1"
        )
    try:
        host.encode("idna")
    except UnicodeError:
        raise ValueError(
            "server_url's host is not a valid DNS name (each label 1-63 characters)"
        ) from None


def _inet_aton_accepts(host: str) -> bool:
    try:
        socket.inet_aton(host)
    except OSError:
        return False
    return True


def redacted_url(url: str) -> str:
    """``url`` as it may be shown: a password as ``***``, a query as ``?***`` (entries kept
    before inits were checked may hold either), the fragment dropped."""
    try:
        parts = urlsplit(url)
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<invalid URL>"
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    user = ""
    if parts.username is not None:
        user = f"{parts.username}:***@" if parts.password is not None else f"{parts.username}@"
    query = "***" if parts.query else ""
    return urlunsplit((parts.scheme, f"{user}{host}{port}", parts.path, query, ""))


def destination(url: str) -> str:
    """The host (and port, when given) a URL sends to: what ``osmosis outbox list`` shows."""
    try:
        parts = urlsplit(url)
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "?"
    host = parts.hostname or "?"
    return f"[{host}]{port}" if ":" in host else f"{host}{port}"


#: A rollout id that can stand for any other in a URL's path without changing its structure.
_PLAIN_ID = re.compile(r"[A-Za-z0-9._~-]{1,256}")


def check_called_url(value: str, name: str, rollout_id: str | None = None) -> str:
    """``value`` stripped, if :func:`normal_server_url` takes it; the error names ``name`` (a
    protocol v2 URL field: ``chat_completions_url``, ``completion_callback_url``...).

    The three URLs of a rollout usually differ from the last one's only by the rollout id as a
    path segment: checked with that segment replaced, the result is cached (the check parses
    the URL as the HTTP client will, a few times the cost of the rest of the init).
    """
    value = value.strip()
    origin = _origin_of(value)
    if rollout_id is not None and origin is not None and _PLAIN_ID.fullmatch(rollout_id):
        # Only the path is templated: the host (``http://2130706433/...`` with that id) is
        # always checked as written.
        segment = f"/{rollout_id}"
        path = value[len(origin) :]
        templated = path.replace(f"{segment}/", "/_id_/")
        if templated.endswith(segment):
            templated = templated[: -len(segment)] + "/_id_"
        _check_cached(origin + templated, name)
    else:
        _check(value, name)
    return value


#: ``scheme://netloc`` as ``urlsplit`` reads it (the netloc ends at the first ``/``, ``?`` or
#: ``#``), for the URLs it reads without changing them: a lower-case scheme, an ASCII netloc
#: without spaces or brackets (the rest, IPv6 hosts too, are checked whole).
_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/?#\[\]\s]+(?=[/?#]|\Z)", re.ASCII)


def _origin_of(value: str) -> str | None:
    """``scheme://netloc`` as ``value`` starts with it, or None when it does not (a regular
    expression: ``urlsplit`` on each of an init's three URLs cost as much as the rest of it)."""
    match = _ORIGIN.match(value)
    return match.group() if match and match.group().isascii() else None


def _check(value: str, name: str) -> None:
    try:
        normal_server_url(value)
    except ValueError as exc:
        raise ValueError(str(exc).replace("server_url", name)) from None


@functools.lru_cache(maxsize=1024)
def _check_cached(value: str, name: str) -> None:
    _check(value, name)
