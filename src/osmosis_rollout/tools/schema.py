"""Tool schemas built from Python functions: signature, annotations and Google-style docstring.

``_build_spec`` reads a function once; ``tool_schema`` and ``@tool`` expose its schema, and
``Toolbox`` keeps the whole spec to call the function later.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from pydantic import TypeAdapter
from pydantic_core import to_jsonable_python

from ..agent import RolloutContext
from ..errors import ToolError
from ..protocol import OpenAIFunctionSchema, OpenAIFunctionToolSchema
from .checks import TOOL_NAME_PATTERN
from .type_schema import _adapter, _SchemaBuilder

F = TypeVar("F", bound=Callable[..., Any])

#: The attribute ``@tool`` sets on a function: its ``OpenAIFunctionToolSchema``.
SCHEMA_ATTRIBUTE = "__tool_schema__"
_CONTEXT_PARAM = "ctx"
_ARGS_HEADERS = frozenset({"Args:", "Arguments:", "Parameters:", "Params:"})
_SECTION_HEADER = re.compile(
    r"^(Args|Arguments|Parameters|Params|Returns?|Raises|Yields?|Examples?|Notes?|Attributes"
    r"|See Also|Warnings?|Todo):$"
)


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
