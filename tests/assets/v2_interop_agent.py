"""The agent behind tests/test_v2_interop.py: the last user message says what it does.

``sleep S`` sleeps S seconds first (a slow rollout, to time out, fill the server or cancel);
``raise`` raises; anything else: the usual tool loop, rewarded 1.0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from osmosis_rollout import RolloutAgentLoop, RolloutRequest, RolloutResult, Toolbox

if TYPE_CHECKING:
    from osmosis_rollout import RolloutContext


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


class InteropAgent(RolloutAgentLoop):
    name = "v2_interop"

    def __init__(self) -> None:
        self.toolbox = Toolbox([add])

    def get_tools(self, request: RolloutRequest) -> list:
        return self.toolbox.schemas

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        text = str(ctx.request.messages[-1].get("content") or "")
        if text.startswith("sleep "):
            await anyio.sleep(float(text.split()[1]))
        if text == "raise":
            raise RuntimeError("boom from the interop agent")
        messages = list(ctx.request.messages)
        for _ in range(4):
            result = await ctx.chat(messages)
            messages.append(result.message)
            if not result.has_tool_calls:
                return ctx.complete(messages, reward=1.0)
            messages.extend(await self.toolbox.execute(ctx, result.tool_calls))
        return ctx.complete(messages, finish_reason="max_turns", reward=0.0)
