"""The REPL's command language: names and aliases, parsing, and hand-written replies for ``edit``.

Pure functions only, so every rule here is testable without a terminal.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ToolError
from ..protocol import Message, OpenAIFunctionToolSchema
from ..tools import parse_arguments, validate_arguments

__all__ = [
    "COMMANDS",
    "Command",
    "CommandSpec",
    "EditedReply",
    "completion_words",
    "parse_command",
    "parse_reply",
]


@dataclass(frozen=True)
class CommandSpec:
    """One command: its long name, the other words that mean it, and its one-line help."""

    name: str
    aliases: tuple[str, ...]
    usage: str
    help: str


COMMANDS: tuple[CommandSpec, ...] = (
    CommandSpec("next", ("n",), "n, next, Enter", "send the reply and run to the next LLM turn"),
    CommandSpec("continue", ("c",), "c, continue", "run this rollout to the end without pausing"),
    CommandSpec("messages", ("m",), "m, messages", "the whole conversation so far, numbered"),
    CommandSpec(
        "show",
        (),
        "show N, m N",
        "message N in full: its whole text and tool-call arguments, nothing cut",
    ),
    CommandSpec("tools", ("t",), "t, tools", "the agent's tools and their schemas"),
    CommandSpec("metrics", (), "metrics", "latency split, tokens and calls so far"),
    CommandSpec(
        "edit",
        ("e",),
        "edit [REPLY]",
        'replace the reply shown: text, or a tool call as JSON {"name": .., "arguments": {..}}',
    ),
    CommandSpec("row", ("r",), "row N", "start a rollout on dataset row N"),
    CommandSpec("new", (), "new [MESSAGE]", "start a rollout from a user message you type"),
    CommandSpec("help", ("h", "?"), "help", "this list"),
    CommandSpec("quit", ("q", "exit"), "q, quit, Ctrl-D", "leave (a running rollout is cancelled)"),
)

_BY_WORD = {word: spec.name for spec in COMMANDS for word in (spec.name, *spec.aliases)}


@dataclass(frozen=True)
class Command:
    """A parsed input line: ``name`` is a long command name, or ``None`` for an unknown word."""

    name: str | None
    arg: str
    word: str


def parse_command(line: str) -> Command:
    """Split a line into a command and its argument; an empty line means ``next``."""
    text = line.strip()
    if not text:
        return Command("next", "", "")
    word, _, arg = text.partition(" ")
    return Command(_BY_WORD.get(word.lower()), arg.strip(), word)


def completion_words() -> list[str]:
    """The words offered by tab completion: every long name."""
    return [spec.name for spec in COMMANDS]


# --------------------------------------------------------------------------------------------
# edit
# --------------------------------------------------------------------------------------------

_PLACEHOLDERS: dict[str, Any] = {
    "string": "text",
    "number": 1,
    "integer": 1,
    "boolean": True,
    "array": [],
    "object": {},
}


def edit_example(tools: Sequence[OpenAIFunctionToolSchema]) -> str:
    """A tool call to show in an ``edit`` error, made from the agent's own first tool (its
    required parameters with a value of their type), so the example can be typed as is."""
    if not tools:
        return "plain text (this agent declares no tools)"
    function = tools[0].function
    schema = function.parameters
    properties = schema.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    required = [r for r in schema.get("required") or [] if isinstance(r, str)]
    arguments: dict[str, Any] = {}
    for name in required or list(properties)[:2]:
        spec = properties.get(name)
        kind = spec.get("type") if isinstance(spec, dict) else None
        arguments[name] = _PLACEHOLDERS.get(kind if isinstance(kind, str) else "", "...")
    return json.dumps({"name": function.name, "arguments": arguments})


@dataclass(frozen=True)
class EditedReply:
    """An assistant message typed by hand, plus warnings that do not stop it being sent."""

    message: Message
    warnings: tuple[str, ...] = ()


def parse_reply(text: str, tools: Sequence[OpenAIFunctionToolSchema], *, turn: int) -> EditedReply:
    """Turn what the user typed into an assistant message.

    Text is sent as the reply's content. Text starting with ``{`` or ``[`` must be one tool call
    ``{"name": ..., "arguments": {...}}`` or a list of them; a malformed one raises
    ``ToolError`` explaining the fix. Unknown tools and arguments that break the tool's schema
    are only warnings: steering the agent into such calls is a legitimate test of how it copes.
    """
    text = text.strip()
    if not text.startswith(("{", "[")):
        return EditedReply({"role": "assistant", "content": text})
    example = edit_example(tools)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ToolError(
            f"the reply is not valid JSON ({exc.msg} at column {exc.colno}); write a tool call "
            f"as {example}, a list of them, or plain text"
        ) from None
    items = data if isinstance(data, list) else [data]
    if not items:
        raise ToolError(f"the list of tool calls is empty; give at least one, e.g. {example}")
    by_name = {tool.name: tool for tool in tools}
    calls: list[dict[str, Any]] = []
    warnings: list[str] = []
    for i, item in enumerate(items):
        where = f"tool call {i + 1}" if len(items) > 1 else "the tool call"
        name, arguments = _call_parts(item, where, example)
        tool = by_name.get(name)
        if tool is None:
            declared = ", ".join(sorted(by_name)) or "none"
            warnings.append(
                f"tool {name!r} is not declared (declared: {declared}); the agent may reject it "
                "(a result whose messages keep the call is an unknown_tool finding)"
            )
        else:
            try:
                validate_arguments(tool, arguments)
            except ToolError as exc:
                warnings.append(str(exc))
        calls.append(
            {
                "id": f"call_edit_{turn}_{i + 1}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        )
    return EditedReply({"role": "assistant", "content": None, "tool_calls": calls}, tuple(warnings))


def _call_parts(item: Any, where: str, example: str) -> tuple[str, dict[str, Any]]:
    if not isinstance(item, dict):
        raise ToolError(f"{where} must be a JSON object like {example}")
    function = item.get("function")
    if isinstance(function, dict):  # the OpenAI shape {"type": "function", "function": {...}}
        item = function
    name = item.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ToolError(f'{where} needs a "name" (a tool name), e.g. {example}')
    raw = item.get("arguments")
    try:
        arguments = parse_arguments(raw, tool_name=name)
    except ToolError as exc:
        raise ToolError(f"{where}: {exc}") from None
    return name, arguments
