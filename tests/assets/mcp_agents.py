"""Agents whose tools come from an MCP server (tests/test_mcp_tools.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from osmosis_rollout import RolloutAgentLoop, RolloutContext, RolloutRequest, RolloutResult
from osmosis_rollout.tools.mcp import McpTools, StdioServer

SERVER = str(Path(__file__).with_name("mcp_server.py"))


class McpAgent(RolloutAgentLoop):
    """The tools template's loop, its tools served over MCP (stdio by default)."""

    name = "mcp-agent"

    timeout_s = 2.0  # the mock LLM may ask `slow` for a minute: it times out instead

    def __init__(self) -> None:
        url = os.environ.get("MCP_TEST_URL")  # streamable HTTP when set, else stdio
        self.mcp = McpTools(url or StdioServer(sys.executable, [SERVER, "stdio"]), self.timeout_s)

    async def get_tools(self, request: RolloutRequest) -> list[Any]:
        return await self.mcp.schemas()

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = list(ctx.request.messages)
        async with self.mcp.connect() as toolbox:
            for _ in range(ctx.request.max_turns):
                result = await ctx.chat(messages)
                messages.append(result.message)
                if not result.has_tool_calls:
                    return ctx.complete(messages)
                messages.extend(await toolbox.execute(ctx, result.tool_calls))
        return ctx.complete(messages, finish_reason="max_turns")
