"""An agent's tools for one rollout: ``get_tools`` called, its answer checked, as a ``ToolSet``.

The server calls :func:`resolve_tool_set` at every init; the check is ``checks.check_tools``.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from typing import Any

import anyio
from pydantic import BaseModel, TypeAdapter

from ..agent import RolloutAgentLoop
from ..errors import AgentDefinitionError
from ..protocol import OpenAIFunctionSchema, OpenAIFunctionToolSchema, RolloutRequest
from .checks import check_tools

__all__ = ["ToolSet", "resolve_tool_set", "resolve_tools"]


async def resolve_tools(
    agent: RolloutAgentLoop, request: RolloutRequest
) -> list[OpenAIFunctionToolSchema]:
    """Call ``get_tools`` (sync or async) and check what it returned: models of the caller's
    own (copies, so that editing them changes no other rollout's tools).

    Raises ``AgentDefinitionError`` naming the offending entry, e.g. ``tools[2]``.
    """
    return [tool.model_copy(deep=True) for tool in (await resolve_tool_set(agent, request)).tools]


@dataclass(frozen=True, slots=True)
class ToolSet:
    """One checked tool list: the models an agent sees and their JSON for the init's 202.

    Shared between rollouts whose ``get_tools`` returned the same tools, so never edit the
    models: ``RolloutContext.tools`` and :func:`resolve_tools` hand out copies."""

    tools: tuple[OpenAIFunctionToolSchema, ...]
    json: bytes


_TOOLS_JSON = TypeAdapter(list[OpenAIFunctionToolSchema])


class _ToolSetCache:
    """The last few checked tool lists, by their JSON text, so that an agent returning the same
    tools for every rollout (the usual case) has them checked once, not per rollout.

    Kept on measurement (``benchmarks/bench_throughput.py``, fast stack, N=8, 1 tool): without
    it and the URL caches the server's CPU per rollout was 1.14x the tree with them (SDK /
    baseline 0.468 against 0.41); checking one tool costs ~11 µs an init, four tools (the
    calculator example) ~67 µs, 15% of the ~0.45 ms a one-turn rollout costs the server.

    A hit needs the same JSON text *and* equal Python values (so ``{1: ...}`` is not taken for
    ``{"1": ...}``, nor ``1`` for ``1.0``); anything that does not round-trip through JSON is
    checked every time. A list that changes (per rollout, or in place) has another key."""

    __slots__ = ("_entries", "limit")

    def __init__(self, limit: int = 64) -> None:
        self.limit = limit
        self._entries: dict[str, tuple[list[Any], ToolSet]] = {}

    def get(self, key: str, items: list[Any]) -> ToolSet | None:
        found = self._entries.get(key)
        if found is None or found[0] != items:
            return None
        return found[1]

    def put(self, key: str, items: list[Any], tool_set: ToolSet) -> None:
        loaded = json.loads(key)
        if loaded != items:  # tuples, non-string keys...: not JSON data, never cached
            return
        if len(self._entries) >= self.limit:
            del self._entries[next(iter(self._entries))]  # the oldest
        self._entries[key] = (loaded, tool_set)


_tool_sets = _ToolSetCache()


async def resolve_tool_set(
    agent: RolloutAgentLoop, request: RolloutRequest, *, timeout_s: float | None = None
) -> ToolSet:
    """:func:`resolve_tools` with the tools' JSON, checked once per distinct tool list.

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
    items, key = _cache_key(raw)
    if key is not None:
        cached = _tool_sets.get(key, items)
        if cached is not None:
            return cached
    tools = check_tools(raw)
    tool_set = ToolSet(tuple(tools), _TOOLS_JSON.dump_json(tools, exclude_none=True))
    if key is not None:
        _tool_sets.put(key, items, tool_set)
    return tool_set


def _cache_key(raw: list[Any] | tuple[Any, ...]) -> tuple[list[Any], str | None]:
    """What ``get_tools`` returned as JSON-like data (models dumped as the check dumps them)
    and its JSON text; no text (never cached) when it is not plain JSON."""
    try:
        items = [_plain_tool(item) if isinstance(item, BaseModel) else item for item in raw]
        return items, json.dumps(items, allow_nan=False, separators=(",", ":"))
    except Exception:  # the check names what is wrong
        return [], None


def _plain_tool(item: BaseModel) -> Any:
    """``item.model_dump(exclude_none=True)``, read straight off our own tool models (what a
    ``Toolbox`` returns): pydantic's dump of a schema costs ~20 us a tool, every rollout."""
    function = getattr(item, "function", None)
    if (
        type(item) is not OpenAIFunctionToolSchema
        or type(function) is not OpenAIFunctionSchema
        or item.model_extra
        or function.model_extra
    ):
        return item.model_dump(exclude_none=True)
    plain: dict[str, Any] = {"name": function.name}
    if function.description is not None:
        plain["description"] = function.description
    plain["parameters"] = function.parameters
    if function.strict is not None:
        plain["strict"] = function.strict
    return {"type": item.type, "function": plain}


_NO_TOOLS = ToolSet((), b"[]")
