"""Broken: get_tools() raises."""

from osmosis_rollout import RolloutAgentLoop


def load_tools():
    raise FileNotFoundError("tools.json")  # <- GET_TOOLS_FAILED


class GetToolsRaisesAgent(RolloutAgentLoop):
    name = "tools"

    def get_tools(self, request):
        return load_tools()

    async def run(self, ctx):
        return ctx.complete(list(ctx.request.messages))
