"""Warns: get_tools() returns None instead of []."""

from osmosis_rollout import RolloutAgentLoop


class NoneToolsAgent(RolloutAgentLoop):
    name = "tools"

    def get_tools(self, request):
        return None

    async def run(self, ctx):
        return ctx.complete(list(ctx.request.messages))
