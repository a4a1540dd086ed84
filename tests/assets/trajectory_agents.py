"""Agents for the trajectory tests."""

import anyio

from osmosis_rollout import RolloutAgentLoop, RolloutContext, RolloutRequest, RolloutResult


class SlowFirstRowsAgent(RolloutAgentLoop):
    """Answers in one turn; the row tagged ``t1`` waits first, so it finishes last."""

    name = "slow-first-rows"

    def get_tools(self, request: RolloutRequest) -> list:
        return []

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        if ctx.request.metadata.get("tag") == "t1":
            await anyio.sleep(0.5)
        messages = list(ctx.request.messages)
        result = await ctx.chat(messages)
        messages.append(result.message)
        return ctx.complete(messages, reward=1.0)
