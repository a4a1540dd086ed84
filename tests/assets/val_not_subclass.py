"""Broken: the class forgets to derive from RolloutAgentLoop."""


class PlainAgent:  # <- NOT_A_SUBCLASS
    name = "plain"

    def get_tools(self, request):
        return []

    async def run(self, ctx):
        return ctx.complete([])
