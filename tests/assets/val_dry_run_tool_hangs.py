"""Broken at run time: a tool call outlasts the rollout's deadline (a sync and an async one)."""

import time

import anyio

from osmosis_rollout import RolloutAgentLoop
from osmosis_rollout.tools import Toolbox


def run_sql(query: str) -> str:
    """Run a SQL query.

    Args:
        query: The query.
    """
    time.sleep(1.5)  # a query that takes far longer than the deadline
    return "[]"


async def fetch(url: str) -> str:
    """Fetch a page.

    Args:
        url: The page's address.
    """
    await anyio.sleep(30)
    return ""


class SlowSqlAgent(RolloutAgentLoop):
    name = "slow-sql"

    def __init__(self):
        self.toolbox = Toolbox([run_sql])

    def get_tools(self, request):
        return self.toolbox.schemas

    async def run(self, ctx):  # <- DRY_RUN_TIMEOUT
        messages = list(ctx.request.messages)
        for _ in range(ctx.request.max_turns):
            result = await ctx.chat(messages)
            messages.append(result.message)
            if not result.has_tool_calls:
                return ctx.complete(messages)
            messages.extend(await self.toolbox.execute(ctx, result.tool_calls))
        return ctx.complete(messages)


class SlowFetchAgent(SlowSqlAgent):
    name = "slow-fetch"

    def __init__(self):
        self.toolbox = Toolbox([fetch])
