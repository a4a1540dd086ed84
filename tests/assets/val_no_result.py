"""Broken: run() calls ctx.complete() but forgets to return it."""

from osmosis_rollout import RolloutAgentLoop


class ForgetfulAgent(RolloutAgentLoop):
    name = "forgetful"

    def get_tools(self, request):
        return []

    async def run(self, ctx):  # <- NO_RESULT_RETURNED end
        messages = list(ctx.request.messages)
        result = await ctx.chat(messages)
        messages.append(result.message)
        if not messages:
            return  # <- NO_RESULT_RETURNED bare
        ctx.complete(messages)  # <- NO_RESULT_RETURNED discarded
