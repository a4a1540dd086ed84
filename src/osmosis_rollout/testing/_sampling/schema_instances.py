"""Deterministic instances of JSON Schemas, used for the mock LLM's tool-call arguments.

``generate(schema, seed=n)`` builds a value that is valid against ``schema``. The same schema and
seed always give the same value (no ``hash()``, no global random state); other seeds vary it
where the schema leaves room. It covers what tool schemas use in practice: typed objects, arrays,
strings (lengths, formats, simple patterns), numbers (bounds, exclusive bounds, ``multipleOf``),
enums and consts of any JSON type, ``anyOf``/``oneOf``/``allOf``, local ``$ref`` and type lists.

Every result is checked with ``jsonschema`` before it is returned. When the generator cannot find
a valid value (a contradiction, a remote ``$ref``, a regular expression with lookarounds...) it
raises :class:`~osmosis_rollout.errors.UnsatisfiableSchemaError` rather than return a value the
agent's own validation would reject for a reason that is not the agent's fault.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import random
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any
from urllib.parse import unquote

import jsonschema
from jsonschema.exceptions import best_match

from ...errors import UnsatisfiableSchemaError
from .schema_keywords import (
    NUMBER_KEYS,
    NoValue,
    canonical,
    escape_name,
    merge,
    number_bounds,
    types_of,
)
from .string_sample import format_string, pattern_string, plain_string

__all__ = ["generate"]

#: Attempts with fresh randomness before giving up on a schema.
_ATTEMPTS = 8
#: Past this depth, objects get only required properties and arrays their minimum length, so
#: recursive schemas (trees, linked lists) end.
_MINIMAL_DEPTH = 6
#: Past this depth a recursive schema has no finite instance we can find.
_MAX_DEPTH = 40
_DEFAULT_SPAN = 100


def generate(schema: Mapping[str, Any] | bool, *, seed: int = 0) -> Any:
    """Return a deterministic value valid against ``schema`` (varied by ``seed``).

    Raises ``UnsatisfiableSchemaError`` when ``schema`` is not a valid JSON Schema, or when no
    valid value could be built; the message names the place in the schema that failed.
    """
    if isinstance(schema, Mapping):
        schema = dict(schema)
    validator = _validator(schema)
    problem = "no attempt was made"
    for attempt in range(_ATTEMPTS):
        builder = _Builder(schema, validator, seed=seed, attempt=attempt)
        try:
            value = builder.value(schema, "#", 0)
        except NoValue as exc:
            problem = str(exc)
            continue
        error = best_match(validator.iter_errors(value))
        if error is None:
            return value
        where = "/".join(str(p) for p in error.absolute_path) or "the top level"
        problem = f"the generated value fails {error.validator!r} at {where}"
    raise UnsatisfiableSchemaError(
        f"cannot generate a value for this JSON Schema: {problem}. Simplify or fix the schema "
        "(or call the tool with hand-written arguments, e.g. a ScriptedBackend)"
    )


def _validator(schema: dict[str, Any] | bool) -> Any:
    try:
        text = json.dumps(schema, sort_keys=True)
    except (TypeError, ValueError):
        return _checked_validator(schema)
    return _cached_validator(text)


@functools.lru_cache(maxsize=256)
def _cached_validator(text: str) -> Any:
    # Checking a schema against its metaschema costs more than generating from it; the mock
    # LLM generates from the same few tool schemas for every rollout.
    return _checked_validator(json.loads(text))


def _checked_validator(schema: Any) -> Any:
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "the top level"
        raise UnsatisfiableSchemaError(
            f"not a valid JSON Schema ({exc.message} at {where})"
        ) from None
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


class _Builder:
    """One attempt at building a value; all randomness comes from (seed, attempt, path)."""

    def __init__(self, root: Any, validator: Any, *, seed: int, attempt: int) -> None:
        self.root = root
        self.validator = validator
        self.seed = seed
        self.attempt = attempt

    def rng(self, path: str, tag: str = "") -> random.Random:
        # Seeding with a str hashes it with SHA-512: stable across runs and Python processes.
        return random.Random(f"{self.seed}|{self.attempt}|{path}|{tag}")

    def valid(self, value: Any, schema: Any) -> bool:
        return bool(self.validator.evolve(schema=schema).is_valid(value))

    # -- dispatch ---------------------------------------------------------------------------

    def value(self, schema: Any, path: str, depth: int) -> Any:
        if depth > _MAX_DEPTH:
            raise NoValue(f"the schema at {path} recurses without a finite instance")
        if schema is True:
            schema = {}
        if schema is False:
            raise NoValue(f"the schema at {path} is `false`, which allows no value")
        if not isinstance(schema, dict):
            raise NoValue(f"the schema at {path} is not an object")
        schema = self.flatten(schema, path)
        rng = self.rng(path)
        if "const" in schema:
            return copy.deepcopy(schema["const"])
        if "enum" in schema:
            return self.enum(schema, path, rng)
        if "default" in schema and rng.random() < 0.25 and self.valid(schema["default"], schema):
            return copy.deepcopy(schema["default"])
        for key in ("oneOf", "anyOf"):
            if key in schema:
                return self.union(schema, key, path, depth)
        types = types_of(schema, path)
        rng.shuffle(types)
        problems = []
        for kind in types:
            try:
                return self.typed(kind, schema, path, depth, rng)
            except NoValue as exc:
                problems.append(str(exc))
        raise NoValue("; ".join(problems))

    def typed(
        self, kind: str, schema: dict[str, Any], path: str, depth: int, rng: random.Random
    ) -> Any:
        if kind == "object":
            return self.object(schema, path, depth, rng)
        if kind == "array":
            return self.array(schema, path, depth, rng)
        if kind == "string":
            return self.string(schema, path)
        if kind in ("integer", "number"):
            return self.number(schema, path, rng, integer=kind == "integer")
        if kind == "boolean":
            return rng.random() < 0.5
        if kind == "null":
            return None
        raise NoValue(f"unknown type {kind!r} at {path}")

    # -- $ref and allOf ---------------------------------------------------------------------

    def flatten(self, schema: dict[str, Any], path: str) -> dict[str, Any]:
        """Resolve ``$ref`` (merging sibling keywords) and merge ``allOf`` into one schema."""
        for _ in range(64):
            if "$ref" in schema:
                target = self.resolve(schema["$ref"], path)
                rest = {k: v for k, v in schema.items() if k != "$ref"}
                schema = merge(target, rest) if rest else target
            elif isinstance(schema.get("allOf"), list):
                merged = {k: v for k, v in schema.items() if k != "allOf"}
                for part in schema["allOf"]:
                    if part is False:
                        raise NoValue(f"allOf at {path} contains `false`")
                    if isinstance(part, dict):
                        merged = merge(merged, self.flatten(part, path))
                if "allOf" in merged:  # conflicts merge could not fold: checked, not built
                    return merged
                schema = merged
            else:
                return schema
        raise NoValue(f"$ref at {path} loops without reaching a schema")

    def resolve(self, ref: Any, path: str) -> dict[str, Any]:
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise NoValue(
                f"$ref {ref!r} at {path} is not local; only '#/...' references (to $defs or "
                "definitions) are supported"
            )
        node: Any = self.root
        for token in filter(None, ref[1:].split("/")):
            key = unquote(token).replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and key in node:
                node = node[key]
            elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
                node = node[int(key)]
            else:
                raise NoValue(f"$ref {ref!r} at {path} points to nothing in the schema")
        if node is True:
            return {}
        if not isinstance(node, dict):
            raise NoValue(f"$ref {ref!r} at {path} does not point to a schema object")
        return node

    # -- enum and unions --------------------------------------------------------------------

    def enum(self, schema: dict[str, Any], path: str, rng: random.Random) -> Any:
        options = [v for v in schema["enum"] if self.valid(v, schema)]
        if not options:
            raise NoValue(f"no value of the enum at {path} satisfies the other keywords")
        return copy.deepcopy(rng.choice(options))

    def union(self, schema: dict[str, Any], key: str, path: str, depth: int) -> Any:
        rest = {k: v for k, v in schema.items() if k != key}
        branches = list(enumerate(schema[key]))
        self.rng(path, key).shuffle(branches)
        if depth >= _MINIMAL_DEPTH:  # prefer branches that cannot recurse
            branches.sort(key=lambda item: "$ref" in json.dumps(item[1]))
        problems = []
        for index, branch in branches:
            if branch is False:
                continue
            sub = merge(rest, branch) if isinstance(branch, dict) else rest
            try:
                candidate = self.value(sub, path, depth + 1)
            except NoValue as exc:
                problems.append(f"{key}[{index}]: {exc}")
                continue
            if self.valid(candidate, schema):
                return candidate
            problems.append(f"{key}[{index}] gave a value that fails the whole {key}")
        raise NoValue(f"no branch of {key} at {path} works ({'; '.join(problems)})")

    # -- containers -------------------------------------------------------------------------

    def object(
        self, schema: dict[str, Any], path: str, depth: int, rng: random.Random
    ) -> dict[str, Any]:
        props: dict[str, Any] = schema.get("properties") or {}
        required = [n for n in schema.get("required") or [] if isinstance(n, str)]
        minimal = depth >= _MINIMAL_DEPTH
        optional = [n for n in props if n not in required and props[n] is not False]
        chosen = {n for n in optional if not minimal and rng.random() < 0.5}
        min_props = schema.get("minProperties") or 0
        max_props = schema.get("maxProperties")
        for name in optional:
            if len(required) + len(chosen) >= min_props:
                break
            chosen.add(name)
        if max_props is not None:
            while chosen and len(required) + len(chosen) > max_props:
                chosen.discard(max(chosen, key=optional.index))
        for name, needs in (schema.get("dependentRequired") or {}).items():
            if name in required or name in chosen:
                required.extend(n for n in needs if n not in required)
        names = [n for n in props if n in required or n in chosen]
        names += [n for n in required if n not in props]
        index = 0
        while len(names) < min_props:
            index += 1
            if f"key{index}" not in names:
                names.append(f"key{index}")
        out: dict[str, Any] = {}
        for name in names:
            sub = props[name] if name in props else self.extra_schema(schema, name, path)
            out[name] = self.value(sub, f"{path}/{escape_name(name)}", depth + 1)
        return out

    def extra_schema(self, schema: dict[str, Any], name: str, path: str) -> Any:
        matching = [
            sub
            for pattern, sub in (schema.get("patternProperties") or {}).items()
            if re.search(pattern, name)
        ]
        if matching:
            return {"allOf": matching}
        extra = schema.get("additionalProperties", True)
        if extra is False:
            raise NoValue(
                f"property {name!r} at {path} is required (or needed for minProperties) but "
                "additionalProperties is false and `properties` does not declare it"
            )
        return extra

    def array(self, schema: dict[str, Any], path: str, depth: int, rng: random.Random) -> list[Any]:
        items = schema.get("items", True)
        prefix: list[Any] = schema.get("prefixItems") or []
        if isinstance(items, list):  # draft 4-7 tuple form
            prefix, items = items, schema.get("additionalItems", True)
        low = schema.get("minItems") or 0
        high = schema.get("maxItems")
        if items is False:
            high = len(prefix) if high is None else min(high, len(prefix))
        if high is None:
            high = max(low, len(prefix)) + 3
        if depth < _MINIMAL_DEPTH:
            low = max(low, min(1, high))
        if low > high:
            raise NoValue(f"the array at {path} needs {low} to {high} items")
        size = rng.randint(low, min(high, low + 2))
        unique = schema.get("uniqueItems") is True
        out: list[Any] = []
        seen: set[str] = set()
        for i in range(size):
            sub = prefix[i] if i < len(prefix) else items
            for retry in range(12):
                item = self.value(sub, f"{path}/{i}" + (f"~{retry}" if retry else ""), depth + 1)
                if not unique or canonical(item) not in seen:
                    break
            else:
                if i >= low:  # enough items already: a shorter array is still valid
                    break
                raise NoValue(f"cannot find {low} distinct items for the array at {path}")
            seen.add(canonical(item))
            out.append(item)
        contains = schema.get("contains")
        if contains is not None and not any(self.valid(v, contains) for v in out):
            wanted = {"allOf": [items, contains]} if isinstance(items, dict) else contains
            item = self.value(wanted, f"{path}/contains", depth + 1)
            if out:
                out[0] = item
            elif high >= 1:
                out.append(item)
        return out

    # -- scalars ----------------------------------------------------------------------------

    def string(self, schema: dict[str, Any], path: str) -> str:
        low = schema.get("minLength") or 0
        high = schema.get("maxLength")
        if high is not None and low > high:
            raise NoValue(f"the string at {path} needs minLength {low} <= maxLength {high}")
        pattern = schema.get("pattern")
        for tries in range(16):
            rng = self.rng(path, f"string{tries}")
            fmt = schema.get("format")
            if isinstance(pattern, str):
                text = pattern_string(pattern, rng, low, path)
            elif isinstance(fmt, str) and (formatted := format_string(fmt, rng)) is not None:
                text = formatted
            else:
                text = plain_string(rng, low, high)
            if low <= len(text) and (high is None or len(text) <= high):
                return text
        raise NoValue(f"cannot build a string at {path} that fits its pattern/format and length")

    def number(
        self, schema: dict[str, Any], path: str, rng: random.Random, *, integer: bool
    ) -> Any:
        lo, lo_strict, hi, hi_strict = number_bounds(schema)
        step = schema.get("multipleOf")
        if lo is None:
            lo = Fraction(0) if hi is None else hi - _DEFAULT_SPAN
        if hi is None:
            hi = lo + _DEFAULT_SPAN
        if integer or step is not None:
            unit = Fraction(str(step)) if step is not None else Fraction(1)
            if integer:  # the smallest integer multiple of `unit`: its numerator
                unit = Fraction(unit.numerator)
            first = math.floor(lo / unit) + 1 if lo_strict else math.ceil(lo / unit)
            last = math.ceil(hi / unit) - 1 if hi_strict else math.floor(hi / unit)
            if first > last:
                what = "integer" if unit == 1 else f"multiple of {step}"
                raise NoValue(f"no {what} lies within the bounds at {path}")
            bounds = {k: v for k, v in schema.items() if k in NUMBER_KEYS}
            for _ in range(16):
                k = rng.randint(first, min(last, first + 2 * _DEFAULT_SPAN))
                exact = k * unit
                candidate: Any = int(exact) if exact.denominator == 1 else float(exact)
                if self.valid(candidate, bounds):
                    return candidate
            raise NoValue(f"floating-point rounding defeats multipleOf {step} at {path}")
        if lo > hi or (lo == hi and (lo_strict or hi_strict)):
            raise NoValue(f"no number lies within the bounds at {path}")
        value = round(float(lo + (hi - lo) * Fraction(rng.random())), 2)
        if (value < lo or (lo_strict and value == lo)) or (
            value > hi or (hi_strict and value == hi)
        ):
            value = float((lo + hi) / 2)
        return value
