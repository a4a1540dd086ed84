"""Broken: no `name`."""

from osmosis_rollout import RolloutAgentLoop


class NamelessAgent(RolloutAgentLoop):  # <- NAME_MISSING
    def get_tools(self, request):
        return []

    async def run(self, ctx):
        return ctx.complete(list(ctx.request.messages))
