"""Broken at run time: run() crashes on the model's first reply."""

from osmosis_rollout import RolloutAgentLoop


class CrashingAgent(RolloutAgentLoop):
    name = "crashing"

    def get_tools(self, request):
        return []

    async def run(self, ctx):
        messages = list(ctx.request.messages)
        result = await ctx.chat(messages)
        score = float(result.message["score"])  # <- DRY_RUN_ERROR
        return ctx.complete([*messages, result.message], reward=score)
