"""Broken: `name` is an empty string."""

from osmosis_rollout import RolloutAgentLoop


class BlankNameAgent(RolloutAgentLoop):
    name = ""  # <- NAME_INVALID

    def get_tools(self, request):
        return []

    async def run(self, ctx):
        return ctx.complete(list(ctx.request.messages))
