"""A calculator agent written with Toolbox: typed functions in, tool messages out."""

from __future__ import annotations

from typing import TYPE_CHECKING

from osmosis_rollout import RolloutAgentLoop, RolloutRequest, RolloutResult, Toolbox, tool

if TYPE_CHECKING:
    from osmosis_rollout import RolloutContext


def add(a: float, b: float) -> float:
    """Add two numbers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


@tool(description="Multiply two numbers")
async def mul(a: float, b: float) -> float:
    return a * b


def turn(context: RolloutContext) -> int:
    """The number of LLM turns run so far."""
    return context.turns


class ToolAgent(RolloutAgentLoop):
    name = "tool_agent"

    def __init__(self) -> None:
        self.toolbox = Toolbox([add, mul, turn])

    def get_tools(self, request: RolloutRequest) -> list:
        return self.toolbox.schemas

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = list(ctx.request.messages)
        for _ in range(ctx.request.max_turns):
            result = await ctx.chat(messages)
            messages.append(result.message)
            if not result.has_tool_calls:
                return ctx.complete(messages)
            messages.extend(await self.toolbox.execute(ctx, result.tool_calls))
        return ctx.complete(messages, finish_reason="max_turns")
