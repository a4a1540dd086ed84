"""A four-tool SQLite agent as a new user writes it: the connection is made in the agent's
thread, and the sync tools run in worker threads, which sqlite3 refuses. Every tool call
raises; the rollout still completes, so only ``tool_errors`` shows what went wrong. It ends
on ``submit_answer``, as many agents do."""

from __future__ import annotations

import json
import sqlite3
import weakref

from osmosis_rollout import RolloutAgentLoop, RolloutContext, RolloutRequest, RolloutResult
from osmosis_rollout.tools import Toolbox


class SqliteAgent(RolloutAgentLoop):
    """Answers questions about a small table through SQL tools."""

    name = "sqlite"

    def __init__(self) -> None:
        self.db = sqlite3.connect(":memory:")  # this thread's only
        # Closed with the agent (Python 3.13 warns about a connection left to the collector).
        weakref.finalize(self, self.db.close)
        self.db.execute("CREATE TABLE cities (name TEXT, population INTEGER)")
        self.db.execute("INSERT INTO cities VALUES ('Lyon', 522000), ('Nice', 342000)")
        self.toolbox = Toolbox(
            [self.list_tables, self.describe_table, self.run_query, self.submit_answer]
        )

    def list_tables(self) -> list[str]:
        """List the database's tables."""
        rows = self.db.execute("SELECT name FROM sqlite_master WHERE type='table'")
        return [r[0] for r in rows]

    def describe_table(self, table: str) -> list[str]:
        """Name a table's columns.

        Args:
            table: The table's name.
        """
        return [r[1] for r in self.db.execute(f"PRAGMA table_info({json.dumps(table)})")]

    def run_query(self, sql: str) -> list[list[object]]:
        """Run a read-only SQL query.

        Args:
            sql: The SELECT statement.
        """
        return [list(r) for r in self.db.execute(sql)]

    def submit_answer(self, answer: str) -> str:
        """Submit the final answer.

        Args:
            answer: The answer.
        """
        self.db.execute("SELECT 1")
        return "submitted"

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
                reward = 1.0 if len(messages) > 4 else 0.0  # reached past the first turn
                return ctx.complete(messages, reward=reward)
        return ctx.complete(messages, finish_reason="max_turns", reward=0.0)
