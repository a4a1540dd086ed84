"""An agent file whose import fails: ``osmosis serve`` must say so in one line, exit 2."""

import osmosis_no_such_dependency  # noqa: F401

from osmosis_rollout import RolloutAgentLoop


class Agent(RolloutAgentLoop):
    name = "srv-import-fails"

    def get_tools(self, request):
        return []

    async def run(self, ctx):
        return ctx.complete([])
