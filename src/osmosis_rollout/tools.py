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
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import json
import logging
import re
import time
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, overload

import anyio
import anyio.to_thread
import jsonschema
from jsonschema.exceptions import SchemaError
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import to_json, to_jsonable_python

from .agent import TOOL_NAME_PATTERN, RolloutContext
from .errors import ToolError
from .protocol import (
    Message,
    OpenAIFunctionSchema,
    OpenAIFunctionToolSchema,
    describe_validation_error,
)

__all__ = [
    "Toolbox",
    "execute_tool_calls",
    "parse_arguments",
    "tool",
    "tool_schema",
    "validate_arguments",
]

logger = logging.getLogger("osmosis_rollout.tools")

F = TypeVar("F", bound=Callable[..., Any])

#: The attribute ``@tool`` sets on a function: its ``OpenAIFunctionToolSchema``.
SCHEMA_ATTRIBUTE = "__tool_schema__"
_CONTEXT_PARAM = "ctx"
_PRIMITIVES: dict[type, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
_ARGS_HEADERS = frozenset({"Args:", "Arguments:", "Parameters:", "Params:"})
_SECTION_HEADER = re.compile(
    r"^(Args|Arguments|Parameters|Params|Returns?|Raises|Yields?|Examples?|Notes?|Attributes"
    r"|See Also|Warnings?|Todo):$"
)
_MAX_MESSAGE = 1000


# --------------------------------------------------------------------------------------------
# Schemas from functions
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Param:
    name: str
    positional_only: bool
    default: Any
    adapter: TypeAdapter[Any] | None  # converts JSON values (enums, models...) for the call


@dataclass(frozen=True)
class _ToolSpec:
    """What a Toolbox needs to call one function: its schema and how to pass arguments."""

    fn: Callable[..., Any]
    schema: OpenAIFunctionToolSchema
    params: dict[str, _Param]
    context_params: tuple[str, ...]
    var_keyword: bool
    unbound_self: bool
    is_async: bool

    @property
    def name(self) -> str:
        return self.schema.name


class _SchemaBuilder:
    """Maps one parameter's annotation to JSON Schema, collecting pydantic ``$defs``."""

    def __init__(self, tool_name: str, defs: dict[str, Any]) -> None:
        self.tool_name = tool_name
        self.defs = defs
        self.param = ""
        self.needs_conversion = False

    def unsupported(self, tp: Any, why: str = "") -> ToolError:
        return ToolError(
            f"parameter {self.param!r} of tool {self.tool_name!r} has an unsupported type "
            f"{_type_name(tp)}{why}; use str, int, float, bool, list[X], dict[str, X], "
            "Literal[...], X | None, an Enum, a pydantic model or a TypedDict",
            tool_name=self.tool_name,
        )

    def schema(self, tp: Any) -> dict[str, Any]:
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if tp is Any:
            return {}
        if tp is None or tp is type(None):
            return {"type": "null"}
        if origin is typing.Annotated:
            schema = self.schema(args[0])
            description = next((m for m in args[1:] if isinstance(m, str)), None)
            if description is None:
                infos = (m for m in args[1:] if isinstance(m, FieldInfo) and m.description)
                description = next((m.description for m in infos), None)
            return {**schema, "description": description} if description else schema
        if origin is Literal:
            return self._enum(list(args), tp)
        if origin is typing.Union or origin is types.UnionType:
            return {"anyOf": [self.schema(arg) for arg in args]}
        if tp in (list, Sequence, tuple, set, frozenset) or origin in (list, Sequence):
            self.needs_conversion |= tp in (tuple, set, frozenset)
            return {"type": "array", "items": self.schema(args[0])} if args else {"type": "array"}
        if origin is tuple:
            self.needs_conversion = True
            if len(args) == 2 and args[1] is Ellipsis:
                return {"type": "array", "items": self.schema(args[0])}
            items = [self.schema(arg) for arg in args]
            n = len(items)
            return {"type": "array", "prefixItems": items, "minItems": n, "maxItems": n}
        if origin in (set, frozenset):
            self.needs_conversion = True
            return {"type": "array", "items": self.schema(args[0]), "uniqueItems": True}
        if tp in (dict, Mapping) or origin in (dict, Mapping):
            if not args:
                return {"type": "object"}
            if args[0] not in (str, Any):
                raise self.unsupported(tp, " (JSON object keys are strings)")
            values = self.schema(args[1])
            return (
                {"type": "object", "additionalProperties": values} if values else {"type": "object"}
            )
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            self.needs_conversion = True
            return self._enum([member.value for member in tp], tp)
        if isinstance(tp, type) and tp in _PRIMITIVES:
            self.needs_conversion |= tp in (int, float)  # JSON 7 is a float, 7.0 an integer
            return {"type": _PRIMITIVES[tp]}
        if typing.is_typeddict(tp):
            return self._typeddict(tp)
        if isinstance(tp, type) and (issubclass(tp, BaseModel) or dataclasses.is_dataclass(tp)):
            self.needs_conversion = True
            return self._pydantic(tp)
        raise self.unsupported(tp)

    def _typeddict(self, tp: Any) -> dict[str, Any]:
        # Built here: pydantic refuses typing.TypedDict before Python 3.12.
        try:
            hints = typing.get_type_hints(tp, include_extras=True)
        except Exception as exc:  # an unresolvable forward reference
            raise self.unsupported(tp, f" ({exc})") from None
        properties = {key: self.schema(hint) for key, hint in hints.items()}
        required = [key for key in hints if key in tp.__required_keys__]
        schema = {"type": "object", "properties": properties}
        return {**schema, "required": required} if required else schema

    def _enum(self, values: list[Any], tp: Any) -> dict[str, Any]:
        kinds = set()
        for value in values:
            if value is not None and type(value) not in _PRIMITIVES:
                raise self.unsupported(tp, " (enum values must be JSON scalars)")
            kinds.add(_PRIMITIVES.get(type(value), "null"))
        if len(kinds) == 1 and "null" not in kinds:
            return {"type": kinds.pop(), "enum": values}
        return {"enum": values}

    def _pydantic(self, tp: type) -> dict[str, Any]:
        try:
            schema = TypeAdapter(tp).json_schema()
        except Exception as exc:  # pydantic raises several unrelated types for this
            raise self.unsupported(tp, f" ({str(exc).splitlines()[0]})") from None
        for name, definition in schema.pop("$defs", {}).items():
            if self.defs.setdefault(name, definition) != definition:
                raise ToolError(
                    f"tool {self.tool_name!r} uses two different types named {name!r}; "
                    "rename one of them",
                    tool_name=self.tool_name,
                )
        return schema


def _adapter(tp: Any) -> TypeAdapter[Any] | None:
    """A converter from validated JSON to ``tp``; None (values pass as they are) if pydantic
    cannot build one, e.g. for a ``typing.TypedDict`` before Python 3.12."""
    try:
        return TypeAdapter(tp)
    except Exception:
        return None


def _type_name(tp: Any) -> str:
    return tp.__qualname__ if isinstance(tp, type) else repr(tp)


def _parse_docstring(doc: str | None) -> tuple[str | None, dict[str, str]]:
    """Split a Google-style docstring into its first paragraph and its ``Args:`` entries."""
    if not doc:
        return None, {}
    lines = inspect.cleandoc(doc).splitlines()
    summary: list[str] = []
    for line in lines:
        if not line.strip() or _SECTION_HEADER.match(line.strip()):
            break
        summary.append(line.strip())
    args: dict[str, str] = {}
    section: int | None = None  # indentation of the Args: header while inside that section
    item_indent: int | None = None
    current: str | None = None
    for line in lines:
        text = line.strip()
        if not text:
            continue
        indent = len(line) - len(line.lstrip())
        if section is not None and indent <= section:
            section = None
        if section is None:
            if text in _ARGS_HEADERS:
                section, item_indent, current = indent, None, None
            continue
        item_indent = indent if item_indent is None else item_indent
        head, colon, rest = text.partition(":")
        name = head.split("(")[0].strip().lstrip("*")
        if indent == item_indent and colon and name.isidentifier():
            current = name
            args[current] = rest.strip()
        elif current is not None:
            args[current] = f"{args[current]} {text}".strip()
    return " ".join(summary) or None, args


def _doc_target(fn: Callable[..., Any]) -> Any:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn


def _globals_of(fn: Callable[..., Any]) -> dict[str, Any]:
    """The namespace that string annotations (``from __future__ import annotations``) live in."""
    target = _doc_target(fn)
    target = getattr(target, "__func__", target)  # a bound method
    if not inspect.isfunction(inspect.unwrap(target)):
        target = type(target).__call__  # a callable object
    globals_: dict[str, Any] = getattr(inspect.unwrap(target), "__globals__", {})
    return globals_


def _is_context(name: str, annotation: Any) -> bool:
    if name == _CONTEXT_PARAM:
        return True
    # Checked before resolving: RolloutContext is often imported only under TYPE_CHECKING.
    return isinstance(annotation, str) and annotation.rsplit(".", 1)[-1] == "RolloutContext"


def _resolve(annotation: Any, param: str, tool_name: str, namespace: dict[str, Any]) -> Any:
    if annotation is inspect.Parameter.empty:
        raise ToolError(
            f"parameter {param!r} of tool {tool_name!r} has no type annotation; "
            f"annotate it (e.g. `{param}: str`) so the model knows what to send",
            tool_name=tool_name,
        )
    if not isinstance(annotation, str):
        return annotation
    try:
        return eval(annotation, namespace)  # what typing.get_type_hints does, per parameter
    except Exception as exc:
        raise ToolError(
            f"the type {annotation!r} of parameter {param!r} of tool {tool_name!r} could not be "
            f"resolved ({type(exc).__name__}: {exc}); import it at module level",
            tool_name=tool_name,
        ) from None


def _tool_name(fn: Callable[..., Any], name: str | None) -> str:
    attached = getattr(fn, SCHEMA_ATTRIBUTE, None)
    if name is None and isinstance(attached, OpenAIFunctionToolSchema):
        name = attached.name
    if name is None:
        name = getattr(_doc_target(fn), "__name__", None)
    if not isinstance(name, str) or not TOOL_NAME_PATTERN.match(name):
        raise ToolError(
            f"tool name {name!r} must match ^[a-zA-Z0-9_-]{{1,64}}$; pass name=... "
            "(to @tool or tool_schema)",
            tool_name=name if isinstance(name, str) else None,
        )
    return name


def _build_spec(
    fn: Callable[..., Any], name: str | None = None, description: str | None = None
) -> _ToolSpec:
    if not callable(fn):
        raise ToolError(f"a tool must be a function, got {type(fn).__name__}")
    name = _tool_name(fn, name)
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise ToolError(
            f"cannot read the signature of tool {name!r}: {exc}", tool_name=name
        ) from None
    attached = getattr(fn, SCHEMA_ATTRIBUTE, None)
    summary, arg_docs = _parse_docstring(inspect.getdoc(_doc_target(fn)))
    if description is None and isinstance(attached, OpenAIFunctionToolSchema):
        description = attached.function.description
    elif description is None:
        description = summary
    namespace = _globals_of(fn)
    defs: dict[str, Any] = {}
    builder = _SchemaBuilder(name, defs)
    properties: dict[str, Any] = {}
    required: list[str] = []
    params: dict[str, _Param] = {}
    context: list[str] = []
    var_keyword = unbound_self = False
    for index, param in enumerate(signature.parameters.values()):
        kind = param.kind
        if kind is param.VAR_KEYWORD:
            var_keyword = True
            continue
        if kind is param.VAR_POSITIONAL:
            raise ToolError(
                f"tool {name!r} takes *{param.name}, which a JSON object cannot fill; "
                f"use a list parameter instead (e.g. `{param.name}: list[str]`)",
                tool_name=name,
            )
        if _is_context(param.name, param.annotation):
            context.append(param.name)
            continue
        if index == 0 and param.name in ("self", "cls") and inspect.isfunction(fn):
            unbound_self = True
            continue
        builder.param, builder.needs_conversion = param.name, False
        tp = _resolve(param.annotation, param.name, name, namespace)
        if isinstance(tp, type) and issubclass(tp, RolloutContext):
            context.append(param.name)
            continue
        schema = builder.schema(tp)
        if "description" not in schema and param.name in arg_docs:
            schema["description"] = arg_docs[param.name]
        if param.default is param.empty:
            required.append(param.name)
        else:
            try:
                schema["default"] = to_jsonable_python(param.default)
            except Exception:
                raise ToolError(
                    f"the default of parameter {param.name!r} of tool {name!r} is not "
                    "JSON-serialisable; use None or a JSON value",
                    tool_name=name,
                ) from None
        properties[param.name] = schema
        adapter = _adapter(tp) if builder.needs_conversion else None
        params[param.name] = _Param(
            param.name, kind is param.POSITIONAL_ONLY, param.default, adapter
        )
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    if defs:
        parameters["$defs"] = defs
    function = OpenAIFunctionSchema(name=name, description=description, parameters=parameters)
    # A callable object is async when its __call__ is; iscoroutinefunction(obj) misses that.
    is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)
    return _ToolSpec(
        fn,
        OpenAIFunctionToolSchema(function=function),
        params,
        tuple(context),
        var_keyword,
        unbound_self,
        is_async,
    )


