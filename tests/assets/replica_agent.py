"""An agent for the multi-process tests: it sleeps ``metadata.sleep_s``, then completes with
the serving process's id in the result's ``extra_fields`` (so a test sees which process ran it).
"""

import os

import anyio

from osmosis_rollout import RolloutAgentLoop, RolloutContext, RolloutRequest, RolloutResult


class SleepAgent(RolloutAgentLoop):
    """Sleeps, then answers; no LLM turn."""

    name = "replica-sleeper"

    def get_tools(self, request: RolloutRequest) -> list:
        return []

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        await anyio.sleep(float(ctx.request.metadata.get("sleep_s", 0)))
        result = ctx.complete([*ctx.request.messages, {"role": "assistant", "content": "done"}])
        result.extra_fields["pid"] = os.getpid()
        return result
