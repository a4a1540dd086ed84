"""Broken: two tools named add."""

from osmosis_rollout import RolloutAgentLoop

ADD = {"type": "function", "function": {"name": "add", "description": "Add."}}


class DuplicateAgent(RolloutAgentLoop):
    name = "tools"

    def get_tools(self, request):
        return [ADD, ADD]

    async def run(self, ctx):
        return ctx.complete(list(ctx.request.messages))
