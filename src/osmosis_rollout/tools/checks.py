"""What makes a tool list usable: the one checker behind the server, ``osmosis validate`` and
The legacy ``validate_agent_loop``.

:func:`tool_problems` reports every problem of every tool, in order. The server refuses a list
with an error among the ``enforced`` ones (the first one raised, :func:`check_tools`); the rest
(a missing description, a ``parameters`` schema the JSON Schema metaschema rejects) are what
``validate`` reports so that the model and TrainGate get good tools, not reasons to refuse a
rollout.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from ..errors import AgentDefinitionError
from ..protocol import OpenAIFunctionToolSchema, describe_validation_error

__all__ = [
    "MAX_SCHEMA_PROBLEMS",
    "TOOL_NAME_PATTERN",
    "CheckedTools",
    "ToolProblem",
    "check_tools",
    "describe_schema_error",
    "tool_problems",
]

TOOL_NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
#: At most this many schema problems are listed per tool; the rest are counted.
MAX_SCHEMA_PROBLEMS = 10


@dataclass(frozen=True, slots=True)
class ToolProblem:
    """One problem of the tool ``tools[index]``. ``message`` is for a person fixing the agent;
    ``reason`` is the short form the server raises (``AgentDefinitionError``), set for enforced
    problems. ``causes`` are a ``TOOL_INVALID``'s schema errors as (field path, error type),
    e.g. ``("function.name", "missing")``: what the legacy validator's codes are read from."""

    index: int
    code: str
    location: str
    message: str
    severity: Literal["error", "warning"] = "error"
    reason: str | None = None
    causes: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class CheckedTools:
    """The tools that passed (as models) and every problem found."""

    tools: list[OpenAIFunctionToolSchema]
    problems: list[ToolProblem]


def check_tools(raw: Sequence[Any]) -> list[OpenAIFunctionToolSchema]:
    """The tools as models, or ``AgentDefinitionError`` for the first enforced problem, e.g.
    ``tools[2].function.name 'add' is duplicated``."""
    checked = tool_problems(raw, advice=False)
    for problem in checked.problems:
        if problem.reason is not None:
            raise AgentDefinitionError(problem.reason)
    return checked.tools


def tool_problems(raw: Sequence[Any], *, advice: bool = True) -> CheckedTools:
    """Every problem of every tool in ``raw``, located as ``tools[i].function...``.

    ``advice=False`` skips what the server does not enforce (descriptions, the metaschema,
    an object ``parameters``): the server's fast path.
    """
    tools: list[OpenAIFunctionToolSchema] = []
    problems: list[ToolProblem] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(raw):
        data = item.model_dump(exclude_none=True) if isinstance(item, BaseModel) else item
        tool, found = _check_entry(i, item, data)
        problems.extend(found)
        if tool is None:
            continue
        problems.extend(_check_name(tool, i, seen))
        if advice:
            problems.extend(_advice(tool, i, data))
        tools.append(tool)
    return CheckedTools(tools, problems)


def _not_a_tool(where: str, detail: str) -> str:
    return f"{where} is not a valid OpenAI function tool: {detail}"


def _check_entry(
    i: int, item: Any, data: Any
) -> tuple[OpenAIFunctionToolSchema | None, list[ToolProblem]]:
    """The entry as a model, or why it is not a JSON-clean OpenAI function tool."""
    where = f"tools[{i}]"
    try:
        tool: OpenAIFunctionToolSchema | None = OpenAIFunctionToolSchema.model_validate(data)
        invalid: ValidationError | None = None
    except ValidationError as exc:
        tool, invalid = None, exc
    if not isinstance(data, dict):
        detail = describe_validation_error(invalid, limit=1) if invalid else "not a dict"
        message = (
            f"{where} is a {type(item).__name__}; a tool is a dict like "
            '{"type": "function", "function": {"name": ..., "parameters": {...}}} or an '
            "OpenAIFunctionToolSchema"
        )
        return None, [
            ToolProblem(i, "TOOL_INVALID", where, message, reason=_not_a_tool(where, detail))
        ]
    unencodable = _json_error(data)
    if unencodable is not None:
        message = (
            f"{where} is not JSON-serialisable ({unencodable}); use only dicts, lists, strings, "
            "finite numbers, booleans and None"
        )
        # The server judges the model as it will send it (nulls dropped), after validation.
        dumped = None if tool is None else _json_error(tool.model_dump(exclude_none=True))
        causes: tuple[tuple[str, str], ...] = ()
        if invalid is not None:
            reason: str | None = _not_a_tool(where, describe_validation_error(invalid, limit=1))
            causes = _causes(invalid)
        else:
            reason = None if dumped is None else _not_a_tool(where, str(dumped))
        problem = ToolProblem(
            i, "TOOL_NOT_SERIALIZABLE", where, message, reason=reason, causes=causes
        )
        kept = tool.model_copy(deep=True) if tool is not None and reason is None else None
        return kept, [problem]
    if invalid is not None or tool is None:
        assert invalid is not None  # no model without a validation error
        causes = _causes(invalid)
        loc = causes[0][0]
        message = _not_a_tool(where, describe_validation_error(invalid, limit=2))
        reason = _not_a_tool(where, describe_validation_error(invalid, limit=1))
        at = f"{where}.{loc}" if loc else where
        return None, [ToolProblem(i, "TOOL_INVALID", at, message, reason=reason, causes=causes)]
    # Validation keeps nested values by reference: a deep copy, so that the model cannot change
    # when the agent edits the dicts it returned (the checked models are cached by their JSON).
    return tool.model_copy(deep=True), []


