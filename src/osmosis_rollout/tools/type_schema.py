"""JSON Schema for one parameter's Python type annotation, the core of ``tool_schema``."""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, TypeAdapter
from pydantic.fields import FieldInfo

from ..errors import ToolError

_PRIMITIVES: dict[type, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


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
