"""Spot a tool call that a model wrote as text instead of as a structured ``tool_calls`` entry.

Small models often answer ``{"name": "add", "arguments": {...}}`` (bare, in a fenced JSON
block, or between Hermes/Qwen ``<tool_call>`` tags) in ``content``. When the server's tool-call
parser is off or does not recognise the format, the reply carries no ``tool_calls``: the agent
sees plain text, never runs the tool, and the rollout may still "pass". This module recognises
such text, also when its JSON is broken (``"b": 4 + 5``), and says what to change
(:func:`advice`); the mock TrainGate turns it into a ``tool_call_in_text`` finding.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["TAGS", "TextToolCall", "advice", "find_text_tool_call"]

#: ``TextToolCall.style`` of a call between ``<tool_call>`` tags (the Hermes/Qwen format).
TAGS = "<tool_call> tags"
#: Content longer than this is only searched in its first part: the check must stay cheap.
_MAX_CHARS = 20_000
#: At most this many ``{`` positions are tried as the start of an embedded JSON object.
_MAX_OBJECT_STARTS = 50
_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_FENCED = re.compile(r"```[a-zA-Z0-9_-]*\s*\n(.*?)```", re.DOTALL)
#: The start of something that is recognisably a call, whether or not its JSON is valid.
_CALL_START = re.compile(
    r"""\{\s*(["'])name\1\s*:\s*(["'])(?P<name>[^"'\\]{1,128})\2\s*,\s*"""
    r"""(["'])(?:arguments|parameters)\4\s*:"""
)
_SNIPPET = 24


@dataclass(frozen=True)
class TextToolCall:
    """A call to a declared tool found in the text, and how it was written (``style``).

    ``broken`` says what is wrong when the call is recognisable but its JSON does not parse
    (no parser could run it, whatever the server's flags)."""

    name: str
    style: str
    broken: str | None = None


def find_text_tool_call(content: Any, tool_names: Collection[str]) -> TextToolCall | None:
    """The first call to one of ``tool_names`` written in ``content``, or None.

    A call is an object with ``name`` plus ``arguments`` or ``parameters`` (or the OpenAI
    ``{"function": {...}}`` shape), alone or in a list. Text that merely mentions a tool's
    name is not a call. When no valid call is found, text that starts like one
    (``{"name": "add", "arguments":``) is reported with what breaks its JSON.
    """
    if not isinstance(content, str) or not tool_names or "{" not in content:
        return None  # every way of writing a call has an object in it: most replies have none
    text = content[:_MAX_CHARS]
    for style, fragment in _fragments(text):
        name = _called_tool(fragment, tool_names)
        if name is not None:
            return TextToolCall(name, style)
    return _broken_call(text, tool_names)


def advice(call: TextToolCall, *, template_tool_format: str | None = None) -> str:
    """What to change for ``call``: the server did not parse a call in its template's format,
    or the model writes a format its template does not (then no server flag helps).

    ``template_tool_format`` is what the served chat template renders calls as, when known
    (``TAGS`` from llama.cpp's ``/props``), else None.
    """
    if call.broken is not None:
        return (
            "no parser can run invalid JSON: show a well-formed example call in the system "
            "prompt, sample with --temperature 0, or have the agent answer such a reply with "
            "an error message so the model tries again"
        )
    if call.style == TAGS:
        return (
            "the call is in the <tool_call> format the Hermes/Qwen templates use, so the "
            "server did not parse it: enable its tool-call parser (llama.cpp: --jinja; vLLM: "
            "--enable-auto-tool-choice --tool-call-parser hermes), or parse such text in the "
            "agent"
        )
    serve_template = (
        "serve the model with a chat template whose tool-call rendering matches what it "
        "writes (llama.cpp: --chat-template-file), show the expected format in the system "
        "prompt, or parse such text in the agent (docs/real-models.md)"
    )
    if template_tool_format == TAGS:
        return (
            "the model writes the call without the <tool_call> tags its chat template "
            "expects, so no parser flag helps: " + serve_template
        )
    return (
        "if the server's tool-call parser is on (llama.cpp --jinja, vLLM --tool-call-parser), "
        "the model writes a format its chat template does not (e.g. bare JSON where the "
        "template expects <tool_call> tags): " + serve_template + "; if it is off, enable it"
    )


def _fragments(text: str) -> Iterator[tuple[str, Any]]:
    """Candidate JSON values in ``text``, the most explicit way of writing a call first."""
    for match in _TAGGED.finditer(text):
        yield TAGS, _loads(match.group(1))
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


def _broken_call(text: str, tool_names: Collection[str]) -> TextToolCall | None:
    """A call to a declared tool whose JSON does not parse, with what breaks it."""
    for match in _CALL_START.finditer(text):
        name = match.group("name")
        if name not in tool_names:
            continue
        start = match.start()
        tagged = text.rfind("<tool_call>", 0, start) >= 0
        fenced = text.count("```", 0, start) % 2 == 1
        style = TAGS if tagged else "a fenced JSON block" if fenced else "a JSON object"
        return TextToolCall(name, style, _what_breaks(text, start, match.group(1) == "'"))
    return None


def _what_breaks(text: str, start: int, single_quoted: bool) -> str:
    if single_quoted:
        return "it uses single quotes (a Python dict, not JSON)"
    try:
        json.JSONDecoder().raw_decode(text, start)
    except json.JSONDecodeError as exc:
        rest = text[exc.pos :].rstrip()
        if not rest or rest.startswith(("</tool_call>", "```")):
            return f"it ends before the call is closed ({exc.msg}): was the reply cut off?"
        column = exc.pos - start + 1
        near = rest[:_SNIPPET] + ("..." if len(rest) > _SNIPPET else "")
        return f"{exc.msg} at character {column} of the call, before {near!r}"
    return "it is not valid JSON"  # pragma: no cover - a valid call was found earlier


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
