"""Broken at run time only: __init__ replaces the class's name with a blank one."""

from osmosis_rollout import RolloutAgentLoop


class ShadowedNameAgent(RolloutAgentLoop):  # <- NAME_INVALID
    name = "shadowed"

    def __init__(self):
        self.name = "   "

    def get_tools(self, request):
        return []

    async def run(self, ctx):
        return ctx.complete(list(ctx.request.messages))
