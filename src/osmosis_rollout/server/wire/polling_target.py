"""A polling rollout's target: its chat channel, its lease, and its result, stored to be read.

The chat turns go where v2's go (``<chat_completions_url>/chat/completions`` with the LLM key).
``settle`` maps our result (and its grade) onto the SDK's ``RolloutResultResponse``: the status
(``success``, ``failure``, ``cancelled``), the sample with its reward, the error and its
category, the same mapping as v2's grader body (``v2_target.callback_bodies``). ``deliver``
puts that body in the results store (``polling_results.py``): nothing is sent, so a delivery
never fails and never reaches the outbox. A rollout whose lease ran out was already ended
there; its late result is dropped, so a read never changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pydantic_core

from ...protocol import RolloutResponse, RolloutStatus
from ..types import Terminal, terminal
from .polling_results import Lease
from .v2_target import callback_bodies

if TYPE_CHECKING:
    from ...chat_v2 import V2ChatChannel
    from ...client import TrainGateClient
    from ...grading import Grade
    from ..types import Progress
    from .polling_results import PollingResults

__all__ = ["PollingTarget", "result_body"]


class PollingTarget:
    """Where one polling rollout's chat turns go and its result is kept."""

    protocol = "polling"
    #: No callback secret: results are read with the lease, never sent.
    api_key: str | None = None

    def __init__(
        self,
        rollout_id: str,
        results: PollingResults,
        *,
        chat_url: str = "",
        llm_key: str | None = None,
        label: str | None = None,
        graded: bool = True,
        digest: bytes = b"",
    ) -> None:
        self.rollout_id = rollout_id
        self.results = results
        self.server_url = chat_url
        self._llm_key = llm_key
        self.label = label
        self.graded = graded  # False: the init said grade: false
        self.lease = Lease(rollout_id, digest)
        self.body: bytes | None = None
        self._terminal: Terminal | None = None

    @property
    def secrets(self) -> tuple[str, ...]:
        """The LLM key (a chat reply may echo it); the lease token is never held here."""
        return (self._llm_key,) if self._llm_key else ()

    def channel(self, client: TrainGateClient) -> V2ChatChannel:
        """``<chat_completions_url>/chat/completions`` with the LLM key."""
        from ...chat_v2 import V2ChatChannel

        return V2ChatChannel(client, self.server_url, self._llm_key)

    def settle(
        self, response: RolloutResponse, grade: Grade | None, category: str | None = None
    ) -> tuple[RolloutResponse, Terminal]:
        """The result body to keep, and the terminal status; one already kept (the lease ran
        out) stands."""
        kept = self.results.stored(self.lease)
        if kept is not None:
            return response, kept
        if self.body is None:
            body, self._terminal = result_body(
                response, grade, category, label=self.label, graded=self.graded
            )
            self.body = pydantic_core.to_json(body)
        if grade is not None and grade.error is None:
            response = response.model_copy(update={"reward": grade.reward})
        assert self._terminal is not None
        return response, self._terminal

    def record(self) -> dict[str, Any] | None:
        """What a replica ending this rollout (its own died) needs to store the result where
        the controller reads it: the lease's digest (not a secret: the token's SHA-256), the
        label and the grading flag. Nothing is ever sent, so nothing reaches an outbox."""
        return {"digest": self.lease.digest.hex(), "label": self.label, "graded": self.graded}

    async def deliver(
        self,
        client: TrainGateClient,
        response: RolloutResponse,
        progress: Progress | None = None,
    ) -> None:
        """Keep the settled result for its controller to read."""
        if self.body is None:
            self.settle(response, None)
        if self.body is not None and self._terminal is not None:
            await self.results.keep(self.lease, self.body, self._terminal)


def result_body(
    response: RolloutResponse,
    grade: Grade | None,
    category: str | None,
    *,
    label: str | None,
    graded: bool,
) -> tuple[dict[str, Any], Terminal]:
    """A finished rollout's ``RolloutResultResponse`` and terminal status.

    ``graded`` False (the init's ``grade: false``): a completed run is a ``success`` whatever
    its reward (the controller grades it), as the SDK's own server answers."""
    bodies, end = callback_bodies(
        response, grade, category, rollout_id=response.rollout_id, label=label, graded=True
    )
    grader = bodies["grader"]
    sample = grader["sample"]
    status, error, err_category = end.status, grader["err_message"], grader["err_category"]
    if not graded and response.status is RolloutStatus.COMPLETED:
        status, error, err_category = "success", None, None
        sample["reward"] = response.reward
        end = terminal("success", response.reward)
    if status == "cancelled":
        err_category = None  # a cancel is no error of the agent's
        sample["reward"] = None
    body = {
        "rollout_id": response.rollout_id,
        "status": status,
        "sample": sample,
        "err_message": error,
        "err_category": err_category,
    }
    return body, end
