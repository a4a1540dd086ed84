"""Agents whose ``get_tools`` writes a tool's schema by hand while a ``Toolbox`` runs it.

``Mismatched`` declares ``add(x, y)`` for a function ``add(a, b)``: the model sends ``x`` and
``y``, the toolbox refuses every call, and nothing is wrong with the model. ``BuiltInRun`` does
the same with a toolbox it builds in ``run`` (which only running it shows). ``Optional`` has a
declared optional ``note`` its function does not take (some calls fail), ``Agreeing`` a
hand-written schema that names the function's parameters (no problem at all).
"""

from __future__ import annotations

from typing import Any

from osmosis_rollout import RolloutAgentLoop, RolloutContext, RolloutRequest, RolloutResult
from osmosis_rollout.tools import Toolbox


def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


def declared(properties: dict[str, Any], required: list[str]) -> list[dict[str, Any]]:
    parameters = {"type": "object", "properties": properties, "required": required}
    return [
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": "Add two numbers.",
                "parameters": parameters,
            },
        }
    ]


NUMBER = {"type": "number"}


class _Calls(RolloutAgentLoop):
    name = "schema_mismatch"
    toolbox = Toolbox([add])

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = list(ctx.request.messages)
        for _ in range(4):
            result = await ctx.chat(messages)
            messages.append(result.message)
            if not result.has_tool_calls:
                break
            messages.extend(await self.toolbox.execute(ctx, result.tool_calls))
        return ctx.complete(messages, reward=1.0)


class Mismatched(_Calls):
    def get_tools(self, request: RolloutRequest) -> list[dict[str, Any]]:
        return declared({"x": NUMBER, "y": NUMBER}, ["x", "y"])


class Optional(_Calls):
    def get_tools(self, request: RolloutRequest) -> list[dict[str, Any]]:
        return declared({"a": NUMBER, "b": NUMBER, "note": {"type": "string"}}, ["a", "b"])


class Agreeing(_Calls):
    def get_tools(self, request: RolloutRequest) -> list[dict[str, Any]]:
        properties = {
            "a": {"type": "number", "description": "The first addend."},
            "b": {"type": "number", "description": "The second addend."},
        }
        return declared(properties, ["a", "b"])


class BuiltInRun(RolloutAgentLoop):
    name = "schema_mismatch_in_run"

    def get_tools(self, request: RolloutRequest) -> list[dict[str, Any]]:
        return declared({"x": NUMBER, "y": NUMBER}, ["x", "y"])

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        toolbox = Toolbox([add])
        messages = list(ctx.request.messages)
        result = await ctx.chat(messages)
        messages.append(result.message)
        messages.extend(await toolbox.execute(ctx, result.tool_calls))
        return ctx.complete(messages, reward=1.0)
