"""Wire protocols: each one module that maps its HTTP shapes onto the protocol-neutral core.

A wire implements ``types.Wire``: it names the route that starts a rollout, parses that route's
body into the rollout the agent runs plus its ``DeliveryTarget``, turns the core's answer
(``types.Answer``: a status and a JSON body) into its response, and rebuilds targets from what
the outbox and the leases keep. The app (``server/app.py``) does the HTTP edge for every wire:
auth, body limits, 422 bodies, the 503 while not running. v1 (``wire/v1.py``), v2
(``wire/v2.py``, with its init body in ``v2_body.py`` and its two callbacks in
``v2_target.py``) and polling (``wire/polling.py``, with ``polling_body.py``,
``polling_target.py`` and ``polling_results.py``) are served side by side; v2 and polling share
``POST /rollout`` (``Wire.claims`` tells their bodies apart) and the cancel route
(``control.py``), and v1 and v2 add status routes reading the registry. The core never imports
this package: the types both sides share are ``server/types.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..types import targets_by_protocol

if TYPE_CHECKING:
    from ..types import TargetFactory, Wire

__all__ = ["target_factory"]


def target_factory(wires: Sequence[Wire] | None = None) -> TargetFactory:
    """Rebuilds any entry's target by its protocol (every wire this package has, by default):
    what ``osmosis outbox replay`` uses."""
    if wires is None:
        from .polling import Polling
        from .v1 import V1
        from .v2 import V2

        every: tuple[Wire, ...] = (V1(), V2(), Polling())
        return targets_by_protocol(every)
    return targets_by_protocol(wires)
