"""``validate_agent_loop(agent, *, request=None)``: the seed's sync validator, with the codes
of the original SDK's validator beside ours.

It runs ``validate_agent_loop_async`` (static and dynamic checks; no dry run, since the original
SDK's validator never ran the agent) and reads the SDK's findings off the same checks (the
tools' off ``tools.checks``, the one tool checker), and returns one ``ValidationResult``. Where
both found the same thing, the problem carries the SDK's code with ours in
``details["osmosis_code"]``; what only our richer checks find keeps our code. ``valid``,
``errors``, ``warnings``, ``agent_name``, ``tool_count``, ``bool(result)`` and
``raise_if_invalid()`` behave as the SDK's did. ``osmosis_rollout.validate_agent_loop`` and
``osmosis_rollout.compat.validate_agent_loop`` are this function.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
from collections.abc import Coroutine
from typing import Any, TypeVar

from pydantic import BaseModel

from ..protocol import OpenAIFunctionToolSchema, RolloutRequest
from ..tools.checks import ToolProblem, tool_problems
from .pipeline import validate_agent_loop_async
from .result import Problem, Severity, ValidationResult

__all__ = ["LEGACY_CODES", "validate_agent_loop", "validation_request"]

T = TypeVar("T")

#: Our codes and the original SDK's codes that report the same finding.
_SAME_FINDING: dict[str, frozenset[str]] = {
    "NAME_INVALID": frozenset({"MISSING_NAME", "INVALID_NAME_TYPE", "EMPTY_NAME"}),
    "NAME_MISSING": frozenset({"MISSING_NAME", "INVALID_NAME_TYPE", "EMPTY_NAME"}),
    "RUN_MISSING": frozenset({"MISSING_RUN_METHOD", "RUN_NOT_CALLABLE", "RUN_NOT_ASYNC"}),
    "RUN_NOT_ASYNC": frozenset({"MISSING_RUN_METHOD", "RUN_NOT_CALLABLE", "RUN_NOT_ASYNC"}),
    "GET_TOOLS_FAILED": frozenset({"GET_TOOLS_EXCEPTION"}),
    "GET_TOOLS_RETURNED_NONE": frozenset({"GET_TOOLS_RETURNS_NONE"}),
    "GET_TOOLS_NOT_LIST": frozenset({"GET_TOOLS_INVALID_TYPE"}),
    "TOOL_DESCRIPTION_MISSING": frozenset({"MISSING_FUNCTION_DESCRIPTION"}),
    "TOOL_PARAMETERS_NOT_OBJECT": frozenset({"PARAMETERS_TYPE_NOT_OBJECT"}),
    "TOOL_NAME_INVALID": frozenset({"INVALID_FUNCTION_NAME"}),
    "TOOL_INVALID": frozenset(
        {
            "MISSING_TOOL_TYPE",
            "UNKNOWN_TOOL_TYPE",
            "MISSING_FUNCTION",
            "INVALID_FUNCTION_TYPE",
            "MISSING_FUNCTION_NAME",
            "INVALID_FUNCTION_NAME",
            "INVALID_PARAMETERS_TYPE",
            "INVALID_TOOL_TYPE",
        }
    ),
}

#: Every code the original SDK's validator reports (documented in docs/validate.md).
LEGACY_CODES = frozenset().union(*_SAME_FINDING.values())

_SEVERITY_RANK = {"warning": 0, "error": 1}


def validation_request() -> RolloutRequest:
    """The request the original SDK's validator called ``get_tools`` with when none is given."""
    return RolloutRequest(
        rollout_id="validation-test-rollout",
        server_url="http://localhost:8080",
        messages=[{"role": "user", "content": "Hello"}],
        completion_params={"temperature": 1.0, "max_tokens": 512},
        metadata={"_validation": True},
    )


def validate_agent_loop(
    agent_loop: Any, *, request: RolloutRequest | None = None
) -> ValidationResult:
    """Check an agent loop (an instance; a class or ``"file.py:Class"`` also work) from sync
    code. Never runs the agent; ``request`` is what ``get_tools`` is called with.

    Call it from a thread without a running event loop, or from inside one (it then runs in a
    worker thread). The async validator with the dry run is ``validate_agent_loop_async``.
    """
    request = request or validation_request()
    return _run_sync(_validate(agent_loop, request))


