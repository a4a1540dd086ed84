"""The agent the docs call ``agent.py:MyAgent``, copied into each page's sandbox by test_docs."""

from __future__ import annotations

from osmosis_rollout import RolloutAgentLoop, RolloutContext, RolloutRequest, RolloutResult
from osmosis_rollout.tools import Toolbox


def add(a: float, b: float) -> float:
    """Add two numbers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


class MyAgent(RolloutAgentLoop):
    """Calls the model, runs the tools it asks for, stops when it answers."""

    name = "my-agent"

    def __init__(self) -> None:
        self.toolbox = Toolbox([add])

    def get_tools(self, request: RolloutRequest) -> list:
        return self.toolbox.schemas

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = list(ctx.request.messages)
        for _ in range(ctx.request.max_turns):
            result = await ctx.chat(messages)
            messages.append(result.message)
            if not result.has_tool_calls:
                return ctx.complete(messages, reward=1.0)
            messages.extend(await self.toolbox.execute(ctx, result.tool_calls))
        return ctx.complete(messages, finish_reason="max_turns")
