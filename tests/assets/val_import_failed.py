"""Broken: imports a package that is not installed."""

import osmosis_validate_missing_dependency  # noqa: F401  # <- IMPORT_FAILED

from osmosis_rollout import RolloutAgentLoop


class NeedsDependencyAgent(RolloutAgentLoop):
    name = "needs-dependency"

    def get_tools(self, request):
        return []

    async def run(self, ctx):
        return ctx.complete(list(ctx.request.messages))
