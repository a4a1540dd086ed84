"""Agents that stop on their terminal tool, for the walking mock LLM's tests."""

from __future__ import annotations

from osmosis_rollout import RolloutAgentLoop, RolloutContext, RolloutRequest, RolloutResult
from osmosis_rollout.tools import Toolbox


def lookup(term: str) -> str:
    """Look a term up.

    Args:
        term: What to look up.
    """
    return f"{term}: 42"


def search(query: str, limit: int = 3) -> list[str]:
    """Search the notes.

    Args:
        query: The words to find.
        limit: At most this many results.
    """
    return [query][:limit]


def submit_answer(answer: str) -> str:
    """Submit the final answer; the rollout ends.

    Args:
        answer: The answer.
    """
    return "submitted"


class SubmitAgent(RolloutAgentLoop):
    """Ends at ``submit_answer``; its reward is 1.0 when it looked something up first, and a
    submission in the first turn is an error (what the dry run must not hit)."""

    name = "submit"

    def __init__(self) -> None:
        self.toolbox = Toolbox([submit_answer, lookup, search])

    def get_tools(self, request: RolloutRequest) -> list:
        return self.toolbox.schemas

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = list(ctx.request.messages)
        for _ in range(ctx.request.max_turns):
            result = await ctx.chat(messages)
            messages.append(result.message)
            if not result.has_tool_calls:
                return ctx.complete(messages, reward=0.0)
            messages.extend(await self.toolbox.execute(ctx, result.tool_calls))
            if any(c["function"]["name"] == "submit_answer" for c in result.tool_calls):
                if ctx.turns == 1:
                    return ctx.error("submitted in the first turn, before any lookup")
                return ctx.complete(messages, reward=1.0)
        return ctx.complete(messages, finish_reason="max_turns", reward=0.0)


class EchoAgent(RolloutAgentLoop):
    """No tools: answers once with what the model said; its reward says whether it saw the
    row's scripted replies in the metadata (it must not)."""

    name = "echo"

    def get_tools(self, request: RolloutRequest) -> list:
        return []

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        result = await ctx.chat(list(ctx.request.messages))
        leaked = "mock_replies" in ctx.request.metadata
        return ctx.complete([*ctx.request.messages, result.message], reward=-1.0 if leaked else 1.0)
