"""Wire protocols: each one module that maps its HTTP shapes onto the protocol-neutral core.

A ``Wire`` names the route that starts a rollout, parses that route's body into the rollout
the agent runs plus its ``DeliveryTarget``, turns the core's answer (``registry.Answer``: a
status and a JSON body) into its response, and rebuilds targets from what the outbox and the
leases keep. The app (``server/app.py``) does the HTTP edge for every wire: auth, body limits,
422 bodies, the 503 while not running. v1 (``wire/v1.py``) is today's protocol; another one is
one more module beside it, plus its extra routes (``routes``: e.g. a status or cancel route
reading ``registry.by_id``). The core imports this package for its types only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from starlette.responses import Response
    from starlette.routing import BaseRoute

    from ...protocol import RolloutRequest
    from ..core import RolloutServer
    from ..registry import Answer
    from ..target import DeliveryTarget

__all__ = ["Wire"]


class Wire(Protocol):
    """One wire protocol's side of the server."""

    #: The ``POST`` route that starts a rollout.
    start_path: str

    def parse(self, body: bytes, *, max_metadata_bytes: int) -> RolloutRequest:
        """The rollout a start body asks for; raises pydantic's ``ValidationError`` (a 422)."""
        ...

    def target(self, request: RolloutRequest) -> DeliveryTarget:
        """Where the rollout's chat turns and result go."""
        ...

    def target_of(self, rollout_id: str, server_url: str, api_key: str | None) -> DeliveryTarget:
        """A target rebuilt from an outbox entry or a lease."""
        ...

    def accepted(self, rollout_id: str, tools_json: bytes) -> bytes:
        """The body of an accepted start request's answer (and of its duplicates')."""
        ...

    def respond(self, answer: Answer) -> Response:
        """The HTTP response for the scheduler's answer to a start request."""
        ...

    def routes(self, server: RolloutServer) -> list[BaseRoute]:
        """Routes beyond the start route (none in v1)."""
        ...
