"""Broken: get_tools() never returns."""

import anyio

from osmosis_rollout import RolloutAgentLoop


class SlowToolsAgent(RolloutAgentLoop):
    name = "slow-tools"

    async def get_tools(self, request):
        await anyio.sleep_forever()

    async def run(self, ctx):
        return ctx.complete(list(ctx.request.messages))
