"""Broken: no run()."""

from osmosis_rollout import RolloutAgentLoop


class RunlessAgent(RolloutAgentLoop):  # <- RUN_MISSING
    name = "runless"

    def get_tools(self, request):
        return []
