"""A calculator agent: the model answers arithmetic questions using four tools.

Run it offline through the mock TrainGate:

    osmosis test examples/calculator/agent.py:CalculatorAgent \
        --dataset examples/calculator/dataset.jsonl
"""

from __future__ import annotations

import re

from osmosis_rollout import RolloutAgentLoop, RolloutContext, RolloutRequest, RolloutResult
from osmosis_rollout.tools import Toolbox


def add(a: float, b: float) -> float:
    """Add two numbers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


def subtract(a: float, b: float) -> float:
    """Subtract b from a.

    Args:
        a: The number to subtract from.
        b: The number to subtract.
    """
    return a - b


def multiply(a: float, b: float) -> float:
    """Multiply two numbers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def divide(a: float, b: float) -> float:
    """Divide a by b.

    Args:
        a: The dividend.
        b: The divisor; must not be zero.
    """
    if b == 0:
        raise ValueError("division by zero")
    return a / b


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def score(answer: str | None, ground_truth: object) -> float | None:
    """1.0 when the last number in the answer equals the ground truth, else 0.0."""
    if ground_truth is None:
        return None
    numbers = _NUMBER.findall(answer or "")
    if not numbers:
        return 0.0
    try:
        return 1.0 if abs(float(numbers[-1]) - float(str(ground_truth))) < 1e-6 else 0.0
    except ValueError:
        return 0.0


class CalculatorAgent(RolloutAgentLoop):
    """Asks the model, runs the tools it calls, repeats until it answers or runs out of turns."""

    name = "calculator"

    def __init__(self) -> None:
        self.toolbox = Toolbox([add, subtract, multiply, divide])

    def get_tools(self, request: RolloutRequest) -> list:
        return self.toolbox.schemas

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = list(ctx.request.messages)
        for _ in range(ctx.request.max_turns):
            result = await ctx.chat(messages)
            messages.append(result.message)
            if not result.has_tool_calls:
                reward = score(result.content, ctx.request.metadata.get("ground_truth"))
                return ctx.complete(messages, reward=reward)
            messages.extend(await self.toolbox.execute(ctx, result.tool_calls))
        return ctx.complete(messages, finish_reason="max_turns", reward=0.0)
