"""The open server's pin: without a key on a public interface, the hosts of the first accepted
init are the only ones later inits may name (docs/security.md, "Serving a controller that sends
no key").

The platform's controller (osmosis-ai 0.3.2's ``HttpRolloutDriver``) sends no
``Authorization``: its key travels in the body, for the callbacks. So ``--no-auth`` serves
whoever reaches the port, and an init chooses where the server's requests go. The destination
policy keeps them off this machine and the cloud's metadata; the pin keeps them on the
controller's hosts: the first init the server accepts (the controller's, on a deployment where
the platform starts the server and calls it at once) fixes the set of origins (scheme, host,
port) its URLs name, and an init naming any other origin is refused with 403 before it exists.
``--traingate`` replaces the pin with an allow-list the operator wrote.

A refusal never says which hosts are pinned (they would tell a stranger where the controller
is) nor echoes the refused URL.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from urllib.parse import urlsplit

from ..config import ServerSettings
from ..redaction import loggable
from .auth import is_loopback

__all__ = ["FirstInitPin", "is_open", "origin_of"]

logger = logging.getLogger("osmosis_rollout.server")

_DEFAULT_PORTS = {"http": 80, "https": 443}


def is_open(settings: ServerSettings) -> bool:
    """Whether ``settings`` serve anyone who reaches the port: no key, a public interface."""
    return settings.api_key is None and not is_loopback(settings.host)


def origin_of(url: str) -> str:
    """``scheme://host:port`` of a URL the init checks already passed, port made explicit."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower().rstrip(".")
    port = parts.port or _DEFAULT_PORTS.get(scheme, 0)
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}:{port}"


class FirstInitPin:
    """The origins of the first accepted init; later inits must stay within them.

    ``hold`` is called before the scheduler admits an init and ``settle`` after: the first init
    holds the pin while it is admitted (an init arriving meanwhile is checked against it), and
    gives it back if it was not accepted, so a refused or malformed first init pins nothing.
    """

    def __init__(self) -> None:
        self._origins: frozenset[str] | None = None
        self._holder: object | None = None

    @property
    def origins(self) -> frozenset[str] | None:
        """The pinned origins (None: nothing pinned yet)."""
        return self._origins

    def hold(self, urls: Sequence[tuple[str, str]]) -> tuple[str | None, object | None]:
        """``(refusal, claim)``: why the init may not run (naming the field), or the claim
        ``settle`` takes when this init is the one pinning (None when the pin was set)."""
        origins = frozenset(origin_of(url) for _, url in urls)
        if self._origins is None:
            claim = object()
            self._origins, self._holder = origins, claim
            return None, claim
        for field, url in urls:
            if origin_of(url) not in self._origins:
                return (
                    f"{field} names a host this server does not call: it runs without a key "
                    "on a public interface (--no-auth) and calls only the hosts of its first "
                    "rollout; restart it, or list the controller's hosts with --traingate",
                    None,
                )
        return None, None

    def settle(self, claim: object | None, *, accepted: bool) -> None:
        """Keep the pin the claim set if its init was accepted, else give it back."""
        if claim is None or claim is not self._holder:
            return
        self._holder = None
        if not accepted:
            self._origins = None
            return
        shown = ", ".join(sorted(loggable(origin) for origin in self._origins or ()))
        logger.warning(
            "no server key on a public interface: later inits may name only the hosts of the "
            "first one (%s); use --traingate to name them yourself",
            shown,
        )
