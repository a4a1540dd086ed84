"""schema_instances.generate: deterministic, seed-varied values valid against their schema."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any, Literal

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from osmosis_rollout.errors import UnsatisfiableSchemaError
from osmosis_rollout.testing._sampling.schema_instances import generate

SEEDS = range(21)


class _Address(BaseModel):
    street: str = Field(min_length=3, max_length=40)
    zip_code: str = Field(pattern=r"^\d{5}$")


class _Order(BaseModel):
    sku: str
    quantity: int = Field(ge=1, le=20)
    priority: Literal["low", "high", 3] = "low"
    ship_to: _Address | None = None
    notes: list[str] = Field(default_factory=list, max_length=2)


TREE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "label": {"type": "string", "minLength": 1, "maxLength": 8},
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2},
            },
            "required": ["label"],
            "additionalProperties": False,
        }
    },
    "$ref": "#/$defs/node",
}

# (name, schema, varies): `varies` says whether the schema leaves room for seeds to differ.
CORPUS: list[tuple[str, Any, bool]] = [
    (
        "calculator",
        {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
        True,
    ),
    (
        "nested_object",
        {
            "type": "object",
            "properties": {
                "user": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "minLength": 2, "maxLength": 12},
                        "age": {"type": "integer", "minimum": 0, "maximum": 130},
                        "email": {"type": "string", "format": "email"},
                    },
                    "required": ["name", "email"],
                },
                "active": {"type": "boolean"},
            },
            "required": ["user"],
        },
        True,
    ),
    (
        "array_of_objects",
        {
            "type": "array",
            "minItems": 2,
            "maxItems": 4,
            "items": {
                "type": "object",
                "properties": {
                    "op": {"enum": ["add", "sub", "mul"]},
                    "operands": {
                        "type": "array",
                        "items": {"type": "number", "minimum": -10, "maximum": 10},
                        "minItems": 2,
                        "maxItems": 2,
                    },
                },
                "required": ["op", "operands"],
            },
        },
        True,
    ),
    ("enum_mixed", {"enum": [1, 2.5, "x", None, True, {"k": [1]}]}, True),
    ("enum_with_type", {"type": "integer", "enum": [1, "1", 2.5, 7]}, True),
    (
        "any_of",
        {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "integer", "minimum": 10}]},
        True,
    ),
    (
        "one_of_overlapping",
        {
            "type": "integer",
            "minimum": 1,
            "maximum": 60,
            "oneOf": [{"multipleOf": 2}, {"multipleOf": 3}],
        },
        True,
    ),
    (
        "all_of",
        {
            "allOf": [
                {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
                {"properties": {"y": {"type": "integer", "minimum": 5}}, "required": ["y"]},
                {"properties": {"y": {"maximum": 9}}},
            ]
        },
        True,
    ),
    ("ref_defs_recursive", TREE, True),
    (
        "definitions_draft7",
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "definitions": {"point": {"type": "array", "items": {"type": "integer"}}},
            "type": "object",
            "properties": {"from": {"$ref": "#/definitions/point"}},
            "required": ["from"],
        },
        True,
    ),
    (
        "numeric_bounds",
        {
            "type": "object",
            "properties": {
                "ratio": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
                "step": {"type": "number", "minimum": 0, "maximum": 2, "multipleOf": 0.25},
                "tenth": {"type": "number", "exclusiveMinimum": 0, "maximum": 1, "multipleOf": 0.1},
                "week": {"type": "integer", "minimum": 7, "maximum": 70, "multipleOf": 7},
                "tiny": {"type": "number", "exclusiveMinimum": 0.001, "exclusiveMaximum": 0.002},
                "neg": {"type": "integer", "exclusiveMaximum": -5},
            },
            "required": ["ratio", "step", "tenth", "week", "tiny", "neg"],
        },
        True,
    ),
    (
        "draft4_exclusive_flags",
        {
            "$schema": "http://json-schema.org/draft-04/schema#",
            "type": "integer",
            "minimum": 0,
            "exclusiveMinimum": True,
            "maximum": 3,
            "exclusiveMaximum": True,
        },
        True,
    ),
    (
        "string_lengths",
        {
            "type": "array",
            "prefixItems": [
                {"type": "string", "minLength": 5, "maxLength": 5},
                {"type": "string", "minLength": 40},
                {"type": "string", "maxLength": 1},
            ],
            "minItems": 3,
            "items": False,
        },
        True,
    ),
    (
        "formats",
        {
            "type": "object",
            "properties": {
                name: {"type": "string", "format": name}
                for name in ("date", "date-time", "time", "email", "uri", "uuid", "ipv4", "ipv6")
            },
            "required": ["date", "date-time", "time", "email", "uri", "uuid", "ipv4", "ipv6"],
        },
        True,
    ),
    (
        "patterns",
        {
            "type": "object",
            "properties": {
                "color": {"type": "string", "pattern": "^(red|green|blue)-[a-f0-9]{4}$"},
                "phone": {"type": "string", "pattern": r"^\+?\d{2,3}[ -]\d{3,4}$"},
                "word": {"type": "string", "pattern": "[^aeiou]{3}", "minLength": 8},
                "name": {"type": "string", "pattern": r"^[A-Z][a-z]+(?: [A-Z][a-z]+)*$"},
            },
            "required": ["color", "phone", "word", "name"],
        },
        True,
    ),
    ("type_list", {"type": ["integer", "null", "string"], "minimum": 3, "minLength": 2}, True),
    ("const_and_default", {"type": "object", "properties": {"v": {"const": [1, "a"]}}}, True),
    (
        "closed_object",
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {}},
            "required": ["a"],
            "minProperties": 2,
            "additionalProperties": False,
        },
        True,
    ),
    (
        "unique_items",
        {"type": "array", "items": {"enum": [1, 2, 3, 4]}, "minItems": 4, "uniqueItems": True},
        True,
    ),
    (
        "contains",
        {"type": "array", "items": {"type": "integer"}, "contains": {"const": 42}},
        True,
    ),
    ("pydantic_model", _Order.model_json_schema(), True),
    ("empty_schema", {}, True),
    ("true_schema", True, True),
    ("single_value", {"type": "null"}, False),
]


def _validate(schema: Any, value: Any) -> None:
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls(schema, format_checker=cls.FORMAT_CHECKER).validate(value)


@pytest.mark.parametrize(("name", "schema", "varies"), CORPUS, ids=[c[0] for c in CORPUS])
def test_every_instance_validates(name: str, schema: Any, varies: bool) -> None:
    """For seeds 0..20 each corpus schema yields a value that jsonschema (with formats) accepts."""
    for seed in SEEDS:
        _validate(schema, generate(schema, seed=seed))


@pytest.mark.parametrize(
    ("name", "schema"), [(n, s) for n, s, v in CORPUS if v], ids=[c[0] for c in CORPUS if c[2]]
)
def test_seeds_vary_the_output(name: str, schema: Any) -> None:
    """Different seeds give different values wherever the schema leaves room."""
    values = {json.dumps(generate(schema, seed=seed), sort_keys=True) for seed in SEEDS}
    assert len(values) > 1


def test_same_seed_same_value() -> None:
    """Generation is a pure function of (schema, seed)."""
    for _, schema, _ in CORPUS:
        assert generate(schema, seed=5) == generate(schema, seed=5)


def test_values_are_stable_across_processes() -> None:
    """No hash() randomisation: another interpreter with another hash seed gives the same value."""
    schema = CORPUS[1][1]
    code = (
        "import json, sys\n"
        "from osmosis_rollout.testing._sampling.schema_instances import generate\n"
        "print(json.dumps(generate(json.loads(sys.argv[1]), seed=11), sort_keys=True))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(schema)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        timeout=60,
    )
    assert json.loads(out.stdout) == generate(schema, seed=11)


def test_recursion_terminates_with_depth() -> None:
    """A recursive $ref tree ends: deep levels get only required properties."""
    depths = []
    for seed in SEEDS:
        value = generate(TREE, seed=seed)
        depth, level = 0, [value]
        while level:
            depth += 1
            level = [c for node in level for c in node.get("children", [])]
        depths.append(depth)
    assert max(depths) > 1
    assert max(depths) <= 8


def test_recursive_union_prefers_the_branch_that_ends() -> None:
    """A linked list written as anyOf[null, $ref] still has a finite instance."""
    schema = {
        "$defs": {
            "list": {
                "type": "object",
                "properties": {"head": {"type": "integer"}, "tail": {"$ref": "#/$defs/maybe"}},
                "required": ["head", "tail"],
            },
            "maybe": {"anyOf": [{"$ref": "#/$defs/list"}, {"type": "null"}]},
        },
        "$ref": "#/$defs/list",
    }
    for seed in SEEDS:
        _validate(schema, generate(schema, seed=seed))


def test_default_is_sometimes_used() -> None:
    """A valid `default` is one of the values seeds produce."""
    schema = {"type": "integer", "minimum": 0, "maximum": 1000, "default": 123}
    assert 123 in {generate(schema, seed=seed) for seed in range(40)}


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": "integer", "minimum": 5, "maximum": 4}, "no integer lies within the bounds"),
        ({"type": "number", "exclusiveMinimum": 1, "maximum": 1}, "no number lies within"),
        ({"type": "string", "minLength": 5, "maxLength": 2}, "minLength 5 <= maxLength 2"),
        ({"type": "integer", "enum": ["a", "b"]}, "no value of the enum"),
        ({"$ref": "https://example.com/schema.json"}, "is not local"),
        ({"$ref": "#/$defs/missing"}, "points to nothing"),
        ({"type": "string", "pattern": "(?=abc)x"}, "lookaround"),
        ({"type": "string", "pattern": r"(a)\1"}, "does not support"),
        (False, "allows no value"),
        (
            {"type": "object", "required": ["x"], "additionalProperties": False},
            "additionalProperties is false",
        ),
        (
            {"type": "array", "items": {"enum": [1, 2]}, "minItems": 3, "uniqueItems": True},
            "distinct items",
        ),
        ({"type": 5}, "not a valid JSON Schema"),
        ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "nothing in common"),
        (
            {"oneOf": [{"type": "integer"}, {"type": "integer", "maximum": 9}], "maximum": 5},
            "oneOf",
        ),
    ],
)
def test_unsatisfiable_schemas_raise_clear_errors(schema: Any, expected: str) -> None:
    """Schemas without a buildable value raise UnsatisfiableSchemaError saying why."""
    with pytest.raises(UnsatisfiableSchemaError, match=r"^(cannot generate|not a valid)") as info:
        generate(schema)
    assert expected in str(info.value)


# -- property-based: random satisfiable schemas ----------------------------------------------


def _leaves() -> st.SearchStrategy[dict[str, Any]]:
    integers = st.builds(
        lambda lo, width, step: {
            "type": "integer",
            "minimum": lo,
            "maximum": lo + width,
            **({"multipleOf": step} if step else {}),
        },
        st.integers(-50, 50),
        st.integers(10, 100),
        st.sampled_from([0, 1, 2, 3, 5]),
    )
    numbers = st.builds(
        lambda lo, width, exclusive: {
            "type": "number",
            ("exclusiveMinimum" if exclusive else "minimum"): lo,
            ("exclusiveMaximum" if exclusive else "maximum"): lo + width,
        },
        st.floats(-1e3, 1e3, allow_nan=False),
        st.floats(0.5, 1e3),
        st.booleans(),
    )
    strings = st.builds(
        lambda lo, extra, fmt: {
            "type": "string",
            "minLength": lo,
            "maxLength": lo + extra + (40 if fmt else 0),
            **({"format": fmt} if fmt else {}),
        },
        st.integers(0, 5),
        st.integers(0, 10),
        st.sampled_from([None, "date", "email", "uuid"]),
    )
    enums = st.lists(
        st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5)),
        min_size=1,
        max_size=4,
    ).map(lambda values: {"enum": values})
    return st.one_of(
        integers, numbers, strings, enums, st.just({"type": "boolean"}), st.just({"type": "null"})
    )


def _containers(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    objects = st.dictionaries(st.sampled_from(list("abcdef")), children, max_size=4).flatmap(
        lambda props: st.builds(
            lambda required: {"type": "object", "properties": props, "required": required},
            st.lists(st.sampled_from(sorted(props)), unique=True) if props else st.just([]),
        )
    )
    arrays = st.builds(
        lambda items, lo, extra: {
            "type": "array",
            "items": items,
            "minItems": lo,
            "maxItems": lo + extra,
        },
        children,
        st.integers(0, 2),
        st.integers(0, 3),
    )
    unions: st.SearchStrategy[dict[str, Any]] = st.builds(
        lambda kind, branches: {kind: branches},
        st.sampled_from(["anyOf", "allOf"]),
        st.lists(children, min_size=1, max_size=3),
    )
    return st.one_of(objects, arrays, unions.filter(_satisfiable_union))


def _satisfiable_union(schema: dict[str, Any]) -> bool:
    # allOf of unrelated leaves is usually a contradiction; keep allOf only for one branch.
    return "anyOf" in schema or len(schema["allOf"]) == 1


SCHEMAS = st.recursive(_leaves(), _containers, max_leaves=12)


@settings(max_examples=150, deadline=None)
@given(schema=SCHEMAS, seed=st.integers(0, 2**32))
def test_random_satisfiable_schemas_validate(schema: dict[str, Any], seed: int) -> None:
    """Any schema from a grammar of satisfiable schemas gets a valid instance for any seed."""
    _validate(schema, generate(schema, seed=seed))


@settings(max_examples=60, deadline=None)
@given(
    pattern=st.sampled_from(
        [
            r"^\d{3}-\d{4}$",
            r"^[A-Z][a-z]+$",
            r"^(foo|bar)+$",
            r"^\w+@\w+\.com$",
            r"^#[0-9a-fA-F]{6}$",
            r"^x?y*z+$",
            r"^\S+\s\S+$",
            r"^[^\s]{2,4}\.[a-z]{2}$",
            r"^v\d+(\.\d+){2}(-rc\d)?$",
            r"^\[\d\]$",
        ]
    ),
    seed=st.integers(0, 10_000),
)
def test_simple_patterns_are_matched(pattern: str, seed: int) -> None:
    """Strings for simple regular expressions match them (JSON Schema's search semantics)."""
    schema = {"type": "string", "pattern": pattern}
    _validate(schema, generate(schema, seed=seed))


def test_pattern_with_an_upper_bound_only_quantifier() -> None:
    """``{,n}`` means 0 to n (as Python's re reads it, which jsonschema uses)."""
    schema = {"type": "string", "pattern": "^a{,3}b$"}
    values = {generate(schema, seed=seed) for seed in range(20)}
    assert all(re.fullmatch(r"a{0,3}b", v) for v in values)
    assert len(values) > 1
