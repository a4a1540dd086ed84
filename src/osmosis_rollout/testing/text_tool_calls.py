"""Spot a tool call that a model wrote as text instead of as a structured ``tool_calls`` entry.

Small models often answer ``{"name": "add", "arguments": {...}}`` (bare, in a fenced JSON
block, or between Hermes/Qwen ``<tool_call>`` tags) in ``content``. When the server's tool-call
parser is off or does not recognise the format, the reply carries no ``tool_calls``: the agent
sees plain text, never runs the tool, and the rollout may still "pass". This module only
recognises such text; the mock TrainGate turns it into a ``tool_call_in_text`` finding.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["TextToolCall", "find_text_tool_call"]

#: Content longer than this is only searched in its first part: the check must stay cheap.
_MAX_CHARS = 20_000
#: At most this many ``{`` positions are tried as the start of an embedded JSON object.
_MAX_OBJECT_STARTS = 50
_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_FENCED = re.compile(r"```[a-zA-Z0-9_-]*\s*\n(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class TextToolCall:
    """A call to a declared tool found in the text, and how it was written (``style``)."""

    name: str
    style: str


def find_text_tool_call(content: Any, tool_names: Collection[str]) -> TextToolCall | None:
    """The first call to one of ``tool_names`` written in ``content``, or None.

    A call is an object with ``name`` plus ``arguments`` or ``parameters`` (or the OpenAI
    ``{"function": {...}}`` shape), alone or in a list. Text that merely mentions a tool's
    name is not a call.
    """
    if not isinstance(content, str) or not tool_names or "{" not in content:
        return None  # every way of writing a call has an object in it: most replies have none
    text = content[:_MAX_CHARS]
    for style, fragment in _fragments(text):
        name = _called_tool(fragment, tool_names)
        if name is not None:
            return TextToolCall(name, style)
    return None


def _fragments(text: str) -> Iterator[tuple[str, Any]]:
    """Candidate JSON values in ``text``, the most explicit way of writing a call first."""
    for match in _TAGGED.finditer(text):
        yield "<tool_call> tags", _loads(match.group(1))
    for match in _FENCED.finditer(text):
        yield "a fenced JSON block", _loads(match.group(1))
    yield "a JSON object", _loads(text.strip())
    decoder = json.JSONDecoder()
    start = text.find("{")
    for _ in range(_MAX_OBJECT_STARTS):
        if start < 0:
            break
        try:
            value, _end = decoder.raw_decode(text, start)
        except ValueError:
            value = None
        yield "a JSON object in the text", value
        start = text.find("{", start + 1)


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _called_tool(value: Any, tool_names: Collection[str]) -> str | None:
    items = value if isinstance(value, list) else [value]
    for item in items:
        if not isinstance(item, dict):
            continue
        function = item.get("function")
        call = function if isinstance(function, dict) else item
        name = call.get("name")
        if name in tool_names and ("arguments" in call or "parameters" in call):
            return str(name)
    return None
