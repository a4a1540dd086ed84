"""Broken: tools[1] has no `function`, tools[2] is a string."""

from osmosis_rollout import RolloutAgentLoop

OK = {"type": "function", "function": {"name": "ok", "description": "Fine."}}


class InvalidToolAgent(RolloutAgentLoop):
    name = "tools"

    def get_tools(self, request):
        return [OK, {"type": "function"}, "add"]

    async def run(self, ctx):
        return ctx.complete(list(ctx.request.messages))
