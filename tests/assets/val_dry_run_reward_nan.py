"""Broken at run time: the reward is NaN."""

from osmosis_rollout import RolloutAgentLoop


class NanRewardAgent(RolloutAgentLoop):
    name = "nan-reward"

    def get_tools(self, request):
        return []

    async def run(self, ctx):  # <- DRY_RUN_REWARD_INVALID
        messages = list(ctx.request.messages)
        result = await ctx.chat(messages)
        return ctx.complete([*messages, result.message], reward=float("nan"))
