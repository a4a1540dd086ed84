"""__CLASS__: an open-ended answer, rewarded by a judge model grading it against a rubric.

``run()`` asks the policy model once; ``grade()`` hands the transcript to the judge, whose
verdict is the reward (its criteria become ``reward_components``). The judge is configured
apart from the policy model, in ``[tool.osmosis.judge]`` or ``OSMOSIS_JUDGE_*``; ``url =
"mock"`` is the built-in deterministic judge, so tests and CI need no model. A judge that fails
ends the rollout as a ``judge_error``, never as reward 0.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from osmosis_rollout import (
    OpenAIFunctionToolSchema,
    RolloutAgentLoop,
    RolloutContext,
    RolloutRequest,
    RolloutResult,
)
from osmosis_rollout.judging import GroupJudge, Verdict, load_judge, load_rubric

HERE = Path(__file__).parent
RUBRIC = load_rubric(HERE / "rubric.toml")


@cache
def judge() -> GroupJudge:
    """The project's judge, made once: samples of one prompt (``--samples N``) are ranked
    together in one call, others scored alone."""
    return GroupJudge(load_judge(start=HERE), RUBRIC)


class __CLASS__(RolloutAgentLoop):
    """Answers the row's question once; the judge grades the answer."""

    name = "__PROJECT__"

    def get_tools(self, request: RolloutRequest) -> list[OpenAIFunctionToolSchema]:
        return []  # no tools: the model answers directly

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = list(ctx.request.messages)
        result = await ctx.chat(messages)
        messages.append(result.message)
        return ctx.complete(messages)  # no reward here: grade() gives it

    async def grade(self, ctx: RolloutContext, result: RolloutResult) -> Verdict:
        metadata = ctx.request.metadata
        return await judge().score(
            result.final_messages, metadata=metadata, reference=metadata.get("ground_truth")
        )
