"""Broken: run() does not take the context."""

from osmosis_rollout import RolloutAgentLoop


class NoCtxAgent(RolloutAgentLoop):
    name = "no-ctx"

    def get_tools(self, request):
        return []

    async def run(self):  # <- RUN_SIGNATURE
        return None
