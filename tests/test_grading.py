"""``grading``: the grader phase's outcomes and the v2 error categories, without a server (the
server's use of it is in tests/test_wire_v2.py and tests/test_wire_control.py)."""

from __future__ import annotations

import math
from typing import Any

import anyio
import pytest

from osmosis_rollout.errors import ProtocolError, ToolError, TrainGateUnavailable, error_category
from osmosis_rollout.grading import has_grade, run_grade
from osmosis_rollout.protocol import RolloutResponse, RolloutStatus
from osmosis_rollout.rollout import RolloutControl

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("exc", "category"),
    [
        (TrainGateUnavailable("down"), "http_error"),
        (ProtocolError("not a completion"), "http_error"),
        (TimeoutError("slow"), "timeout"),
        (ValueError("bad"), "validation_error"),
        (TypeError("bad"), "validation_error"),
        (AssertionError("bad"), "validation_error"),
        (ToolError("tool broke"), "agent_error"),
        (RuntimeError("boom"), "agent_error"),
    ],
)
def test_error_categories(exc: BaseException, category: str) -> None:
    """v2's err_category: a failed chat call is http_error (U7), the rest as spec section 7."""
    assert error_category(exc) == category


class _Graded:
    name = "graded"

    def __init__(self, value: Any = 1.0, sleep_s: float = 0.0) -> None:
        self.value, self.sleep_s = value, sleep_s

    async def grade(self, ctx: Any, result: Any) -> Any:
        await anyio.sleep(self.sleep_s)
        if isinstance(self.value, BaseException):
            raise self.value
        return self.value


def _completed(reward: float | None = None) -> RolloutResponse:
    return RolloutResponse(rollout_id="r", status=RolloutStatus.COMPLETED, reward=reward)


async def _grade(agent: Any, response: RolloutResponse | None = None, **kw: Any) -> Any:
    control = kw.pop("control", RolloutControl())
    return await run_grade(
        agent, object(), response or _completed(), control=control, timeout_s=kw.pop("t", 5.0)
    )


async def test_a_grade_is_its_finite_return_value() -> None:
    assert (await _grade(_Graded(1))).reward == 1.0
    assert (await _grade(_Graded(0.25))).reward == 0.25


@pytest.mark.parametrize("value", [math.nan, math.inf, True, "1.0", None])
async def test_a_grade_that_is_not_a_finite_number_fails(value: Any) -> None:
    outcome = await _grade(_Graded(value))
    assert outcome.reward is None
    assert outcome.category == "validation_error"
    assert "finite number" in outcome.error


async def test_a_grader_that_raises_or_runs_late_fails_with_its_category() -> None:
    raised = await _grade(_Graded(RuntimeError("down, key=k-1")))
    late = await _grade(_Graded(1.0, sleep_s=5), t=0.05)
    assert (raised.category, late.category) == ("agent_error", "timeout")
    assert "grade() raised RuntimeError" in raised.error
    assert late.error == "grader exceeded its 0.05s deadline"


async def test_a_cancelled_grade_says_so_and_no_grade_without_the_hook() -> None:
    control = RolloutControl()
    control.cancel("cancelled by the trainer")
    cancelled = await _grade(_Graded(1.0, sleep_s=5), control=control)
    assert cancelled.cancelled
    assert cancelled.error == "grading cancelled (cancelled by the trainer)"
    assert not has_grade(object())  # type: ignore[arg-type]
    assert await _grade(object()) is None
    failed = RolloutResponse(rollout_id="r", status=RolloutStatus.ERROR)
    assert await _grade(_Graded(), failed) is None  # a failed rollout is not graded
