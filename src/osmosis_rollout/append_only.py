"""The append-only rule (``protocol.md`` section 3): the history sent to the LLM only grows.

``first_divergence`` finds where a new history stops repeating the last one, comparing messages
the way a chat template renders them (``same_message``). The agent's context and the mock
TrainGate both judge by it. Imports nothing of ours.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["first_divergence", "same_message"]

#: An OpenAI-style chat message (``protocol.Message``).
Message = dict[str, Any]


def first_divergence(previous: list[Message], current: list[Message]) -> int | None:
    """Index of the first message of ``previous`` that ``current`` does not repeat unchanged
    (the append-only rule), or None when ``current`` starts with all of ``previous``.

    "Unchanged" means :func:`same_message`: what a chat template would render is the same.
    """
    for index, expected in enumerate(previous):
        if index >= len(current) or not same_message(current[index], expected):
            return index
    return None


def same_message(a: Any, b: Any) -> bool:
    """Whether two chat messages render alike, so TrainGate would tokenise them the same.

    Differences that vanish in rendering are ignored: key order, a key set to ``null`` versus
    absent (vLLM sends ``"content": null`` beside tool calls; our replies omit it), an empty
    ``content`` beside tool calls (llama.cpp sends ``"content": ""``; templates render ``""``,
    ``null`` and no content alike), and tool-call ``arguments`` that are the same JSON written
    differently (spacing, key order, or an object instead of its JSON text; trainers parse
    arguments before templating).
    """
    return bool(a == b or _comparable(a) == _comparable(b))


def _comparable(message: Any) -> Any:
    if not isinstance(message, dict):
        return message
    out = {k: v for k, v in message.items() if v is not None}
    calls = out.get("tool_calls")
    if isinstance(calls, list):
        out["tool_calls"] = [_comparable_call(call) for call in calls]
        if calls and out.get("content") == "":
            del out["content"]
    return out


def _comparable_call(call: Any) -> Any:
    if not isinstance(call, dict):
        return call
    out = {k: v for k, v in call.items() if v is not None}
    function = out.get("function")
    if isinstance(function, dict):
        function = {k: v for k, v in function.items() if v is not None}
        if "arguments" in function:
            function["arguments"] = _canonical_json(function["arguments"])
        out["function"] = function
    return out


def _canonical_json(arguments: Any) -> Any:
    """``arguments`` as one canonical JSON text (keys sorted, no spaces); unparsable text as is.

    A re-dump, not the parsed value: ``1`` and ``1.0`` or ``true`` and ``1`` render differently.
    """
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return ("text", arguments)
    try:
        return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):
        return ("object", repr(arguments))
