"""Broken: a tool name with a space."""

from osmosis_rollout import RolloutAgentLoop


class BadNameAgent(RolloutAgentLoop):
    name = "tools"

    def get_tools(self, request):
        return [{"type": "function", "function": {"name": "add numbers", "description": "Add."}}]

    async def run(self, ctx):
        return ctx.complete(list(ctx.request.messages))
