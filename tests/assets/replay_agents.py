"""A small tool agent to record, and deliberately changed copies of it that a replay must catch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from osmosis_rollout import RolloutAgentLoop, RolloutRequest, RolloutResult, Toolbox

if TYPE_CHECKING:
    from osmosis_rollout import RolloutContext


def add(a: float, b: float) -> str:
    """Add two numbers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return str(a + b)


def describe(n: int) -> str:
    """Describe a number at length.

    Args:
        n: How many characters to write.
    """
    return "ab" * (n // 2)


def add_v2(a: float, b: float) -> str:
    """Add two numbers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return f"result: {a + b:g}"  # the changed output format


add_v2.__name__ = "add"


class CalcAgent(RolloutAgentLoop):
    """Adds a system prompt, runs the tools the model calls, scores the answer."""

    name = "replay_calc"
    system = "You are a careful calculator. Use the tools."
    tools = (add, describe)

    def __init__(self) -> None:
        self.toolbox = Toolbox(list(self.tools))

    def get_tools(self, request: RolloutRequest) -> list:
        return self.toolbox.schemas

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = [{"role": "system", "content": self.system}, *ctx.request.messages]
        truth = str(ctx.request.metadata.get("ground_truth", ""))
        for _ in range(ctx.request.max_turns):
            result = await ctx.chat(messages)
            messages.append(result.message)
            if not result.has_tool_calls:
                return await self.finish(ctx, messages, result.content or "", truth)
            messages.extend(await self.toolbox.execute(ctx, result.tool_calls))
        return ctx.complete(messages, finish_reason="max_turns", reward=0.0)

    async def finish(
        self, ctx: RolloutContext, messages: list, answer: str, truth: str
    ) -> RolloutResult:
        return ctx.complete(messages, reward=self.score(answer, truth))

    def score(self, answer: str, truth: str) -> float:
        return 1.0 if truth and truth in answer else 0.0


class ChangedPromptAgent(CalcAgent):
    system = "You are a sloppy calculator."


class ChangedToolFormatAgent(CalcAgent):
    tools = (add_v2, describe)


class ExtraTurnAgent(CalcAgent):
    async def finish(
        self, ctx: RolloutContext, messages: list, answer: str, truth: str
    ) -> RolloutResult:
        messages.append({"role": "user", "content": "Are you sure?"})
        result = await ctx.chat(messages)
        messages.append(result.message)
        return ctx.complete(messages, reward=self.score(answer, truth))


class ChangedRewardAgent(CalcAgent):
    def score(self, answer: str, truth: str) -> float:
        return 0.5
