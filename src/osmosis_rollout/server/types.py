"""The wire seam's shared types: what a wire protocol and the protocol-neutral core say to
each other.

A wire (``wire/v1.py``, ``wire/v2.py``) implements ``Wire`` and gives each accepted rollout a
``DeliveryTarget``; the core (scheduler, delivery, replicas, registry) answers a start request
with an ``Answer`` and records how a rollout ended as a ``Terminal``; a wire's own routes get the
HTTP edge as an ``Edge``. They live in one leaf module, which imports nothing of
``osmosis_rollout.server`` (``tests/test_imports.py`` checks it), so both sides import it and
neither imports the other: a third wire is written against this module alone.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    from pydantic import ValidationError
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import BaseRoute

    from ..client import TrainGateClient
    from ..grading import Grade
    from ..protocol import RolloutRequest, RolloutResponse

__all__ = [
    "Answer",
    "DeliveryTarget",
    "Edge",
    "Progress",
    "TargetFactory",
    "Terminal",
    "Wire",
    "refusal",
    "targets_by_protocol",
    "terminal",
]


class Answer(NamedTuple):
    """The core's answer to a start request (and to its duplicates): a status and a JSON body,
    with ``Retry-After`` if asked. The wire turns it into its HTTP response; ``reason`` lets it
    pick its own status for a cause (v1 answers ``busy`` with 503, v2 with 429; a ``conflict``
    gets each wire's own wording)."""

    status: int
    body: bytes
    retry_after: bool = False
    reason: str = ""


def refusal(status: int, detail: str, *, retry_after: bool = False, reason: str = "") -> Answer:
    """An ``{"detail": ...}`` answer."""
    return Answer(status, json.dumps({"detail": detail}).encode(), retry_after, reason)


class Terminal(NamedTuple):
    """How a rollout ended, as status routes report it: ``success``, ``failure`` or
    ``cancelled``, the reward (only for a success) and the error message (only otherwise)."""

    status: str
    reward: float | None = None
    err_message: str | None = None


def terminal(status: str, reward: float | None = None, err_message: str | None = None) -> Terminal:
    """A ``Terminal``; one without a message is shared between the records that ended alike
    (most rollouts: a few distinct rewards), so such a record carries a pointer, not a tuple."""
    if err_message is not None:
        return Terminal(status, reward, err_message)
    return _shared_terminal(status, reward)


@functools.lru_cache(maxsize=4096)
def _shared_terminal(status: str, reward: float | None) -> Terminal:
    return Terminal(status, reward)


#: Told that a part was delivered.
Progress = Callable[[], Awaitable[None]]


class DeliveryTarget(Protocol):
    """One rollout's trainer-facing side: its chat channel and its result's delivery.

    The core never builds a URL: the wire gives each accepted rollout a target, which knows the
    channel its agent's chat turns use and how its result is delivered (one callback in v1; a
    completion and a grader callback in v2). ``deliver`` goes part by part: a part the trainer
    took is marked delivered on the target, so when a later part fails, the outbox entry
    (``record()``, with the target's ``protocol``) holds only what was not delivered, and a
    redelivery sends only that."""

    #: The wire protocol ("v1", "v2"): kept with leases and outbox entries to rebuild it.
    protocol: str

    @property
    def rollout_id(self) -> str:
        """The rollout the target belongs to."""
        ...

    @property
    def server_url(self) -> str:
        """Where the trainer is; kept with an outbox entry so it can be delivered again."""
        ...

    @property
    def api_key(self) -> str | None:
        """The per-rollout callback secret: sent to the trainer, scrubbed from everything
        written."""
        ...

    @property
    def secrets(self) -> tuple[str, ...]:
        """Every key the target holds (the callback key; v2's LLM key too): scrubbed from
        everything written about the rollout, an outbox entry included."""
        ...

    def channel(self, client: TrainGateClient) -> Any:
        """The channel the agent's chat turns go through (a ``ChatBackend``)."""
        ...

    def settle(
        self, response: RolloutResponse, grade: Grade | None, category: str | None = None
    ) -> tuple[RolloutResponse, Terminal]:
        """Fix what will be sent from the agent's response and its grade (None: no grade
        hook; ``category``: why the agent failed, see ``errors.error_category``); returns the
        response the outbox keeps and the terminal status to report."""
        ...

    def record(self) -> dict[str, Any] | None:
        """What rebuilding this target needs beyond id, URL and key (JSON; no secret), with
        which parts are still to deliver; None when nothing more (v1)."""
        ...

    async def deliver(
        self,
        client: TrainGateClient,
        response: RolloutResponse,
        progress: Progress | None = None,
    ) -> None:
        """Send what was not delivered yet; raises ``TrainGateError`` when a part was not
        taken (the parts before it stay delivered). ``progress`` is awaited after each part
        taken (``Delivery`` records it in a shared state's lease)."""
        ...


#: Rebuilds a target from what an outbox entry or a lease keeps:
#: (protocol, rollout_id, server_url, key, record).
TargetFactory = Callable[[str, str, str, "str | None", "dict[str, Any] | None"], DeliveryTarget]


class Edge(Protocol):
    """What a wire's own routes (status, cancel) get of the HTTP edge: the server key check,
    the bounded body read and the bounded 422 body (``server/app.py``'s ``Edge`` implements it).
    """

    @property
    def server(self) -> Any:
        """The ``RolloutServer`` behind the edge (``Any`` so this module names nothing of the
        server; ``wire/control.py`` names its type)."""
        ...

    def authorized(self, request: Request) -> bool:
        """Whether the request carries the server key (or the server has none)."""
        ...

    @property
    def open(self) -> bool:
        """No key on a public interface (``--no-auth``): anyone who reaches the port may call
        (``server/pinning.py``); cancels go by ids only."""
        ...

    async def read_body(self, request: Request) -> bytes | Response:
        """The body within the limits (or the 413/408/400 to answer)."""
        ...

    def validation_body(self, exc: ValidationError) -> dict[str, Any]:
        """A bounded 422 body that echoes no input."""
        ...

    def sharing(self, protocol: str) -> frozenset[str]:
        """The protocols whose wires share ``protocol``'s start route (itself included): one
        cancel route serves them all."""
        ...


class Wire(Protocol):
    """One wire protocol's side of the server: the route that starts a rollout, that route's
    body parsed into the rollout the agent runs plus its ``DeliveryTarget``, the core's
    ``Answer`` as its response, and targets rebuilt from what the outbox and leases keep."""

    #: Its name, kept with leases and outbox entries ("v1", "v2", "polling").
    protocol: str
    #: The ``POST`` route that starts a rollout.
    start_path: str

    def claims(self, body: bytes) -> bool:
        """Whether a start body is this wire's, when wires share ``start_path`` (v2 and
        polling share ``/rollout``); a wire alone on its path claims everything."""
        ...

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


def targets_by_protocol(wires: Sequence[Wire]) -> TargetFactory:
    """A ``TargetFactory`` that rebuilds each target with the wire its protocol names."""
    by_protocol = {wire.protocol: wire for wire in wires}

    def target_of(
        protocol: str,
        rollout_id: str,
        server_url: str,
        api_key: str | None,
        route: dict[str, Any] | None,
    ) -> DeliveryTarget:
        wire = by_protocol.get(protocol)
        if wire is None:
            raise ValueError(f"unknown wire protocol {protocol!r}")
        return wire.target_of(rollout_id, server_url, api_key, route)

    return target_of