def tool_schema(
    fn: Callable[..., Any], *, name: str | None = None, description: str | None = None
) -> OpenAIFunctionToolSchema:
    """Build the OpenAI function tool for ``fn`` from its annotations and docstring.

    The docstring's first paragraph is the description and its Google-style ``Args:`` entries
    describe the parameters (``Annotated[X, "..."]`` wins over both). Parameters without a
    default are required. A parameter named ``ctx`` or annotated ``RolloutContext`` is filled
    in by :class:`Toolbox` and left out of the schema. Raises ``ToolError`` naming the parameter
    whose annotation cannot be expressed in JSON Schema.
    """
    return _build_spec(fn, name, description).schema


@overload
def tool(fn: F, /) -> F: ...
@overload
def tool(*, name: str | None = None, description: str | None = None) -> Callable[[F], F]: ...
def tool(
    fn: F | None = None, /, *, name: str | None = None, description: str | None = None
) -> F | Callable[[F], F]:
    """Mark a function as a tool: ``@tool`` or ``@tool(name=..., description=...)``.

    The schema is built (and checked) at decoration time and stored as ``fn.__tool_schema__``;
    the function itself is returned unchanged, so it can still be called directly.
    """

    def attach(f: F) -> F:
        schema = tool_schema(f, name=name, description=description)
        try:
            setattr(f, SCHEMA_ATTRIBUTE, schema)
        except AttributeError:
            raise ToolError(
                f"@tool cannot mark {f!r}; decorate the function where it is defined",
                tool_name=schema.name,
            ) from None
        return f

    return attach(fn) if fn is not None else attach


