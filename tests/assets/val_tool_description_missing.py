"""Warns: a tool without a description."""

from osmosis_rollout import RolloutAgentLoop


class UndescribedAgent(RolloutAgentLoop):
    name = "tools"

    def get_tools(self, request):
        return [{"type": "function", "function": {"name": "add"}}]

    async def run(self, ctx):
        return ctx.complete(list(ctx.request.messages))
