"""JSON Schema checks that can neither reach the network nor freeze the server.

A tool's schema may come from someone else (an MCP server, a harness), and ``jsonschema`` as it
ships trusts it twice over: a remote ``$ref`` is fetched with a blocking ``urlopen`` on the
event loop, outside the destination policy (the second security review made a server GET
169.254.169.254 and hang there), and ``pattern`` runs Python's ``re``, which holds the GIL
through a catastrophic backtrack (``^(a+)+$`` against 30 ``a``s and a ``!`` froze the server,
SIGTERM included). Here:

- no reference is ever retrieved: a ``$ref`` to anything the schema does not hold itself is an
  invalid schema, said so by name;
- ``pattern``, ``patternProperties`` and ``additionalProperties`` beside ``patternProperties``
  match with the ``regex`` engine under a time limit per match (:data:`MATCH_TIMEOUT_S`) and
  per check (:func:`match_budget`); a check that runs out raises ``PatternTimeout``, which the
  tool call's check turns into an error for the model, never a stalled loop.

``unevaluatedProperties`` over ``patternProperties`` still matches with ``re`` inside
``jsonschema``; a schema with both is refused (:func:`unsupported`), as tool schemas do not use
them together.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import time
from collections.abc import Iterator, Mapping
from typing import Any

import jsonschema
import regex
from jsonschema.exceptions import ValidationError
from referencing import Registry, Resource
from referencing.exceptions import NoSuchResource

__all__ = [
    "CHECK_BUDGET_S",
    "MATCH_TIMEOUT_S",
    "BoundedValidator",
    "PatternTimeout",
    "bounded_validator",
    "match_budget",
    "unsupported",
]

#: How long one pattern may take to match one string: ample for any sane pattern (microseconds),
#: short enough that a hostile one costs the event loop a blink.
MATCH_TIMEOUT_S = 0.05
#: How long all the matches of one check may take together.
CHECK_BUDGET_S = 0.2


class PatternTimeout(Exception):
    """A pattern that did not finish matching within :data:`MATCH_TIMEOUT_S`."""


def _refuse(uri: str) -> Resource[Any]:
    """The registry's retriever: nothing is ever fetched."""
    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]  # an attrs class: ref= is its field


#: Every validator's registry: the schema's own resources only.
OFFLINE: Registry[Any] = Registry(retrieve=_refuse)  # type: ignore[call-arg]  # attrs field


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str) -> regex.Pattern[str]:
    return regex.compile(pattern)


#: When the matches of the check under way must be done (``time.monotonic()``), if bounded.
_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "osmosis_match_deadline", default=None
)


@contextlib.contextmanager
def match_budget(seconds: float = CHECK_BUDGET_S) -> Iterator[None]:
    """All pattern matches inside share ``seconds``: a thousand slow strings cost no more
    than one (a ``PatternTimeout`` ends the check)."""
    token = _deadline.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _deadline.reset(token)


def _search(pattern: str, text: str) -> bool:
    """Whether ``pattern`` matches somewhere in ``text``, within the time limit (and the
    current check's budget); raises ``PatternTimeout`` past it."""
    limit = MATCH_TIMEOUT_S
    deadline = _deadline.get()
    if deadline is not None:
        limit = min(limit, deadline - time.monotonic())
    try:
        if limit <= 0:
            raise TimeoutError
        return _compiled(pattern).search(text, timeout=limit) is not None
    except TimeoutError:
        raise PatternTimeout(
            f"pattern {pattern[:60]!r} took too long to match; send a shorter or simpler value"
        ) from None


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "string"):
        return
    if not _search(pattern, instance):
        yield ValidationError(f"{instance[:80]!r} does not match {pattern[:60]!r}")


def _pattern_properties(
    validator: Any, patterns: Mapping[str, Any], instance: Any, schema: Any
) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(
    validator: Any, additional: Any, instance: Any, schema: Any
) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras: list[str] = []
    for key in instance:
        if key in properties:
            continue
        if any(_search(pattern, key) for pattern in patterns):
            continue
        extras.append(key)
    if validator.is_type(additional, "object"):
        for key in extras:
            yield from validator.descend(instance[key], additional, path=key)
    elif not additional and extras:
        shown = ", ".join(repr(key[:40]) for key in sorted(extras)[:5])
        yield ValidationError(f"Additional properties are not allowed ({shown} unexpected)")


BoundedValidator: Any = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    {
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties,
    },
)


def unsupported(schema: Any) -> str | None:
    """Why ``schema`` cannot be checked safely here, or None: a ``$ref`` it does not resolve
    itself, or ``unevaluatedProperties`` beside ``patternProperties``."""
    found = _keywords(schema)
    if "unevaluatedProperties" in found and "patternProperties" in found:
        return "unevaluatedProperties beside patternProperties is not supported"
    for ref in _refs(schema):
        if not ref.startswith("#"):
            return f"$ref {ref[:80]!r} points outside the schema; inline it (nothing is fetched)"
    return None


def bounded_validator(schema: Mapping[str, Any]) -> Any:
    """A validator of ``schema`` that fetches nothing and bounds every pattern match."""
    return BoundedValidator(schema, registry=OFFLINE)


def _keywords(schema: Any, depth: int = 0) -> set[str]:
    """Every key used anywhere in ``schema`` (bounded depth)."""
    found: set[str] = set()
    if depth > 64:
        return found
    if isinstance(schema, Mapping):
        found.update(str(key) for key in schema)
        for value in schema.values():
            found |= _keywords(value, depth + 1)
    elif isinstance(schema, list):
        for value in schema:
            found |= _keywords(value, depth + 1)
    return found


def _refs(schema: Any, depth: int = 0) -> Iterator[str]:
    """Every ``$ref`` and ``$dynamicRef`` string in ``schema`` (bounded depth)."""
    if depth > 64:
        return
    if isinstance(schema, Mapping):
        for key, value in schema.items():
            if key in ("$ref", "$dynamicRef") and isinstance(value, str):
                yield value
            else:
                yield from _refs(value, depth + 1)
    elif isinstance(schema, list):
        for value in schema:
            yield from _refs(value, depth + 1)
