"""A real MCP server for tests/test_mcp_tools.py, written with the mcp package's server API.

python mcp_server.py stdio
python mcp_server.py http PORT      (streamable HTTP on 127.0.0.1:PORT/mcp)
"""

from __future__ import annotations

import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("calc")


@server.tool()
def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


@server.tool()
def multiply(a: float, b: float) -> float:
    """Multiply two numbers."""
    return a * b


@server.tool()
def slow(seconds: float) -> str:
    """Sleep, then say so."""
    time.sleep(seconds)
    return "slept"


@server.tool()
def fail(reason: str) -> str:
    """Always fails, with a message meant for the model."""
    raise ToolError(f"failed on purpose: {reason}")


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
