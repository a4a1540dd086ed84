"""What a protocol v2 chat call carries of the agent's tools (``docs/protocol-v2.md``).

v2 declares no tools at init: they travel with every chat call, and so does the agent's
``tool_choice`` when it gives one. ``RolloutContext.chat`` adds them when its backend
``sends_tools`` (``chat_v2.V2ChatChannel``). The JSON form of a tool list is made once per shared
(checked, cached) list, not once per call: a v2 rollout must not cost much more than a v1 one
(docs/benchmarks.md, section 19).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .protocol import OpenAIFunctionToolSchema

__all__ = ["add_tools"]

#: JSON tool lists by the shared list they come from; each entry holds its list, so its id
#: cannot be reused while it is here.
_DUMPED: dict[int, tuple[Sequence[OpenAIFunctionToolSchema], list[dict[str, Any]]]] = {}
_MAX_LISTS = 256


def add_tools(
    body: dict[str, Any],
    params: dict[str, Any],
    shared: Sequence[OpenAIFunctionToolSchema],
    own: Sequence[OpenAIFunctionToolSchema] | None,
) -> None:
    """Put the tools (``own``, the context's copies once the agent touched them, else
    ``shared``) and the agent's ``tool_choice`` into a chat body; no ``tools`` key for none."""
    tools = _dump(own) if own is not None else _dumped(shared)
    if tools:
        body["tools"] = tools
    if params.get("tool_choice") is not None:
        body["tool_choice"] = params["tool_choice"]


def _dump(tools: Sequence[OpenAIFunctionToolSchema]) -> list[dict[str, Any]]:
    return [tool.model_dump(mode="json", exclude_none=True) for tool in tools]


def _dumped(shared: Sequence[OpenAIFunctionToolSchema]) -> list[dict[str, Any]]:
    found = _DUMPED.get(id(shared))
    if found is None or found[0] is not shared:
        if len(_DUMPED) >= _MAX_LISTS:
            _DUMPED.clear()
        found = _DUMPED[id(shared)] = (shared, _dump(shared))
    return found[1]
