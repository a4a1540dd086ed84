"""Agents rewarded by a judge (tests/test_judging.py): a sound mock judge, a leaky one that
scores every answer 1.0, a failing one, and one ranking ``--samples`` groups together."""

from __future__ import annotations

from typing import Any

from osmosis_rollout.agent import RolloutAgentLoop, RolloutContext
from osmosis_rollout.judging import Criterion, GroupJudge, MockJudge, Rubric, Verdict
from osmosis_rollout.results import RolloutResult

RUBRIC = Rubric([Criterion("correct", "Matches the reference.", 2), Criterion("clear", "Plain.")])


class _Judged(RolloutAgentLoop):
    name = "judged"
    judge: Any = MockJudge()

    def get_tools(self, request: Any) -> list[Any]:
        return []

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = list(ctx.request.messages)
        reply = await ctx.chat(messages)
        return ctx.complete([*messages, reply.message])

    async def grade(self, ctx: RolloutContext, result: RolloutResult) -> Verdict:
        truth = ctx.request.metadata.get("ground_truth")
        verdict: Verdict = await self.judge.score(RUBRIC, result.final_messages, reference=truth)
        return verdict


class SoundJudged(_Judged):
    judge = MockJudge()


class LeakyJudged(_Judged):
    judge = MockJudge(fixed=1.0)


class FailingJudged(_Judged):
    judge = MockJudge(fail="timeout")


GROUPS = GroupJudge(MockJudge(), RUBRIC, wait_s=10)


class GroupJudged(_Judged):
    async def grade(self, ctx: RolloutContext, result: RolloutResult) -> Verdict:
        meta = ctx.request.metadata
        return await GROUPS.score(
            result.final_messages, metadata=meta, reference=meta.get("ground_truth")
        )
