"""Whether a tool's declared schema and the function that runs it agree on its parameters.

An agent may write a tool's schema by hand in ``get_tools`` and run the tool through a
``Toolbox``, which checks each call against the function's own signature. When the two name
different parameters, the model (trained on the declared schema) sends arguments the function
refuses, and every call fails: :func:`disagreements` names each parameter they disagree on, for
``osmosis validate`` (at run time, ``Toolbox`` counts such refused calls as the tool's errors).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..protocol import OpenAIFunctionToolSchema
from .schema import _ToolSpec
from .toolbox import Toolbox

__all__ = ["Disagreement", "disagreements", "find_spec"]


@dataclass(frozen=True, slots=True)
class Disagreement:
    """One parameter the declared schema and the function disagree on. ``path`` is inside the
    tool's ``parameters`` (``.properties.x``, ``.required``); an ``error`` fails every call that
    the schema lets the model send, a ``warning`` some of them (or hides a parameter)."""

    severity: Literal["error", "warning"]
    path: str
    message: str


def find_spec(toolboxes: list[Toolbox], name: str) -> _ToolSpec | None:
    """The tool ``name`` of the first toolbox that has one."""
    for toolbox in toolboxes:
        spec = toolbox._specs.get(name)
        if spec is not None:
            return spec
    return None


#: JSON Schema type names each type name accepts values of (an integer is also a number).
_ACCEPTS: dict[str, frozenset[str]] = {
    "number": frozenset({"number", "integer"}),
    "integer": frozenset({"integer"}),
}


def disagreements(tool: OpenAIFunctionToolSchema, spec: _ToolSpec) -> list[Disagreement]:
    """Every parameter on which ``tool`` (as ``get_tools`` declared it) and ``spec`` (the
    toolbox's function) disagree: names first, then plain ``type`` keywords with no value in
    common. A declared schema the toolbox built itself agrees by construction."""
    declared = tool.function.parameters
    own = spec.schema.function.parameters
    if declared == own:
        return []
    name = tool.function.name
    d_props = _properties(declared)
    d_required = _required(declared)
    f_props = _properties(own)
    f_required = _required(own)
    # What the toolbox lets through besides its properties: the function's **kwargs (all an
    # MCP tool is), unless its own schema closes the object.
    open_rest = spec.var_keyword and own.get("additionalProperties", True) is not False
    signature = _signature(spec)
    fix = "rename the parameter on one side, or return toolbox.schemas from get_tools()"
    found: list[Disagreement] = []
    for key in d_props:
        if key in f_props or open_rest:
            continue
        if key in d_required:
            found.append(
                Disagreement(
                    "error",
                    f".properties.{key}",
                    f"tool {name!r}: get_tools() declares a required parameter {key!r}, but "
                    f"the function {signature} takes no {key!r} (and no **kwargs), so every "
                    f"call fails with 'invalid arguments'; {fix}",
                )
            )
        else:
            found.append(
                Disagreement(
                    "warning",
                    f".properties.{key}",
                    f"tool {name!r}: get_tools() declares an optional parameter {key!r}, but "
                    f"the function {signature} takes no {key!r} (and no **kwargs), so every "
                    f"call that sends it fails with 'invalid arguments'; {fix}",
                )
            )
    for key in f_props:
        if key in d_props:
            continue
        if key in f_required:
            found.append(
                Disagreement(
                    "error",
                    ".required" if d_required else "",
                    f"tool {name!r}: the function {signature} requires {key!r}, but the "
                    f"schema get_tools() declares has no {key!r}, so the model never sends it "
                    f"and every call fails with 'invalid arguments'; {fix}",
                )
            )
        else:
            found.append(
                Disagreement(
                    "warning",
                    "",
                    f"tool {name!r}: the function {signature} takes an optional {key!r} that "
                    f"the schema get_tools() declares does not, so the model can never set "
                    f"it; declare it, or return toolbox.schemas from get_tools()",
                )
            )
    for key in f_required:
        if key in d_props and key not in d_required:
            found.append(
                Disagreement(
                    "warning",
                    f".properties.{key}",
                    f"tool {name!r}: the function {signature} requires {key!r}, but the "
                    f"schema get_tools() declares makes it optional, so every call without it "
                    f"fails with 'invalid arguments'; list it in \"required\" (or give the "
                    f"function's parameter a default)",
                )
            )
    for key, d_schema in d_props.items():
        f_schema = f_props.get(key)
        if f_schema is None:
            continue
        d_types, f_types = _types(d_schema), _types(f_schema)
        if d_types is None or f_types is None:
            continue
        accepted = set().union(*(_ACCEPTS.get(t, {t}) for t in f_types))
        if any(t in accepted for t in d_types):
            continue
        required = key in d_required
        found.append(
            Disagreement(
                "error" if required else "warning",
                f".properties.{key}.type",
                f"tool {name!r}: get_tools() declares {key!r} as {_shown(d_types)}, but the "
                f"function {signature} takes {_shown(f_types)}, so every call that sends it "
                f"fails with 'invalid arguments'; declare the type the function takes, or "
                f"return toolbox.schemas from get_tools()",
            )
        )
    return found


def _properties(schema: Mapping[str, Any]) -> dict[str, Any]:
    props = schema.get("properties", {})
    return {str(k): v for k, v in props.items()} if isinstance(props, Mapping) else {}


def _required(schema: Mapping[str, Any]) -> set[str]:
    required = schema.get("required", [])
    return {r for r in required if isinstance(r, str)} if isinstance(required, list) else set()


def _types(schema: Any) -> list[str] | None:
    """A property's plain ``type`` names; None when it has none (or more than a ``type`` to
    judge by, such as ``anyOf``), so that nothing is guessed."""
    if not isinstance(schema, Mapping) or any(k in schema for k in ("anyOf", "oneOf", "$ref")):
        return None
    kind = schema.get("type")
    kinds = [kind] if isinstance(kind, str) else kind
    if not isinstance(kinds, list) or not kinds or not all(isinstance(k, str) for k in kinds):
        return None
    return kinds


def _shown(types: list[str]) -> str:
    return " or ".join(repr(t) for t in types)


def _signature(spec: _ToolSpec) -> str:
    params = list(spec.params)
    if spec.var_keyword:
        params.append("**kwargs")
    target = getattr(spec.fn, "__name__", None)
    shown = target if isinstance(target, str) and target.isidentifier() else spec.name
    return f"{shown}({', '.join(params)})"