async def _validate(agent_loop: Any, request: RolloutRequest) -> ValidationResult:
    ours = await validate_agent_loop_async(agent_loop, dry_run=False, request=request)
    if isinstance(agent_loop, str | type):
        return ours
    legacy, tool_count = await _legacy_problems(agent_loop, request)
    merged = _merge(legacy, ours.problems)
    return ours.model_copy(
        update={
            "problems": merged,
            "tools": ours.tools if ours.tools is not None else tool_count,
        }
    )


def _run_sync(coro: Coroutine[Any, Any, T]) -> T:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    # Called from async code (a pytest-asyncio test, a notebook): run in a thread with its own loop.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


# -- the original SDK's structural checks ----------------------------------------------------------


def _legacy(
    code: str,
    message: str,
    field: str | None,
    severity: Severity = "error",
    details: dict[str, Any] | None = None,
) -> Problem:
    return Problem(
        code=code,
        severity=severity,
        check="dynamic",
        location=field,
        message=message,
        details=details,
    )


async def _legacy_problems(agent: Any, request: RolloutRequest) -> tuple[list[Problem], int]:
    problems = _legacy_name(agent)
    tool_count = 0
    try:
        raw = agent.get_tools(request)
        if inspect.isawaitable(raw):
            raw = await raw
    except Exception as exc:
        problems.append(
            _legacy(
                "GET_TOOLS_EXCEPTION",
                f"get_tools() raised an exception: {type(exc).__name__}: {exc}",
                "get_tools",
                details={"exception_type": type(exc).__name__, "exception_message": str(exc)},
            )
        )
    else:
        if raw is None:
            problems.append(
                _legacy(
                    "GET_TOOLS_RETURNS_NONE",
                    "get_tools() must return a list, got None",
                    "get_tools",
                )
            )
        elif not isinstance(raw, list):
            problems.append(
                _legacy(
                    "GET_TOOLS_INVALID_TYPE",
                    f"get_tools() must return a list, got {type(raw).__name__}",
                    "get_tools",
                )
            )
        else:
            tool_count = len(raw)
            problems.extend(_legacy_tools(raw))
    problems.extend(_legacy_run(agent))
    return problems, tool_count


def _legacy_name(agent: Any) -> list[Problem]:
    name = getattr(agent, "name", None)
    if name is None:
        return [_legacy("MISSING_NAME", "Agent loop must have a 'name' attribute", "name")]
    if not isinstance(name, str):
        return [
            _legacy(
                "INVALID_NAME_TYPE", f"'name' must be a string, got {type(name).__name__}", "name"
            )
        ]
    if not name.strip():
        return [_legacy("EMPTY_NAME", "'name' cannot be empty or whitespace only", "name")]
    return []


def _legacy_tools(raw: list[Any]) -> list[Problem]:
    """The SDK's findings on each tool in its order (type, function, name, description,
    parameters): where ours judges the same thing, read off the one tool checker's problems
    (``tools.checks``), so the two cannot disagree."""
    by_index: dict[int, list[ToolProblem]] = {}
    for found in tool_problems(raw).problems:
        by_index.setdefault(found.index, []).append(found)
    problems: list[Problem] = []
    for index, tool in enumerate(raw):
        if isinstance(tool, OpenAIFunctionToolSchema):
            continue  # the SDK took its own model as valid
        where = f"tools[{index}]"
        if not isinstance(tool, dict):
            kind = type(tool).__name__
            if isinstance(tool, BaseModel):
                kind = f"{kind} (a pydantic model other than OpenAIFunctionToolSchema)"
            message = f"Tool must be OpenAIFunctionToolSchema or dict, got {kind}"
            problems.append(_legacy("INVALID_TOOL_TYPE", message, where))
            continue
        problems.extend(_legacy_tool(tool, where, by_index.get(index, [])))
    return problems


