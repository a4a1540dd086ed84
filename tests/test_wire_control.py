"""Status and cancel for v1 rollouts (this project's extension, docs/protocol.md), and the grade
hook on the v1 wire: in-process through ``tests/serving.py``, the mock TrainGate behind it."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from osmosis_rollout import RolloutContext, RolloutResult

from .serving import SERVER_KEY, init_body, serving
from .support import load_asset

pytestmark = pytest.mark.anyio

agents = load_asset("srv_agents")
AUTH = {"Authorization": f"Bearer {SERVER_KEY}"}


class GradedTools(agents.ToolAgent):  # type: ignore[name-defined,misc]
    """The tool agent with a grader that halves the reward run() gave (or fails on demand)."""

    name = "v1-graded"

    async def grade(self, ctx: RolloutContext, result: RolloutResult) -> float:
        if ctx.request.metadata.get("grade_raises"):
            raise RuntimeError("grader down")
        if ctx.request.metadata.get("grade_nan"):
            return float("nan")
        assert result.reward is not None
        return result.reward / 2


async def test_v1_status_follows_a_rollout_to_its_end(tmp_path: Path) -> None:
    """queued/running while in flight, success with the reward after its callback, unknown for
    an id never seen; the v2 route does not see v1 rollouts."""
    agent = agents.Gated()
    async with serving(agent, tmp_path, max_concurrent=1) as s:
        await s.init(init_body("a"))
        await s.init(init_body("b"))
        await agent.started.wait()
        running = (await s.http.get("/v1/rollout/a/status", headers=AUTH)).json()
        queued = (await s.http.get("/v1/rollout/b/status", headers=AUTH)).json()
        other_wire = (await s.http.get("/rollout/a/status", headers=AUTH)).json()
        agent.release.set()
        await s.settle()
        done = (await s.http.get("/v1/rollout/a/status", headers=AUTH)).json()
        unknown = (await s.http.get("/v1/rollout/zz/status", headers=AUTH)).json()
        unauthorized = await s.http.get("/v1/rollout/a/status")

    assert running["status"] == "running"
    assert queued["status"] == "queued"
    assert other_wire["status"] == "unknown"
    assert done == {"rollout_id": "a", "status": "success", "reward": None, "err_message": None}
    assert unknown["status"] == "unknown"
    assert unauthorized.status_code == 401


async def test_a_v1_rollout_id_with_a_slash_has_a_status(tmp_path: Path) -> None:
    """v1 ids may hold "/" (sent as is or percent-encoded): the status route still finds them."""
    async with serving(agents.ToolAgent(), tmp_path) as s:
        await s.init(init_body("team/run-1"))
        await s.settle()
        plain = (await s.http.get("/v1/rollout/team/run-1/status", headers=AUTH)).json()
        encoded = (await s.http.get("/v1/rollout/team%2Frun-1/status", headers=AUTH)).json()

    assert plain["rollout_id"] == encoded["rollout_id"] == "team/run-1"
    assert plain["status"] == encoded["status"] == "success"


async def test_a_cancelled_v1_rollout_ends_in_one_error_callback(tmp_path: Path) -> None:
    """POST /v1/rollout/cancel: the running and the queued rollout each end in exactly one
    ERROR callback with finish_reason cancelled (never silence); status says cancelled."""
    agent = agents.Gated()
    async with serving(agent, tmp_path, max_concurrent=1) as s:
        await s.init(init_body("a"))
        await s.init(init_body("b"))
        await agent.started.wait()
        answer = await s.http.post("/v1/rollout/cancel", json={"ids": ["a", "b"]}, headers=AUTH)
        await s.settle()
        status = (await s.http.get("/v1/rollout/b/status", headers=AUTH)).json()

    assert answer.json() == {"dispositions": {"a": "cancelled_running", "b": "cancelled_queued"}}
    for rid in ("a", "b"):
        [callback] = s.completions(rid)
        assert (callback.status.value, callback.finish_reason) == ("ERROR", "cancelled")
        assert "cancelled by the trainer" in (callback.error_message or "")
    assert agent.runs == ["a"]  # the queued one never ran
    assert status["status"] == "cancelled"


async def test_grade_replaces_the_reward_before_the_v1_callback(tmp_path: Path) -> None:
    """grade(ctx, result) runs before the completion callback; its value is the reward."""
    async with serving(GradedTools(), tmp_path) as s:
        await s.init(init_body("g"))
        await s.settle()

    [callback] = s.completions("g")
    assert (callback.status.value, callback.reward) == ("COMPLETED", 0.5)


@pytest.mark.parametrize("failure", ["grade_raises", "grade_nan"])
async def test_a_failed_grade_ends_the_v1_rollout_error(tmp_path: Path, failure: str) -> None:
    """A grader that raises or returns a non-finite value: one ERROR callback saying so."""
    async with serving(GradedTools(), tmp_path) as s:
        await s.init(init_body("g", metadata={failure: True}))
        await s.settle()

    [callback] = s.completions("g")
    assert callback.status.value == "ERROR"
    assert callback.reward is None
    assert "grade()" in (callback.error_message or "")


async def test_cancel_while_grading_ends_cancelled(tmp_path: Path) -> None:
    """A cancel that arrives while grade() runs stops it: one ERROR/cancelled callback."""
    started = anyio.Event()

    class SlowGrade(agents.ToolAgent):  # type: ignore[name-defined,misc]
        name = "v1-slow-grade"

        async def grade(self, ctx: RolloutContext, result: RolloutResult) -> float:
            started.set()
            await anyio.sleep(30)
            return 1.0

    async with serving(SlowGrade(), tmp_path) as s:
        await s.init(init_body("g"))
        await started.wait()
        grading = (await s.http.get("/v1/rollout/g/status", headers=AUTH)).json()
        answer = await s.http.post("/v1/rollout/cancel", json={"all": True}, headers=AUTH)
        await s.settle()

    assert grading["status"] == "grading"
    assert answer.json() == {"dispositions": {"g": "cancelled_running"}}
    [callback] = s.completions("g")
    assert (callback.status.value, callback.finish_reason) == ("ERROR", "cancelled")
