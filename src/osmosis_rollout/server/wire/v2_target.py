"""A v2 rollout's target: its chat channel and its two callbacks (spec sections 5 and 14.4).

``settle`` maps our result (and its grade) onto v2's completion body (the agent phase's
verdict) and grader body (the sample and its reward: the terminal event). ``deliver`` posts
what is still pending, completion first, each part marked delivered as the trainer takes it:
a failed grader callback never resends the completion, and the outbox entry's ``record()``
holds only the parts still due, with their bodies, so a redelivery sends exactly those.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pydantic_core

from ...grading import graded
from ...protocol import CompletionCallback, GraderCallback, RolloutResponse, RolloutStatus, Sample
from ..types import Terminal, terminal

if TYPE_CHECKING:
    from ...chat_v2 import V2ChatChannel
    from ...client import TrainGateClient
    from ...grading import Grade
    from ..types import Progress

__all__ = ["V2Target", "callback_bodies"]

_NO_REWARD = "no reward: run() returned none and the agent has no grade(); a kept sample needs one"


class V2Target:
    """Where one v2 rollout's chat turns and callbacks go (see the module docstring)."""

    protocol = "v2"

    def __init__(
        self,
        rollout_id: str,
        completion_url: str,
        api_key: str | None,
        *,
        grader_url: str | None,
        id_given: bool = True,
        label: str | None = None,
        chat_url: str = "",
        llm_key: str | None = None,
        bodies: dict[str, Any] | None = None,
        pending: list[str] | None = None,
    ) -> None:
        self.rollout_id = rollout_id
        self.server_url = completion_url
        self.api_key = api_key
        self.grader_url = grader_url
        self.id_given = id_given
        self.label = label
        self.chat_url = chat_url
        self._llm_key = llm_key
        self.bodies = bodies
        parts = ["completion", "grader"] if grader_url else ["completion"]
        self.pending = list(parts if pending is None else pending)

    def channel(self, client: TrainGateClient) -> V2ChatChannel:
        """``<chat_completions_url>/chat/completions`` with the LLM key."""
        from ...chat_v2 import V2ChatChannel

        return V2ChatChannel(client, self.chat_url, self._llm_key)

    def settle(
        self, response: RolloutResponse, grade: Grade | None, category: str | None = None
    ) -> tuple[RolloutResponse, Terminal]:
        """Build both callback bodies now (kept with the outbox entry if not delivered). A
        target rebuilt with its bodies (from an outbox entry, or a lease its replica updated
        before it died) keeps them: what was settled is what is sent."""
        if self.bodies is not None:
            return response, terminal_of_bodies(self.bodies)
        if grade is not None and grade.error is None:
            response = graded(response, grade)
        bodies, terminal = callback_bodies(
            response,
            grade,
            category,
            rollout_id=self.rollout_id if self.id_given else None,
            label=self.label,
            graded=self.grader_url is not None,
        )
        self.bodies = bodies
        return response, terminal

    @property
    def secrets(self) -> tuple[str, ...]:
        """The controller key and the LLM key (a chat reply may echo either)."""
        return tuple(key for key in (self.api_key, self._llm_key) if key)

    def record(self) -> dict[str, Any]:
        """The grader URL, the body id rule, and the parts still due with their bodies."""
        return {
            "grader_callback_url": self.grader_url,
            "id_given": self.id_given,
            "label": self.label,
            "pending": list(self.pending),
            "bodies": self.bodies,
        }

    async def deliver(
        self,
        client: TrainGateClient,
        response: RolloutResponse,
        progress: Progress | None = None,
    ) -> None:
        """Post the pending parts in order; a part the trainer took is never sent again."""
        if self.bodies is None:  # rebuilt from a lease taken before it settled
            self.settle(response, None)
        assert self.bodies is not None
        while self.pending:
            part = self.pending[0]
            url = self.server_url if part == "completion" else self.grader_url
            assert url is not None  # a grader part exists only with a grader URL
            await client.post(
                url,
                pydantic_core.to_json(self.bodies[part]),
                api_key=self.api_key,
                request_id=f"{self.rollout_id}:{part}",
                callback=True,
            )
            self.pending.pop(0)
            if progress is not None:  # the last one too: a peer then has nothing left to send
                await progress()


def callback_bodies(
    response: RolloutResponse,
    grade: Grade | None,
    category: str | None,
    *,
    rollout_id: str | None,
    label: str | None,
    graded: bool,
) -> tuple[dict[str, Any], Terminal]:
    """The completion and grader bodies of a result (spec 14.4), and its terminal status.

    Built with the wire's models (``protocol.CompletionCallback``, ``GraderCallback``), which
    the mock TrainGate reads: a field set here that they do not declare fails at once; kept as
    their JSON-ready dicts, which outbox entries and leases hold."""
    cancelled = response.finish_reason == "cancelled"
    if response.status is RolloutStatus.COMPLETED:
        completion = CompletionCallback(rollout_id=rollout_id, status="success")
    else:
        if response.finish_reason == "timeout":
            category = "timeout"
        elif cancelled:
            category = "agent_error"
        category = category or "agent_error"
        completion = CompletionCallback(
            rollout_id=rollout_id,
            status="cancelled" if cancelled else "failure",
            err_message=response.error_message,
            err_category=None if cancelled else category,
        )
    bodies: dict[str, Any] = {"completion": completion.model_dump()}

    reward: float | None = None
    error: str | None = None
    err_category: str | None = None
    if response.status is not RolloutStatus.COMPLETED:
        error, err_category = response.error_message, category
    elif grade is not None and grade.error is not None:
        error, err_category = grade.error, grade.category
        cancelled = grade.cancelled
    elif grade is not None:
        reward = grade.reward
    elif response.reward is not None:
        reward = response.reward
    else:
        error, err_category = _NO_REWARD, "validation_error"
    if graded:
        metrics = response.metrics.model_dump(mode="json") if response.metrics else {}
        extra = dict(response.extra_fields)
        extra.setdefault("finish_reason", response.finish_reason)
        sample = Sample(
            messages=response.final_messages,
            label=label,
            reward=reward if error is None else None,
            remove_sample=False,
            metrics={k: v for k, v in metrics.items() if isinstance(v, int | float)},
            extra_fields=extra,
        )
        grader = GraderCallback(
            status="success" if error is None else "failure",
            rollout_id=rollout_id,
            sample=sample,
            err_message=error,
            err_category=err_category,
        )
        bodies["grader"] = grader.model_dump()
    if error is None:
        end = terminal("success", reward)
    elif cancelled:
        end = terminal("cancelled", None, error)
    elif not graded and response.status is RolloutStatus.COMPLETED and grade is None:
        end = terminal("success")  # no grader phase asked for: nothing is missing
    else:
        end = terminal("failure", None, error)
    return bodies, end


def terminal_of_bodies(bodies: dict[str, Any]) -> Terminal:
    """The terminal status settled bodies stand for: the grader's, else the completion's."""
    grader = bodies.get("grader")
    if grader is not None:
        if grader.get("status") == "success":
            return terminal("success", (grader.get("sample") or {}).get("reward"))
        cancelled = bodies.get("completion", {}).get("status") == "cancelled"
        return terminal("cancelled" if cancelled else "failure", None, grader.get("err_message"))
    completion = bodies["completion"]
    if completion.get("status") == "success":
        return terminal("success")
    status = "cancelled" if completion.get("status") == "cancelled" else "failure"
    return terminal(status, None, completion.get("err_message"))
