"""``DeliveryTarget``: where one rollout's traffic goes, as its wire protocol says.

The core (scheduler, delivery, replicas) never builds a URL: a wire adapter (``wire/v1.py``,
``wire/v2.py``) gives each accepted rollout a target, which knows the channel its agent's chat
turns use and how its result is delivered (one callback in v1; a completion and a grader
callback in v2). ``deliver`` goes part by part: a part the trainer took is marked delivered on
the target, so when a later part fails, the outbox entry (``record()``, with the target's
``protocol``) holds only what was not delivered, and a redelivery sends only that.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..client import TrainGateClient
    from ..grading import Grade
    from ..protocol import RolloutResponse
    from .registry import Terminal
    from .wire import Wire

__all__ = ["DeliveryTarget", "Progress", "TargetFactory", "targets_by_protocol"]


class DeliveryTarget(Protocol):
    """One rollout's trainer-facing side: its chat channel and its result's delivery."""

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

    def channel(self, client: TrainGateClient) -> Any:
        """The channel the agent's chat turns go through (a ``ChatBackend``)."""
        ...

    def settle(
        self, response: RolloutResponse, grade: Grade | None, category: str | None = None
    ) -> tuple[RolloutResponse, Terminal]:
        """Fix what will be sent from the agent's response and its grade (None: no grade
        hook; ``category``: why the agent failed, see ``grading.error_category``); returns the
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


#: Told that a part was delivered.
Progress = Callable[[], Awaitable[None]]

#: Rebuilds a target from what an outbox entry or a lease keeps:
#: (protocol, rollout_id, server_url, key, record).
TargetFactory = Callable[[str, str, str, "str | None", "dict[str, Any] | None"], DeliveryTarget]


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
