"""An agent's tools for one rollout: ``get_tools`` called, its answer checked, as a ``ToolSet``.

The server calls :func:`resolve_tool_set` at every init; the check is ``checks.check_tools``.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import anyio
from pydantic import TypeAdapter

from ..agent import RolloutAgentLoop
from ..errors import AgentDefinitionError
from ..protocol import OpenAIFunctionToolSchema, RolloutRequest
from .checks import check_tools

__all__ = ["ToolSet", "resolve_tool_set", "resolve_tools"]


async def resolve_tools(
    agent: RolloutAgentLoop, request: RolloutRequest
) -> list[OpenAIFunctionToolSchema]:
    """Call ``get_tools`` (sync or async) and check what it returned.

    Raises ``AgentDefinitionError`` naming the offending entry, e.g. ``tools[2]``.
    """
    return list((await resolve_tool_set(agent, request)).tools)


@dataclass(frozen=True, slots=True)
class ToolSet:
    """One checked tool list: the models an agent sees and their JSON for the init's 202.

    Made anew for every call (the check builds its own models from what ``get_tools``
    returned), so a rollout editing its tools changes no other rollout's. Not cached: checking
    the calculator example's four tools costs ~0.07 ms an init, 0-2% of ``osmosis test``'s CPU
    a row (``benchmarks/bench_test_throughput.py``)."""

    tools: tuple[OpenAIFunctionToolSchema, ...]
    json: bytes


_TOOLS_JSON = TypeAdapter(list[OpenAIFunctionToolSchema])


async def resolve_tool_set(
    agent: RolloutAgentLoop, request: RolloutRequest, *, timeout_s: float | None = None
) -> ToolSet:
    """:func:`resolve_tools` with the tools' JSON.

    ``timeout_s`` bounds an async ``get_tools`` (``TimeoutError``); a sync one cannot be
    interrupted, so it gets no cancel scope to pay for.
    """
    raw = agent.get_tools(request)
    if inspect.isawaitable(raw):
        with anyio.fail_after(timeout_s):
            raw = await raw
    if raw is None:
        return _NO_TOOLS
    if not isinstance(raw, list | tuple):
        raise AgentDefinitionError(
            f"get_tools() must return a list of tools, got {type(raw).__name__}"
        )
    tools = check_tools(raw)
    return ToolSet(tuple(tools), _TOOLS_JSON.dump_json(tools, exclude_none=True))


_NO_TOOLS = ToolSet((), b"[]")
