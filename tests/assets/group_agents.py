"""An agent whose rewards are scripted per row and sample, for the group figures' tests."""

from __future__ import annotations

import re

from osmosis_rollout import RolloutAgentLoop, RolloutContext, RolloutRequest, RolloutResult

_SAMPLE = re.compile(r"^row-\d+-s(\d+)-")


class OutcomeAgent(RolloutAgentLoop):
    """Its reward is the row's ``outcomes[sample]`` (the sample read from the rollout id)."""

    name = "outcomes"

    def get_tools(self, request: RolloutRequest) -> list:
        return []

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        result = await ctx.chat(list(ctx.request.messages))
        found = _SAMPLE.match(ctx.request.rollout_id)
        sample = int(found.group(1)) if found else 0
        reward = ctx.request.metadata["outcomes"][sample]
        return ctx.complete([*ctx.request.messages, result.message], reward=reward)
