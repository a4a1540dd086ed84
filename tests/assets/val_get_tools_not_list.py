"""Broken: get_tools() returns a dict, not a list."""

from osmosis_rollout import RolloutAgentLoop


class DictToolsAgent(RolloutAgentLoop):
    name = "tools"

    def get_tools(self, request):
        return {"add": {"type": "function"}}

    async def run(self, ctx):
        return ctx.complete(list(ctx.request.messages))
