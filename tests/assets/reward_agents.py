"""Agents with sound and broken rewards, for the reward checks' tests."""

from __future__ import annotations

import re

from osmosis_rollout import RolloutAgentLoop, RolloutContext, RolloutRequest, RolloutResult
from osmosis_rollout.tools import Toolbox

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def add(a: float, b: float) -> float:
    """Add two numbers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


class _Answering(RolloutAgentLoop):
    """Runs tools until the model answers; ``score`` turns the answer into a reward."""

    name = "answering"

    def __init__(self) -> None:
        self.toolbox = Toolbox([add])

    def get_tools(self, request: RolloutRequest) -> list:
        return self.toolbox.schemas

    def score(self, answer: str, truth: str) -> float:
        numbers = _NUMBER.findall(answer)
        return 1.0 if numbers and float(numbers[-1]) == float(truth) else 0.0

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = list(ctx.request.messages)
        for _ in range(ctx.request.max_turns):
            result = await ctx.chat(messages)
            messages.append(result.message)
            if not result.has_tool_calls:
                truth = str(ctx.request.metadata.get("ground_truth", ""))
                return ctx.complete(messages, reward=self.score(result.content or "", truth))
            messages.extend(await self.toolbox.execute(ctx, result.tool_calls))
        return ctx.complete(messages, finish_reason="max_turns", reward=0.0)


class SoundAgent(_Answering):
    """1.0 for the right number, 0.0 otherwise."""

    name = "sound"


class LeakyAgent(_Answering):
    """The planted leak: an empty answer scores 1.0."""

    name = "leaky"

    def score(self, answer: str, truth: str) -> float:
        return 1.0 if not answer.strip() else super().score(answer, truth)


class ConstantAgent(_Answering):
    """0.5 whatever happens."""

    name = "constant"

    def score(self, answer: str, truth: str) -> float:
        return 0.5


class ScaledAgent(_Answering):
    """Rewards out of 10, not in [0, 1]."""

    name = "scaled"

    def score(self, answer: str, truth: str) -> float:
        return 10.0 * super().score(answer, truth)
