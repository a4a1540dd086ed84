"""__CLASS__: asks the model, runs the tools it calls, repeats until it answers.

Each dataset row becomes one rollout: its messages start the conversation and its
``ground_truth`` (in ``ctx.request.metadata``) scores the final answer.
"""

from __future__ import annotations

from osmosis_rollout import (
    OpenAIFunctionToolSchema,
    RolloutAgentLoop,
    RolloutContext,
    RolloutRequest,
    RolloutResult,
)
from osmosis_rollout.tools import Toolbox

from .reward import score
from .tools import add, divide, multiply, subtract


class __CLASS__(RolloutAgentLoop):
    """A multi-turn tool-calling agent: the reward is 1.0 for a correct final number."""

    name = "__PROJECT__"

    def __init__(self) -> None:
        # A slow or stuck tool becomes an error message for the model after 10 s.
        self.toolbox = Toolbox([add, subtract, multiply, divide], timeout_s=10.0)

    def get_tools(self, request: RolloutRequest) -> list[OpenAIFunctionToolSchema]:
        return self.toolbox.schemas

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        # The history only grows: TrainGate builds training samples from the exact turns sent.
        messages = list(ctx.request.messages)
        ground_truth = ctx.request.metadata.get("ground_truth")
        for _ in range(ctx.request.max_turns):
            result = await ctx.chat(messages)
            messages.append(result.message)
            if not result.has_tool_calls:
                return ctx.complete(messages, reward=score(result.content, ground_truth))
            messages.extend(await self.toolbox.execute(ctx, result.tool_calls))
        return ctx.complete(messages, finish_reason="max_turns", reward=0.0)
