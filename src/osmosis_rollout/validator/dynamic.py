"""Dynamic checks on a loaded agent: its ``name``, ``run`` and the tools ``get_tools`` returns.

Unlike ``agent.resolve_tools`` (which the server uses and which stops at the first bad tool),
these report every problem of every tool, and also check each ``parameters`` against the JSON
Schema metaschema, which TrainGate and the model rely on.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence
from typing import Any

import anyio
from pydantic import BaseModel, ValidationError

from ..agent import TOOL_NAME_PATTERN, RolloutAgentLoop
from ..loader import error_location
from ..protocol import OpenAIFunctionToolSchema, RolloutRequest, describe_validation_error
from .result import Problem, Severity

__all__ = ["check_instance", "check_tool_list", "check_tools", "sample_request"]


def _problem(
    code: str, location: str | None, message: str, severity: Severity = "error"
) -> Problem:
    return Problem(
        code=code, severity=severity, check="dynamic", location=location, message=message
    )


def sample_request() -> RolloutRequest:
    """The request ``get_tools`` is called with: what a typical TrainGate init carries."""
    return RolloutRequest(
        rollout_id="osmosis-validate",
        server_url="http://traingate.invalid",
        messages=[{"role": "user", "content": "What is 3 + 4?"}],
        completion_params={"temperature": 1.0, "max_tokens": 512},
    )


def check_instance(agent: RolloutAgentLoop, location: str | None) -> list[Problem]:
    """``name`` is a non-blank string and ``run`` is a coroutine function."""
    problems: list[Problem] = []
    name = getattr(agent, "name", None)
    if not isinstance(name, str) or not name.strip():
        problems.append(
            _problem(
                "NAME_INVALID",
                location,
                f"agent.name is {name!r}; it must be a non-empty string such as "
                f'"{type(agent).__name__.lower()}"',
            )
        )
    if not inspect.iscoroutinefunction(getattr(agent, "run", None)):
        problems.append(
            _problem(
                "RUN_NOT_ASYNC",
                location,
                "agent.run is not a coroutine function: write `async def run(self, ctx)`",
            )
        )
    return problems


async def check_tools(
    agent: RolloutAgentLoop, request: RolloutRequest, *, timeout_s: float
) -> tuple[list[Problem], int | None]:
    """Call ``get_tools`` (sync or async) and check what it returns; (problems, tool count)."""
    raw: Any = None
    try:
        # move_on_after, not fail_after: a TimeoutError that get_tools itself raises (a slow
        # tool registry, say) is a failure to report as such, not our deadline.
        with anyio.move_on_after(timeout_s) as deadline:
            raw = agent.get_tools(request)
            if inspect.isawaitable(raw):
                raw = await raw
    except Exception as exc:
        return [
            _problem(
                "GET_TOOLS_FAILED",
                error_location(exc.__traceback__) or "get_tools()",
                f"get_tools() raised {type(exc).__name__}: {exc}; the server answers 500 to "
                "every init while this happens",
            )
        ], None
    if deadline.cancelled_caught:
        return [
            _problem(
                "GET_TOOLS_TIMEOUT",
                "get_tools()",
                f"get_tools() did not return within {timeout_s:g} s; TrainGate waits for it "
                "before every rollout, so keep it fast (load tool definitions once, in __init__)",
            )
        ], None
    if raw is None:
        return [
            _problem(
                "GET_TOOLS_RETURNED_NONE",
                "get_tools()",
                "get_tools() returned None; return [] when the agent has no tools",
                "warning",
            )
        ], 0
    if not isinstance(raw, list | tuple):
        return [
            _problem(
                "GET_TOOLS_NOT_LIST",
                "get_tools()",
                f"get_tools() returned {type(raw).__name__}; it must return a list of tools",
            )
        ], None
    return check_tool_list(raw), len(raw)


def check_tool_list(raw: Sequence[Any]) -> list[Problem]:
    """Every problem of every tool in ``raw``, located as ``tools[i].function...``."""
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(raw):
        where = f"tools[{i}]"
        data = item.model_dump(exclude_none=True) if isinstance(item, BaseModel) else item
        if not isinstance(data, dict):
            problems.append(
                _problem(
                    "TOOL_INVALID",
                    where,
                    f"{where} is a {type(item).__name__}; a tool is a dict like "
                    '{"type": "function", "function": {"name": ..., "parameters": {...}}} or an '
                    "OpenAIFunctionToolSchema",
                )
            )
            continue
        try:
            json.dumps(data, allow_nan=False)
        except (TypeError, ValueError) as exc:
            problems.append(
                _problem(
                    "TOOL_NOT_SERIALIZABLE",
                    where,
                    f"{where} is not JSON-serialisable ({exc}); use only dicts, lists, strings, "
                    "finite numbers, booleans and None",
                )
            )
            continue
        try:
            tool = OpenAIFunctionToolSchema.model_validate(data)
        except ValidationError as exc:
            loc = ".".join(str(p) for p in exc.errors()[0]["loc"])
            problems.append(
                _problem(
                    "TOOL_INVALID",
                    f"{where}.{loc}" if loc else where,
                    f"{where} is not a valid OpenAI function tool: "
                    f"{describe_validation_error(exc, limit=2)}",
                )
            )
            continue
        problems.extend(_check_function(tool, where, data, seen, i))
    return problems


def _check_function(
    tool: OpenAIFunctionToolSchema, where: str, data: dict[str, Any], seen: dict[str, int], i: int
) -> list[Problem]:
    problems: list[Problem] = []
    name = tool.function.name
    if not TOOL_NAME_PATTERN.match(name):
        problems.append(
            _problem(
                "TOOL_NAME_INVALID",
                f"{where}.function.name",
                f"tool name {name!r} must be 1-64 letters, digits, '_' or '-' "
                "(OpenAI's rule, ^[a-zA-Z0-9_-]{1,64}$)",
            )
        )
    if name in seen:
        problems.append(
            _problem(
                "TOOL_NAME_DUPLICATE",
                f"{where}.function.name",
                f"tool name {name!r} is already used by tools[{seen[name]}]; tool calls are "
                "routed by name, so names must be unique",
            )
        )
    else:
        seen[name] = i
    description = tool.function.description
    if not (description and description.strip()):
        problems.append(
            _problem(
                "TOOL_DESCRIPTION_MISSING",
                f"{where}.function.description",
                f"tool {name!r} has no description; the model chooses tools by their "
                "descriptions, so say what it does and when to use it",
                "warning",
            )
        )
    function = data.get("function")
    if not isinstance(function, dict) or "parameters" not in function:
        return problems  # the default, an empty object schema
    params = tool.function.parameters
    problems.extend(_schema_problems(params, name, f"{where}.function.parameters"))
    if params.get("type") != "object":
        problems.append(
            _problem(
                "TOOL_PARAMETERS_NOT_OBJECT",
                f"{where}.function.parameters",
                f'parameters of {name!r} must be a JSON Schema with "type": "object" (got '
                f'type {params.get("type")!r}); put each argument under "properties"',
            )
        )
    return problems


#: At most this many schema problems are listed per tool; the rest are counted.
MAX_SCHEMA_PROBLEMS = 10


def _schema_problems(params: dict[str, Any], name: str, where: str) -> list[Problem]:
    """Every way ``params`` breaks the JSON Schema metaschema, in document order.

    ``check_schema`` stops at its best guess; a user fixing a tool wants the whole list at once.
    """
    from jsonschema import Draft202012Validator

    meta = Draft202012Validator(Draft202012Validator.META_SCHEMA)
    errors = sorted(meta.iter_errors(params), key=lambda e: [str(p) for p in e.absolute_path])
    problems: list[Problem] = []
    for error in errors[:MAX_SCHEMA_PROBLEMS]:
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
        problems.append(
            _problem(
                "TOOL_SCHEMA_INVALID",
                f"{where}{path}",
                f"parameters of {name!r} is not a valid JSON Schema: {error.message}",
            )
        )
    if len(errors) > MAX_SCHEMA_PROBLEMS:
        problems.append(
            _problem(
                "TOOL_SCHEMA_INVALID",
                where,
                f"parameters of {name!r} has {len(errors) - MAX_SCHEMA_PROBLEMS} more schema "
                "problems; fix the ones above and validate again",
            )
        )
    return problems