# --------------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------------


def parse_arguments(
    raw: str | Mapping[str, Any] | None, *, tool_name: str | None = None
) -> dict[str, Any]:
    """Turn a tool call's ``arguments`` (a JSON string, or an object) into a dict.

    Empty or null arguments are ``{}``. Bad JSON or anything but an object raises ``ToolError``
    with a message written for the model.
    """
    subject = f"arguments for tool {tool_name!r}" if tool_name else "tool arguments"
    if raw is None:
        return {}
    if isinstance(raw, Mapping):
        return dict(raw)
    if not isinstance(raw, str):
        raise ToolError(
            f"{subject} must be a JSON object, got {type(raw).__name__}", tool_name=tool_name
        )
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ToolError(
            f'{subject} are not valid JSON ({exc}); send one JSON object, e.g. {{"name": "value"}}',
            tool_name=tool_name,
        ) from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean"}.get(type(value), "a number")
        raise ToolError(
            f"{subject} must be a JSON object with one key per parameter, got {kind}",
            tool_name=tool_name,
        )
    return value


@functools.lru_cache(maxsize=512)
def _compiled(parameters_json: str) -> jsonschema.Draft202012Validator:
    schema = json.loads(parameters_json)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _validator(name: str, parameters: Mapping[str, Any]) -> jsonschema.Draft202012Validator:
    try:
        return _compiled(json.dumps(parameters, sort_keys=True, default=str))
    except SchemaError as exc:
        raise ToolError(
            f"tool {name!r} has an invalid parameters schema: {exc.message}", tool_name=name
        ) from None


