"""JSON Schema keywords as the instance generator reads them: merging, bounds, inferred types."""

from __future__ import annotations

import json
import math
from fractions import Fraction
from typing import Any

_OBJECT_KEYS = frozenset(
    {"properties", "required", "additionalProperties", "patternProperties", "minProperties"}
    | {"maxProperties", "propertyNames", "dependentRequired"}
)
_ARRAY_KEYS = frozenset(
    {"items", "prefixItems", "minItems", "maxItems", "contains", "uniqueItems", "additionalItems"}
)
_STRING_KEYS = frozenset({"minLength", "maxLength", "pattern", "format"})
NUMBER_KEYS = frozenset(
    {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}
)
_LOWER_BOUNDS = frozenset({"minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties"})
_UPPER_BOUNDS = frozenset({"maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties"})
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions"})
_SUBSCHEMAS = frozenset({"items", "additionalProperties", "contains", "propertyNames"})


class NoValue(Exception):
    """Internal: this attempt found no value; the message says where and why."""


def types_of(schema: dict[str, Any], path: str) -> list[str]:
    declared = schema.get("type")
    if isinstance(declared, str):
        return [declared]
    if isinstance(declared, list):
        if not declared:
            raise NoValue(f"the types required at {path} have nothing in common")
        return list(declared)
    keys = schema.keys()
    inferred = [
        kind
        for kind, words in (
            ("object", _OBJECT_KEYS),
            ("array", _ARRAY_KEYS),
            ("string", _STRING_KEYS),
            ("number", NUMBER_KEYS),
        )
        if words & keys
    ]
    return inferred or ["string", "integer", "boolean"]


def merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Both schemas at once (for allOf and $ref siblings); unfoldable conflicts go to allOf."""
    out = dict(a)
    leftover: list[dict[str, Any]] = []
    for key, theirs in b.items():
        if key not in out:
            out[key] = theirs
            continue
        ours = out[key]
        if ours == theirs:
            continue
        if key == "type":
            out[key] = _common_types(ours, theirs)
        elif key == "required" and isinstance(ours, list) and isinstance(theirs, list):
            out[key] = list(dict.fromkeys([*ours, *theirs]))
        elif key in _LOWER_BOUNDS and _is_number(ours) and _is_number(theirs):
            out[key] = max(ours, theirs)
        elif key in _UPPER_BOUNDS and _is_number(ours) and _is_number(theirs):
            out[key] = min(ours, theirs)
        elif key == "enum" and isinstance(ours, list) and isinstance(theirs, list):
            out[key] = [v for v in ours if any(canonical(v) == canonical(t) for t in theirs)]
        elif key in _SCHEMA_MAPS and isinstance(ours, dict) and isinstance(theirs, dict):
            merged = dict(ours)
            for name, sub in theirs.items():
                merged[name] = {"allOf": [merged[name], sub]} if name in merged else sub
            out[key] = merged
        elif (
            key in _SUBSCHEMAS and isinstance(ours, dict | bool) and isinstance(theirs, dict | bool)
        ):
            out[key] = False if ours is False or theirs is False else {"allOf": [ours, theirs]}
        elif key == "multipleOf" and _is_number(ours) and _is_number(theirs):
            x, y = Fraction(str(ours)), Fraction(str(theirs))
            lcm = Fraction(
                math.lcm(x.numerator, y.numerator), math.gcd(x.denominator, y.denominator)
            )
            out[key] = int(lcm) if lcm.denominator == 1 else float(lcm)
        elif key in ("title", "description", "default", "examples", "$comment"):
            continue
        else:
            leftover.append({key: theirs})
    if leftover:
        out["allOf"] = [*out.get("allOf", []), *leftover]
    return out


def _common_types(a: Any, b: Any) -> list[str]:
    left = [a] if isinstance(a, str) else list(a)
    right = [b] if isinstance(b, str) else list(b)
    common = [t for t in left if t in right]
    if "integer" not in common and (
        ("integer" in left and "number" in right) or ("number" in left and "integer" in right)
    ):
        common.append("integer")
    return common


def number_bounds(schema: dict[str, Any]) -> tuple[Fraction | None, bool, Fraction | None, bool]:
    """(lower, lower is strict, upper, upper is strict), drafts 4 and 6+ alike."""

    def side(inclusive: str, exclusive: str, lower: bool) -> tuple[Fraction | None, bool]:
        limit, flag = schema.get(inclusive), schema.get(exclusive)
        found: list[tuple[Fraction, bool]] = []
        if _is_number(limit):  # draft 4 makes it strict with `exclusiveMinimum: true`
            found.append((Fraction(str(limit)), flag is True))
        if _is_number(flag):
            found.append((Fraction(str(flag)), True))
        if not found:
            return None, False
        tightest = max(v for v, _ in found) if lower else min(v for v, _ in found)
        return tightest, any(strict for v, strict in found if v == tightest)

    lo, lo_strict = side("minimum", "exclusiveMinimum", lower=True)
    hi, hi_strict = side("maximum", "exclusiveMaximum", lower=False)
    return lo, lo_strict, hi, hi_strict


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def escape_name(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")
