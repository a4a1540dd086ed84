"""Broken: the module raises while being imported."""

from osmosis_rollout import RolloutAgentLoop

CONFIG = {}
MODEL_PATH = CONFIG["model_path"]  # <- MODULE_RAISED


class ConfiguredAgent(RolloutAgentLoop):
    name = "configured"

    def get_tools(self, request):
        return []

    async def run(self, ctx):
        return ctx.complete(list(ctx.request.messages))