def _check(name: str, validator: jsonschema.Draft202012Validator, args: Mapping[str, Any]) -> None:
    errors = sorted(validator.iter_errors(args), key=lambda e: e.json_path)
    if not errors:
        return
    problems = [f"{e.json_path}: {_shorten(e.message, 200)}" for e in errors[:3]]
    if len(errors) > 3:
        problems.append(f"and {len(errors) - 3} more")
    raise ToolError(f"invalid arguments for tool {name!r}: {'; '.join(problems)}", tool_name=name)


def validate_arguments(
    tool: OpenAIFunctionToolSchema | OpenAIFunctionSchema | Mapping[str, Any],
    args: Mapping[str, Any],
) -> None:
    """Check ``args`` against the tool's ``parameters`` (JSON Schema draft 2020-12).

    ``tool`` is a tool (model or ``{"type": "function", "function": {...}}``) or just its
    function part. Raises ``ToolError`` naming each failing path, e.g. ``$.b``. Compiled
    validators are cached per schema.
    """
    if isinstance(tool, OpenAIFunctionToolSchema):
        tool = tool.function
    if isinstance(tool, OpenAIFunctionSchema):
        name, parameters = tool.name, tool.parameters
    else:
        function = tool.get("function", tool)
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise ToolError("validate_arguments needs an OpenAI function tool with a name")
        name = function["name"]
        parameters = function.get("parameters") or {"type": "object", "properties": {}}
    _check(name, _validator(name, parameters), args)


