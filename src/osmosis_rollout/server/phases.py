"""The rules of a rollout's phases that are not scheduling: its agent deadline, the result of a
rollout cancelled before it ran, and its grade. The scheduler (``scheduler.py``) applies them.

A v2 rollout's ``agent_timeout_sec`` counts from acceptance, queue time included, as the
controller's own deadline does (docs/protocol-v2.md, U13); the server's ``--rollout-timeout``
counts from the agent's start, as in v1; the earlier of the two applies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..grading import Grade, has_grade, run_grade
from ..protocol import RolloutRequest, RolloutResponse, RolloutStatus

if TYPE_CHECKING:
    from ..agent import RolloutAgentLoop
    from .registry import RolloutEntry

__all__ = ["agent_deadline", "cancelled_response", "grade", "name_agent_timeout", "wants_grade"]


def agent_deadline(
    request: RolloutRequest, rollout_timeout_s: float, queued_s: float
) -> tuple[float, float | None]:
    """The agent's deadline (seconds from now) and the v2 limit behind it, if any."""
    limit: float | None = getattr(request, "agent_timeout_sec", None)
    if limit is None:
        return rollout_timeout_s, None
    return min(rollout_timeout_s, max(0.0, limit - queued_s)), limit


def name_agent_timeout(
    response: RolloutResponse, limit: float | None, queued_s: float, rollout_timeout_s: float
) -> None:
    """When v2's ``agent_timeout_sec`` (not the server's timeout) cut the agent, say so."""
    if limit is None or response.finish_reason != "timeout":
        return
    if limit - queued_s >= rollout_timeout_s:
        return
    queued = f" ({queued_s:.1f} s of it spent queued)" if queued_s >= 0.1 else ""
    response.error_message = f"rollout exceeded its agent_timeout_sec of {limit:g} s{queued}"


def cancelled_response(request: RolloutRequest, reason: str, when: str = "") -> RolloutResponse:
    """The ``ERROR``/``cancelled`` result of a rollout stopped before its agent ran."""
    return RolloutResponse(
        rollout_id=request.rollout_id,
        status=RolloutStatus.ERROR,
        final_messages=list(request.messages),
        finish_reason="cancelled",
        error_message=f"rollout cancelled ({reason}){' ' + when if when else ''}",
    )


def wants_grade(agent: RolloutAgentLoop, response: RolloutResponse) -> bool:
    """Whether the grader phase runs: the agent has ``grade`` and ``run()`` completed."""
    return has_grade(agent) and response.status is RolloutStatus.COMPLETED


async def grade(
    agent: RolloutAgentLoop,
    entry: RolloutEntry,
    response: RolloutResponse,
    rollout_timeout_s: float,
) -> Grade | None:
    """Run the grade under v2's ``grader_timeout_sec``, else the server's rollout timeout."""
    request = entry.request
    limit: float | None = getattr(request, "grader_timeout_sec", None)
    return await run_grade(
        agent,
        entry.control.context,
        response,
        timeout_s=rollout_timeout_s if limit is None else limit,
        control=entry.control,
        secret=request.api_key_value,
    )
