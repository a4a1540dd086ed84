"""The grader phase: ``RolloutAgentLoop.grade(ctx, result)``, run once after ``run()``.

The server runs it between the agent and the callbacks: under ``grader_timeout_sec`` on the v2
wire, under the server's rollout timeout on v1, in its own cancel scope (a cancel of the
rollout stops it too). Its outcome is a ``Grade``: the reward, or why there is none, in the
error categories of protocol v2 (``errors.error_category``) that the v2 callbacks carry. An agent
without ``grade`` is not graded: the reward ``run()`` returned is the grade.

``grade`` returns a number, or a judge's verdict (``judging.Verdict``): then its score is the
reward, its criteria the ``reward_components`` and its cost the ``judge_*`` metrics
(:func:`graded`). A judge that failed (``JudgeError``) is a ``judge_error``, never a reward.
"""

from __future__ import annotations

import logging
import math
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel

from .errors import error_category
from .judging.tape import grading_rollout
from .protocol import RolloutMetrics, RolloutResponse, RolloutStatus
from .redaction import loggable, scrub
from .results import REWARD_COMPONENTS, RolloutResult

if TYPE_CHECKING:
    from .agent import RolloutAgentLoop, RolloutContext
    from .rollout import RolloutControl

__all__ = ["Grade", "graded", "has_grade", "judge_failed", "run_grade"]

logger = logging.getLogger("osmosis_rollout.rollout")


@dataclass(frozen=True, slots=True)
class Grade:
    """How grading ended: ``reward`` (a finite number) or ``error`` with its ``category``."""

    reward: float | None = None
    error: str | None = None
    category: str | None = None
    cancelled: bool = False
    #: A judge's verdict: each criterion's score, and what judging cost (``judge_*`` metrics).
    components: dict[str, float] | None = None
    judge_metrics: dict[str, float] | None = None
    #: The verdict itself, each criterion's score and reason (``extra_fields["judge_verdict"]``).
    verdict: dict[str, dict[str, object]] | None = None


def graded(response: RolloutResponse, grade: Grade) -> RolloutResponse:
    """``response`` with a successful grade's reward, and a verdict's components, reasons and
    cost."""
    update: dict[str, object] = {"reward": grade.reward}
    if grade.components is not None:
        extra = dict(response.extra_fields)
        extra[REWARD_COMPONENTS] = {**extra.get(REWARD_COMPONENTS, {}), **grade.components}
        if grade.verdict is not None:
            extra[JUDGE_VERDICT] = grade.verdict
        update["extra_fields"] = extra
    if grade.judge_metrics is not None:
        metrics = response.metrics or RolloutMetrics()
        update["metrics"] = metrics.model_copy(update=grade.judge_metrics)
    return response.model_copy(update=update)


#: The ``extra_fields`` key of a judge's verdict: ``{criterion: {"score", "reason"}}``.
JUDGE_VERDICT = "judge_verdict"
#: How a judge failure's grade error begins (``grade() raised JudgeError: ...``).
JUDGE_FAILED = "raised JudgeError:"


def judge_failed(error_message: str | None) -> bool:
    """Whether a rollout's error is a judge that gave no verdict (counted as ``judge_errors``)."""
    return error_message is not None and JUDGE_FAILED in error_message


def has_grade(agent: RolloutAgentLoop) -> bool:
    """Whether ``agent``'s class defines ``grade`` (the base class has none)."""
    return callable(getattr(type(agent), "grade", None))


def result_of(response: RolloutResponse) -> RolloutResult:
    """The ``RolloutResult`` ``grade`` is handed: what ``run()`` ended with, as sent."""
    return RolloutResult(
        status=response.status,
        final_messages=response.final_messages,
        finish_reason=response.finish_reason,
        error_message=response.error_message,
        metrics=response.metrics,
        reward=response.reward,
        extra_fields=response.extra_fields,
    )


async def run_grade(
    agent: RolloutAgentLoop,
    ctx: RolloutContext | None,
    response: RolloutResponse,
    *,
    timeout_s: float | None,
    control: RolloutControl,
    secret: str | None = None,
) -> Grade | None:
    """Run ``agent.grade(ctx, result)`` on a ``COMPLETED`` rollout under ``timeout_s`` (None:
    no limit of its own); None when there is nothing to grade (no hook, a failed rollout)."""
    if not has_grade(agent) or ctx is None or response.status is not RolloutStatus.COMPLETED:
        return None
    grade = agent.grade  # type: ignore[attr-defined]
    outcome: Grade | None = None
    with anyio.CancelScope() as scope:
        control.scope = scope
        if control.cancelled:
            scope.cancel()
        if timeout_s is not None:
            scope.deadline = anyio.current_time() + max(0.0, timeout_s)
        try:
            await anyio.lowlevel.checkpoint_if_cancelled()
            token = grading_rollout.set(response.rollout_id)  # judge calls know their rollout
            try:
                reward = await grade(ctx, result_of(response))
            finally:
                grading_rollout.reset(token)
        except Exception as exc:
            text = scrub(f"grade() raised {type(exc).__name__}: {exc}", secret)
            logger.error(
                "rollout %s: %s\n%s",
                loggable(response.rollout_id),
                text,
                scrub(traceback.format_exc(limit=20), secret).rstrip(),
            )
            outcome = Grade(error=text, category=error_category(exc))
        else:
            outcome = _reward_grade(reward)
    control.scope = None
    if outcome is None or scope.cancelled_caught:
        if control.cancelled:
            return Grade(
                error=f"grading cancelled ({control.reason})",
                category="agent_error",
                cancelled=True,
            )
        limit = "" if timeout_s is None else f" {timeout_s:g}s"
        return Grade(error=f"grader exceeded its{limit} deadline", category="timeout")
    return outcome


def _reward_grade(reward: object) -> Grade:
    from .judging.verdict import Verdict

    if isinstance(reward, Verdict):
        return Grade(
            reward=reward.score,
            components=reward.components,
            judge_metrics=reward.usage,
            verdict={n: {"score": c.score, "reason": c.reason} for n, c in reward.criteria.items()},
        )
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        return Grade(
            error=f"grade() must return a finite number, got {type(reward).__name__}",
            category="validation_error",
        )
    if not math.isfinite(reward):
        return Grade(
            error=f"grade() must return a finite number, got {reward!r}",
            category="validation_error",
        )
    return Grade(reward=float(reward))
