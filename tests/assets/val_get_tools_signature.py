"""Broken: get_tools() does not take the request."""

from osmosis_rollout import RolloutAgentLoop


class NoRequestAgent(RolloutAgentLoop):
    name = "no-request"

    def get_tools(self):  # <- GET_TOOLS_SIGNATURE
        return []

    async def run(self, ctx):
        return ctx.complete(list(ctx.request.messages))
