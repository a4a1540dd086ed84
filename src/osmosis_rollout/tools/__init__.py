"""Tools for agents: OpenAI tool schemas built from Python functions, argument checks, execution.

A typed function with a Google-style docstring is enough to declare a tool::

    def add(a: float, b: float) -> float:
        \"\"\"Add two numbers.

        Args:
            a: The first addend.
            b: The second addend.
        \"\"\"
        return a + b

    toolbox = Toolbox([add])          # get_tools: return toolbox.schemas
    messages.extend(await toolbox.execute(ctx, result.tool_calls))

Whatever goes wrong in a tool call (unknown tool, bad JSON, a schema violation, an exception, a
timeout) becomes a ``"role": "tool"`` message the model can read and react to, never an
exception that would end the rollout: a model's mistake is training signal, not a crash.

Public API: the names of ``__all__``, and ``tools.mcp`` (``McpTools``, ``StdioServer``: tools
served over MCP). The other submodules are internal.
"""

from .arguments import _compiled as _compiled  # for tests that inspect the validator cache
from .arguments import parse_arguments, validate_arguments
from .schema import tool, tool_schema
from .toolbox import Toolbox, execute_tool_calls

__all__ = [
    "Toolbox",
    "execute_tool_calls",
    "parse_arguments",
    "tool",
    "tool_schema",
    "validate_arguments",
]