def _legacy_tool(tool: dict[str, Any], where: str, ours: list[ToolProblem]) -> list[Problem]:
    causes = {loc: kind for found in ours for loc, kind in found.causes}
    codes = {found.code for found in ours}
    function = tool.get("function")
    problems: list[Problem] = []
    if "type" not in tool:  # ours defaults it to "function"; the SDK wanted it written
        problems.append(_legacy("MISSING_TOOL_TYPE", "Tool must have a 'type' field", where))
    elif "type" in causes:
        message = f"Unknown tool type {tool['type']!r}; expected 'function'"
        problems.append(_legacy("UNKNOWN_TOOL_TYPE", message, f"{where}.type", "warning"))
    if causes.get("function") == "missing":
        problems.append(_legacy("MISSING_FUNCTION", "Tool must have a 'function' field", where))
        return problems
    if "function" in causes or not isinstance(function, dict):  # a model there was not the SDK's
        message = f"'function' must be a dict, got {type(function).__name__}"
        problems.append(_legacy("INVALID_FUNCTION_TYPE", message, f"{where}.function"))
        return problems
    at = f"{where}.function"
    name_cause = causes.get("function.name")
    blank = isinstance(function.get("name"), str) and not function["name"].strip()
    if name_cause == "missing":
        message = "Function must have a 'name'"
        problems.append(_legacy("MISSING_FUNCTION_NAME", message, f"{at}.name"))
    elif name_cause is not None or (blank and "TOOL_NAME_INVALID" in codes):
        message = "Function name must be a non-empty string"
        problems.append(_legacy("INVALID_FUNCTION_NAME", message, f"{at}.name"))
    # The SDK's own rules, which ours has no twin of: a missing description key, the parameters'
    # type read even when the tool is invalid for another reason.
    if "description" not in function:
        message = "Function should have a 'description' for better LLM understanding"
        problems.append(
            _legacy("MISSING_FUNCTION_DESCRIPTION", message, f"{at}.description", "warning")
        )
    if "parameters" in function:
        parameters = function["parameters"]
        if not isinstance(parameters, dict):
            message = f"'parameters' must be a dict, got {type(parameters).__name__}"
            problems.append(_legacy("INVALID_PARAMETERS_TYPE", message, f"{at}.parameters"))
        elif parameters.get("type") != "object":
            message = "'parameters.type' should be 'object'"
            problems.append(
                _legacy("PARAMETERS_TYPE_NOT_OBJECT", message, f"{at}.parameters.type", "warning")
            )
    return problems


def _legacy_run(agent: Any) -> list[Problem]:
    if not hasattr(agent, "run"):
        return [_legacy("MISSING_RUN_METHOD", "Agent loop must have a 'run' method", "run")]
    run = agent.run
    if not callable(run):
        return [_legacy("RUN_NOT_CALLABLE", "'run' must be a callable method", "run")]
    if not inspect.iscoroutinefunction(run):
        return [
            _legacy("RUN_NOT_ASYNC", "'run' method must be an async function (async def)", "run")
        ]
    return []


# -- merging -----------------------------------------------------------------------------------


def _group(problem: Problem) -> str:
    """``tools[i]`` for a problem of one tool, else ``agent``."""
    location = problem.location or ""
    if location.startswith("tools["):
        return location.split("]", 1)[0] + "]"
    return "agent"


def _merge(legacy: list[Problem], ours: list[Problem]) -> list[Problem]:
    """The SDK's problems first; ours folded into the SDK's problem that reports the same finding
    (unless ours is the more severe), the rest after them."""
    merged = list(legacy)
    rest: list[Problem] = []
    for problem in ours:
        codes = _SAME_FINDING.get(problem.code, frozenset())
        for i, seen in enumerate(merged):
            same = seen.code in codes and _group(seen) == _group(problem)
            if same and _SEVERITY_RANK[seen.severity] >= _SEVERITY_RANK[problem.severity]:
                details = {**(seen.details or {}), "osmosis_code": problem.code}
                merged[i] = seen.model_copy(update={"details": details})
                break
        else:
            rest.append(problem)
    return merged + rest
