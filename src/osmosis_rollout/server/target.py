"""``DeliveryTarget``: where one rollout's traffic goes, as its wire protocol says.

The core (scheduler, delivery, replicas) never builds a URL: a wire adapter (``wire/v1.py``)
gives each accepted rollout a target, which knows the channel its agent's chat turns use and how
its result is delivered (one callback in v1). ``deliver`` is all or nothing: a result it does
not deliver is kept whole in the outbox and ``deliver`` is called again for it later, so a
protocol with two callbacks must make each one safe to send twice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..client import RolloutChannel, TrainGateClient
    from ..protocol import RolloutResponse

__all__ = ["DeliveryTarget", "TargetFactory"]


class DeliveryTarget(Protocol):
    """One rollout's trainer-facing side: its chat channel and its result's delivery."""

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
        """The per-rollout secret: sent to the trainer, scrubbed from everything written."""
        ...

    def channel(self, client: TrainGateClient) -> RolloutChannel:
        """The channel the agent's chat turns go through."""
        ...

    async def deliver(self, client: TrainGateClient, response: RolloutResponse) -> None:
        """Send the result; raises ``TrainGateError`` when the trainer did not take it."""
        ...


#: Rebuilds a target from what an outbox entry or a lease keeps: (rollout_id, server_url, key).
TargetFactory = Callable[[str, str, "str | None"], DeliveryTarget]