# --------------------------------------------------------------------------------------------
# Execution
# --------------------------------------------------------------------------------------------


def _shorten(text: str, limit: int = _MAX_MESSAGE) -> str:
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def _encode(result: Any) -> str:
    if isinstance(result, str):
        return result
    try:
        return to_json(result, fallback=str).decode()
    except Exception as exc:  # e.g. a circular structure
        raise ToolError(f"the result could not be encoded as JSON: {exc}") from None


def _as_dict(call: Any) -> dict[str, Any]:
    if isinstance(call, BaseModel):
        return call.model_dump()
    return call if isinstance(call, dict) else {}


class Toolbox:
    """Python functions served as tools: their schemas, and a runner for the model's calls.

    ``functions`` is a list of functions (plain or ``@tool``-marked, sync or async, bound
    methods included) or a mapping from tool name to function. ``timeout_s`` bounds each call;
    a sync function that times out keeps running in its worker thread, but its result is
    dropped.
    """

    def __init__(
        self,
        functions: Iterable[Callable[..., Any]] | Mapping[str, Callable[..., Any]],
        *,
        timeout_s: float | None = None,
    ) -> None:
        if isinstance(functions, Mapping):
            specs = [_build_spec(fn, name) for name, fn in functions.items()]
        else:
            specs = [_build_spec(fn) for fn in functions]
        self._specs: dict[str, _ToolSpec] = {}
        self._validators: dict[str, jsonschema.Draft202012Validator] = {}
        for spec in specs:
            if spec.unbound_self:
                raise ToolError(
                    f"tool {spec.name!r} is an unbound method; pass the bound one "
                    f"(e.g. self.{spec.name})",
                    tool_name=spec.name,
                )
            if spec.name in self._specs:
                raise ToolError(f"two tools are named {spec.name!r}", tool_name=spec.name)
            self._specs[spec.name] = spec
            self._validators[spec.name] = _validator(spec.name, spec.schema.function.parameters)
        self.timeout_s = timeout_s

    @property
    def schemas(self) -> list[OpenAIFunctionToolSchema]:
        """The tools to return from ``get_tools``."""
        return [spec.schema for spec in self._specs.values()]

    @property
    def names(self) -> list[str]:
        """Tool names, in the order the functions were given."""
        return list(self._specs)

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __len__(self) -> int:
        return len(self._specs)

    def __repr__(self) -> str:
        return f"Toolbox({', '.join(self._specs)})"

    async def execute(
        self,
        ctx: RolloutContext,
        tool_calls: Sequence[Mapping[str, Any] | BaseModel],
        *,
        timeout_s: float | None = None,
    ) -> list[Message]:
        """Run a batch of tool calls concurrently; return one tool message per call, in order.

        ``tool_calls`` are the OpenAI dicts from ``CompletionsResult.tool_calls``. Failures
        become ``"Error: ..."`` messages; each call's latency goes to ``ctx.record_tool_call``.
        """
        timeout = self.timeout_s if timeout_s is None else timeout_s
        results: list[Message] = [{} for _ in tool_calls]

        async def run(index: int, call: Mapping[str, Any] | BaseModel) -> None:
            results[index] = await self._run_one(ctx, _as_dict(call), timeout)

        async with anyio.create_task_group() as group:
            for index, call in enumerate(tool_calls):
                group.start_soon(run, index, call)
        return results

    async def _run_one(
        self, ctx: RolloutContext, call: dict[str, Any], time_limit: float | None
    ) -> Message:
        call_id = call.get("id")
        call_id = call_id if isinstance(call_id, str) else ""
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        name = function.get("name")
        started = time.perf_counter()
        error: str | None = None
        try:
            content = await self._call(ctx, name, function.get("arguments"), time_limit)
        except ToolError as exc:
            error = _shorten(str(exc))
            content = f"Error: {error}"
        latency_ms = (time.perf_counter() - started) * 1000
        ctx.record_tool_call(latency_ms)
        ctx.log_event(
            "tool_call",
            tool=name,
            tool_call_id=call_id,
            latency_ms=round(latency_ms, 3),
            error=error,
        )
        return {"role": "tool", "tool_call_id": call_id, "content": content}

    async def _call(
        self, ctx: RolloutContext, name: Any, raw_args: Any, time_limit: float | None
    ) -> str:
        spec = self._specs.get(name) if isinstance(name, str) else None
        if spec is None:
            available = ", ".join(self._specs) or "(none)"
            shown = repr(name) if isinstance(name, str) else "(missing name)"
            raise ToolError(f"unknown tool {shown}; available: {available}", tool_name=None)
        args = parse_arguments(raw_args, tool_name=spec.name)
        _check(spec.name, self._validators[spec.name], args)
        positional, keywords = self._bind(ctx, spec, args)
        result: Any = None
        with anyio.move_on_after(time_limit) as scope:
            try:
                if spec.is_async:
                    result = await spec.fn(*positional, **keywords)
                else:
                    call = functools.partial(spec.fn, *positional, **keywords)
                    result = await anyio.to_thread.run_sync(call, abandon_on_cancel=True)
                if inspect.isawaitable(result):
                    result = await result
            except ToolError:
                raise  # the tool's own message, meant for the model
            except Exception as exc:  # a tool's bug is the model's feedback, not a crash
                logger.debug("tool %r raised", spec.name, exc_info=True)
                raise ToolError(
                    f"tool {spec.name!r} raised {type(exc).__name__}: {exc}", tool_name=spec.name
                ) from None
        if scope.cancelled_caught:
            raise ToolError(
                f"tool {spec.name!r} timed out after {time_limit or 0:g} s", tool_name=spec.name
            )
        return _encode(result)

    @staticmethod
    def _bind(
        ctx: RolloutContext, spec: _ToolSpec, args: dict[str, Any]
    ) -> tuple[list[Any], dict[str, Any]]:
        unexpected = [key for key in args if key not in spec.params]
        if unexpected and not spec.var_keyword:
            expected = ", ".join(spec.params) or "no arguments"
            raise ToolError(
                f"invalid arguments for tool {spec.name!r}: unexpected argument "
                f"{', '.join(map(repr, unexpected))}; expected: {expected}",
                tool_name=spec.name,
            )
        keywords: dict[str, Any] = dict.fromkeys(spec.context_params, ctx)
        for key, value in args.items():
            param = spec.params.get(key)
            if param is not None and param.adapter is not None:
                try:
                    value = param.adapter.validate_python(value)
                except ValidationError as exc:
                    raise ToolError(
                        f"invalid arguments for tool {spec.name!r}: {key}: "
                        f"{describe_validation_error(exc)}",
                        tool_name=spec.name,
                    ) from None
            keywords[key] = value
        positional = [
            keywords.pop(p.name, p.default) for p in spec.params.values() if p.positional_only
        ]
        return positional, keywords


async def execute_tool_calls(
    ctx: RolloutContext,
    tool_calls: Sequence[Mapping[str, Any] | BaseModel],
    functions: Toolbox | Iterable[Callable[..., Any]] | Mapping[str, Callable[..., Any]],
    *,
    timeout_s: float | None = None,
) -> list[Message]:
    """Run ``tool_calls`` with ``functions`` (a dict by tool name, a list, or a Toolbox).

    Same behaviour as :meth:`Toolbox.execute`; build a ``Toolbox`` once to skip re-reading the
    functions' signatures on every turn.
    """
    toolbox = functions if isinstance(functions, Toolbox) else Toolbox(functions)
    return await toolbox.execute(ctx, tool_calls, timeout_s=timeout_s)
