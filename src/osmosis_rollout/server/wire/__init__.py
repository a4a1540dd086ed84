"""Wire protocols: each one module that maps its HTTP shapes onto the protocol-neutral core.

A ``Wire`` names the route that starts a rollout, parses that route's body into the rollout
the agent runs plus its ``DeliveryTarget``, turns the core's answer (``registry.Answer``: a
status and a JSON body) into its response, and rebuilds targets from what the outbox and the
leases keep. The app (``server/app.py``) does the HTTP edge for every wire: auth, body limits,
422 bodies, the 503 while not running. v1 (``wire/v1.py``) and v2 (``wire/v2.py``, with its
init body in ``v2_body.py`` and its two callbacks in ``v2_target.py``) are served side by side;
both add status and cancel routes (``control.py``) reading the registry. The core imports this
package for its types only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from starlette.responses import Response
    from starlette.routing import BaseRoute

    from ...protocol import RolloutRequest
    from ..app import Edge
    from ..registry import Answer
    from ..target import DeliveryTarget, TargetFactory

__all__ = ["Wire", "target_factory"]


class Wire(Protocol):
    """One wire protocol's side of the server."""

    #: Its name, kept with leases and outbox entries ("v1", "v2").
    protocol: str
    #: The ``POST`` route that starts a rollout.
    start_path: str

    def parse(self, body: bytes, *, max_metadata_bytes: int) -> RolloutRequest:
        """The rollout a start body asks for; raises pydantic's ``ValidationError`` (a 422)."""
        ...

    def target(self, request: RolloutRequest) -> DeliveryTarget:
        """Where the rollout's chat turns and result go."""
        ...

    def target_of(
        self,
        rollout_id: str,
        server_url: str,
        api_key: str | None,
        route: dict[str, Any] | None = None,
    ) -> DeliveryTarget:
        """A target rebuilt from an outbox entry or a lease (``route``: its ``record()``)."""
        ...

    def accepted(self, rollout_id: str, tools_json: bytes) -> bytes:
        """The body of an accepted start request's answer (and of its duplicates')."""
        ...

    def respond(self, answer: Answer) -> Response:
        """The HTTP response for the scheduler's answer to a start request."""
        ...

    def routes(self, edge: Edge) -> list[BaseRoute]:
        """Routes beyond the start route (status, cancel), behind ``edge``'s checks."""
        ...


def target_factory(wires: Sequence[Wire] | None = None) -> TargetFactory:
    """Rebuilds any entry's target by its protocol (every wire this package has, by default):
    what ``osmosis outbox replay`` uses."""
    from ..target import targets_by_protocol

    if wires is None:
        from .v1 import V1
        from .v2 import V2

        wires = (V1(), V2())
    return targets_by_protocol(wires)
