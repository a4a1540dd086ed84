"""Broken: run() is a plain function."""

from osmosis_rollout import RolloutAgentLoop


class SyncRunAgent(RolloutAgentLoop):
    name = "sync-run"

    def get_tools(self, request):
        return []

    def run(self, ctx):  # <- RUN_NOT_ASYNC
        return ctx.complete(list(ctx.request.messages))
