"""Agents that report their reward's parts, for the reward components' tests."""

from __future__ import annotations

from osmosis_rollout import RolloutAgentLoop, RolloutContext, RolloutRequest, RolloutResult


class PartsAgent(RolloutAgentLoop):
    """A format part always, a correctness part on even rows; a judge note in extra_fields."""

    name = "parts"

    def get_tools(self, request: RolloutRequest) -> list:
        return []

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        result = await ctx.chat(list(ctx.request.messages))
        correct = 1.0 if ctx.request.metadata.get("even") else 0.0
        return ctx.complete(
            [*ctx.request.messages, result.message],
            reward=0.2 + 0.8 * correct,
            reward_components={"format": 0.2, "correctness": correct},
            extra_fields={"judge": "exact-match"},
        )


class BadPartsAgent(RolloutAgentLoop):
    """A component that is not a number."""

    name = "bad-parts"

    def get_tools(self, request: RolloutRequest) -> list:
        return []

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        result = await ctx.chat(list(ctx.request.messages))
        return ctx.complete(
            [*ctx.request.messages, result.message],
            reward=1.0,
            reward_components={"format": "good"},
        )
