"""Broken: the class cannot be created without arguments."""

from osmosis_rollout import RolloutAgentLoop


class NeedsArgsAgent(RolloutAgentLoop):
    name = "needs-args"

    def __init__(self, model_path):
        self.model_path = model_path

    def get_tools(self, request):
        return []

    async def run(self, ctx):
        return ctx.complete(list(ctx.request.messages))
