"""Wire protocols: each one module that maps its HTTP shapes onto the protocol-neutral core.

A wire implements ``types.Wire``: it names the route that starts a rollout, parses that route's
body into the rollout the agent runs plus its ``DeliveryTarget``, turns the core's answer
(``types.Answer``: a status and a JSON body) into its response, and rebuilds targets from what
the outbox and the leases keep. The app (``server/app.py``) does the HTTP edge for every wire:
auth, body limits, 422 bodies, the 503 while not running. v1 (``wire/v1.py``), v2
(``wire/v2.py``, with the rollout its init makes in ``v2_body.py`` and its two callbacks in
``v2_target.py``; its bodies are ``protocol.py``'s) and polling (``wire/polling.py``, with
``polling_body.py``, ``polling_target.py`` and ``polling_results.py``) are served side by side,
the one list of them :func:`all_wires`; v2 and polling share ``POST /rollout`` (``Wire.claims``
tells their bodies apart) and the cancel route (``control.py``), and v1 and v2 add status routes
reading the registry. The core never imports this package: the types both sides share are
``server/types.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..types import targets_by_protocol

if TYPE_CHECKING:
    from ...config import ServerSettings
    from ..types import TargetFactory, Wire

__all__ = ["all_wires", "target_factory"]


def all_wires(settings: ServerSettings | None = None) -> tuple[Wire, ...]:
    """Every wire this package has, one of each (polling's bounds from ``settings``, else its
    defaults): the one list the server serves (``create_app``) and rebuilds outbox entries with
    (``target_factory``). Each has a twin of the same ``protocol`` in the mock TrainGate's list
    (``testing.wire.WIRES``)."""
    from .polling import Polling
    from .v1 import V1
    from .v2 import V2

    if settings is None:
        polling = Polling()
    else:
        polling = Polling(
            wait_s=settings.poll_wait_s,
            lease_s=settings.poll_lease_s,
            retention_s=settings.poll_retention_s,
        )
    return (V1(), V2(), polling)


def target_factory(wires: Sequence[Wire] | None = None) -> TargetFactory:
    """Rebuilds any entry's target by its protocol (every wire of :func:`all_wires`, by
    default): what ``osmosis outbox replay`` uses."""
    return targets_by_protocol(all_wires() if wires is None else wires)
