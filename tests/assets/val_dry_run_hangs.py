"""Broken at run time: run() waits forever."""

import anyio

from osmosis_rollout import RolloutAgentLoop


class HangingAgent(RolloutAgentLoop):
    name = "hanging"

    def get_tools(self, request):
        return []

    async def run(self, ctx):  # <- DRY_RUN_TIMEOUT
        await anyio.sleep_forever()
        return ctx.complete(list(ctx.request.messages))
