"""The tool calls a harness runs itself, counted from the history it sends back.

A harness or an agent SDK behind the per-rollout endpoint runs its tools in its own code: the
context never sees them run, so ``num_tool_calls``, tool errors and ``tool_always_fails`` would
count none. What it does see is each result coming back, as a ``tool`` message in the next
call's history. :class:`ToolHistory` remembers the tool calls each reply asked for (id, name,
when the reply left) and, in each later call, finds the results that answer them: a call (its
name), whether it failed (as the tool message says: :func:`reads_as_error`) and its latency
(from the reply to the call that carried the result: the tool's time plus the harness's own,
an upper bound). Each result is counted once, however many later histories repeat it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ObservedCall",
    "ToolHistory",
    "call_name",
    "content_text",
    "counts_from_turns",
    "reads_as_error",
]

#: How a tool message's text starts when the tool failed, as harnesses and SDKs write it:
#: v1's ``create_tool_error_result`` ("Error: ..."), a plain "error: ...", and the OpenAI
#: Agents SDK's default ("An error occurred while running the tool. ...").
_ERROR_STARTS = ("error", "an error occurred")
#: The keys of a JSON tool result that say it failed (MCP's ``isError``, a common ``error``).
_ERROR_KEYS = ("error", "is_error", "isError")
#: Tool calls remembered at most (a reply asks for a few; a runaway harness must not grow it).
_MAX_PENDING = 1024


@dataclass(frozen=True, slots=True)
class ObservedCall:
    """One tool call seen answered in the history: its tool, its latency, whether it failed."""

    tool: str
    latency_ms: float
    failed: bool


def call_name(call: Any) -> str | None:
    """The function name of an OpenAI-shaped tool call dict, if it has one."""
    function = call.get("function") if isinstance(call, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) else None


def content_text(content: Any) -> str | None:
    """A message's text: the string, or the text parts of a list joined; None otherwise."""
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return content if isinstance(content, str) else None


def reads_as_error(content: Any) -> bool:
    """Whether a tool message's ``content`` says the tool failed: text starting with "error"
    or "An error occurred" (any case), or a JSON object with a true ``error``, ``is_error``
    or ``isError``. A list of content parts is read by its text parts."""
    text = content_text(content)
    if text is None:
        return False
    stripped = text.lstrip()
    if stripped.lower().startswith(_ERROR_STARTS):
        return True
    if not stripped.startswith("{"):
        return False
    try:
        data = json.loads(stripped)
    except ValueError:
        return False
    return isinstance(data, dict) and any(data.get(key) for key in _ERROR_KEYS)


class ToolHistory:
    """The tool calls replied but not yet seen answered, and how to find their answers."""

    def __init__(self) -> None:
        #: tool call id -> (tool name, perf_counter when the reply that asked for it left)
        self._pending: dict[str, tuple[str, float]] = {}

    def replied(self, tool_calls: Sequence[Any]) -> None:
        """A reply left asking for ``tool_calls`` (OpenAI-shaped dicts)."""
        now = time.perf_counter()
        for call in tool_calls:
            if not isinstance(call, dict) or not isinstance(call.get("id"), str):
                continue
            if len(self._pending) >= _MAX_PENDING:
                self._pending.clear()
            self._pending[call["id"]] = (call_name(call) or "?", now)

    def answered(self, messages: Sequence[Any]) -> list[ObservedCall]:
        """The pending calls that ``messages`` (a call's history) answers, each once."""
        if not self._pending:
            return []
        now = time.perf_counter()
        seen: list[ObservedCall] = []
        for message in messages:
            if not isinstance(message, dict) or message.get("role") != "tool":
                continue
            pending = self._pending.pop(str(message.get("tool_call_id")), None)
            if pending is None:
                continue
            name, asked = pending
            failed = reads_as_error(message.get("content"))
            seen.append(ObservedCall(name, (now - asked) * 1000, failed))
        return seen


def counts_from_turns(
    histories: Sequence[Sequence[Any]],
    asked: Sequence[Sequence[Any]],
    final_messages: Sequence[Any] = (),
) -> dict[str, list[int]]:
    """``[calls, errors, timeouts]`` per tool of a rollout whose server counted none (one we
    did not write: the official SDK's metrics are ``{}``), from what its chat turns carried:
    ``asked[i]``, the tool calls the reply to turn ``i`` asked for (OpenAI-shaped dicts), are
    the calls; the results the later turns' ``histories`` (and the ``final_messages``) bring
    back say which failed. A timeout cannot be told from the history, so it counts as an
    error when the result says so and never as a timeout."""
    history = ToolHistory()
    counts: dict[str, list[int]] = {}

    def answered(messages: Sequence[Any]) -> None:
        for call in history.answered(messages):
            if call.failed:
                counts.setdefault(call.tool, [0, 0, 0])[1] += 1

    for i, calls in enumerate(asked):
        if i > 0 and i < len(histories):
            answered(histories[i])
        history.replied(calls)
        for call in calls:
            counts.setdefault(call_name(call) or "?", [0, 0, 0])[0] += 1
    for later in histories[len(asked) :]:
        answered(later)
    answered(final_messages)
    return counts
