"""Broken: no get_tools()."""

from osmosis_rollout import RolloutAgentLoop


class ToollessAgent(RolloutAgentLoop):  # <- GET_TOOLS_MISSING
    name = "toolless"

    async def run(self, ctx):
        return ctx.complete(list(ctx.request.messages))
