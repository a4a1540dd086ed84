"""Agents for the trajectory tests."""

import anyio

from osmosis_rollout import RolloutAgentLoop, RolloutContext, RolloutRequest, RolloutResult


class SlowFirstRowsAgent(RolloutAgentLoop):
    """Answers in one turn; the row tagged ``t1`` waits first, so it finishes last."""

    name = "slow-first-rows"

    def get_tools(self, request: RolloutRequest) -> list:
        return []

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        if ctx.request.metadata.get("tag") == "t1":
            await anyio.sleep(0.5)
        messages = list(ctx.request.messages)
        result = await ctx.chat(messages)
        messages.append(result.message)
        return ctx.complete(messages, reward=1.0)


def add(a: float, b: float) -> float:
    """Add two numbers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


class MixedAgent(RolloutAgentLoop):
    """What the row's ``kind`` says: ``ok`` (tools, then reward), ``error`` (fails after a
    turn) or ``rewrite`` (drops a message at turn 2: a ``history_rewritten`` finding)."""

    name = "mixed"

    def __init__(self) -> None:
        from osmosis_rollout.tools import Toolbox

        self.toolbox = Toolbox([add])

    def get_tools(self, request: RolloutRequest) -> list:
        return self.toolbox.schemas

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        kind = ctx.request.metadata.get("kind", "ok")
        reward = float(ctx.request.metadata.get("reward", 1.0))
        messages = list(ctx.request.messages)
        for _ in range(ctx.request.max_turns):
            result = await ctx.chat(messages)
            messages.append(result.message)
            if kind == "error":
                return ctx.error("the agent gave up on purpose")
            if kind == "rewrite":
                messages = messages[1:]
                kind = "ok"
            if not result.has_tool_calls:
                return ctx.complete(messages, reward=reward)
            messages.extend(await self.toolbox.execute(ctx, result.tool_calls))
        return ctx.complete(messages, finish_reason="max_turns", reward=reward)