def _causes(invalid: ValidationError) -> tuple[tuple[str, str], ...]:
    errors = invalid.errors(include_input=False, include_url=False, include_context=False)
    return tuple((".".join(str(p) for p in e["loc"]), e["type"]) for e in errors)


def _json_error(data: Any) -> Exception | None:
    try:
        json.dumps(data, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return exc
    return None


def _check_name(tool: OpenAIFunctionToolSchema, i: int, seen: dict[str, int]) -> list[ToolProblem]:
    problems: list[ToolProblem] = []
    where = f"tools[{i}]"
    name = tool.function.name
    at = f"{where}.function.name"
    if not TOOL_NAME_PATTERN.match(name):
        message = (
            f"tool name {name!r} must be 1-64 letters, digits, '_' or '-' "
            "(OpenAI's rule, ^[a-zA-Z0-9_-]{1,64}$)"
        )
        reason = f"{at} {name!r} must match ^[a-zA-Z0-9_-]{{1,64}}$"
        problems.append(ToolProblem(i, "TOOL_NAME_INVALID", at, message, reason=reason))
    if name in seen:
        message = (
            f"tool name {name!r} is already used by tools[{seen[name]}]; tool calls are "
            "routed by name, so names must be unique"
        )
        reason = f"{at} {name!r} is duplicated"
        problems.append(ToolProblem(i, "TOOL_NAME_DUPLICATE", at, message, reason=reason))
    else:
        seen[name] = i
    return problems


def _advice(tool: OpenAIFunctionToolSchema, i: int, data: dict[str, Any]) -> list[ToolProblem]:
    """What ``validate`` reports beyond what the server enforces."""
    problems: list[ToolProblem] = []
    where = f"tools[{i}]"
    name = tool.function.name
    description = tool.function.description
    if not (description and description.strip()):
        message = (
            f"tool {name!r} has no description; the model chooses tools by their "
            "descriptions, so say what it does and when to use it"
        )
        at = f"{where}.function.description"
        problems.append(ToolProblem(i, "TOOL_DESCRIPTION_MISSING", at, message, "warning"))
    function = data.get("function")
    if not isinstance(function, dict) or "parameters" not in function:
        return problems  # the default, an empty object schema
    params = tool.function.parameters
    at = f"{where}.function.parameters"
    problems.extend(_schema_problems(params, name, i, at))
    if params.get("type") != "object":
        message = (
            f'parameters of {name!r} must be a JSON Schema with "type": "object" (got '
            f'type {params.get("type")!r}); put each argument under "properties"'
        )
        problems.append(ToolProblem(i, "TOOL_PARAMETERS_NOT_OBJECT", at, message))
    return problems


def _schema_problems(params: dict[str, Any], name: str, i: int, where: str) -> list[ToolProblem]:
    """Every way ``params`` breaks the JSON Schema metaschema, in document order.

    ``check_schema`` stops at its best guess; a user fixing a tool wants the whole list at once.
    """
    from jsonschema import Draft202012Validator

    meta = Draft202012Validator(Draft202012Validator.META_SCHEMA)
    errors = sorted(meta.iter_errors(params), key=lambda e: [str(p) for p in e.absolute_path])
    problems: list[ToolProblem] = []
    for error in errors[:MAX_SCHEMA_PROBLEMS]:
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
        message = (
            f"parameters of {name!r} is not a valid JSON Schema: {describe_schema_error(error)}"
        )
        problems.append(ToolProblem(i, "TOOL_SCHEMA_INVALID", f"{where}{path}", message))
    if len(errors) > MAX_SCHEMA_PROBLEMS:
        message = (
            f"parameters of {name!r} has {len(errors) - MAX_SCHEMA_PROBLEMS} more schema "
            "problems; fix the ones above and validate again"
        )
        problems.append(ToolProblem(i, "TOOL_SCHEMA_INVALID", where, message))
    if not errors:
        from .bounded_schema import unsupported

        reason = unsupported(params)
        if reason is not None:
            message = f"parameters of {name!r} cannot be checked safely: {reason}"
            problems.append(ToolProblem(i, "TOOL_SCHEMA_INVALID", where, message))
    return problems


#: The JSON Schema type names, as the metaschema lists them.
_TYPES = ("array", "boolean", "integer", "null", "number", "object", "string")


def describe_schema_error(error: Any) -> str:
    """The metaschema's message, except for a bad ``type``: there jsonschema says only that the
    value "is not valid under any of the given schemas", so name the valid types and the nearest
    one to a misspelling instead."""
    path = list(error.absolute_path)
    if error.validator != "anyOf" or not path or path[-1] != "type":
        return str(error.message)
    values = error.instance if isinstance(error.instance, list) else [error.instance]
    bad = [value for value in values if value not in _TYPES]
    if not bad:  # a list of valid names, repeated: the metaschema's own words are clear
        return str(error.message)
    parts = []
    for value in bad:
        near = difflib.get_close_matches(value, _TYPES, n=1) if isinstance(value, str) else []
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        parts.append(f"{value!r} is not a JSON Schema type{hint}")
    return f"{'; '.join(parts)}; the types are {', '.join(_TYPES)}"
