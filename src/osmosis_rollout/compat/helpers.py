"""The legacy tool and message helper functions, for agents that run tool calls by hand.

Our ``Toolbox`` does all of this for functions it knows; these keep legacy agents that call their
own executor working unchanged.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

from ..agent import RolloutContext
from ..errors import ToolArgumentError
from ..protocol import Message
from ..tools.toolbox import execute_tool_calls as _execute_with_toolbox

__all__ = [
    "count_messages_by_role",
    "create_tool_error_result",
    "create_tool_result",
    "execute_tool_calls",
    "get_message_content",
    "get_message_role",
    "get_tool_call_info",
    "is_assistant_message",
    "is_tool_message",
    "is_user_message",
    "normalize_stop",
    "parse_tool_arguments",
    "parse_tool_calls",
    "serialize_tool_result",
]


# -- tool helpers ------------------------------------------------------------------------------


def create_tool_result(tool_call_id: str, content: str) -> Message:
    """The ``"role": "tool"`` message answering one tool call."""
    return {"role": "tool", "content": content, "tool_call_id": tool_call_id}


def create_tool_error_result(tool_call_id: str, error_message: str) -> Message:
    """A tool message reporting a failure to the model: ``"Error: <message>"``."""
    return create_tool_result(tool_call_id, f"Error: {error_message}")


def serialize_tool_result(result: Any) -> str:
    """A tool's return value as message text: strings as they are, numbers via ``str``,
    booleans and everything else as JSON."""
    if isinstance(result, bool):
        return json.dumps(result)
    if isinstance(result, int | float):
        return str(result)
    if isinstance(result, str):
        return result
    return json.dumps(result)


def parse_tool_arguments(arguments: Any) -> dict[str, Any]:
    """A tool call's ``arguments`` (JSON text or a dict) as a dict; ``ToolArgumentError``
    when they are not a JSON object."""
    if isinstance(arguments, dict):
        return arguments
    if not isinstance(arguments, str):
        raise ToolArgumentError(f"Expected str or dict arguments, got {type(arguments).__name__}")
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError as exc:
        raise ToolArgumentError(f"Invalid JSON arguments: {exc}") from None
    if not isinstance(value, dict):
        raise ToolArgumentError(f"Expected dict from JSON, got {type(value).__name__}")
    return value


def get_tool_call_info(tool_call: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """``(id, function name, parsed arguments)`` of an OpenAI tool call dict."""
    call_id = str(tool_call.get("id", "unknown"))
    function = tool_call.get("function") or {}
    name = str(function.get("name") or "")
    try:
        arguments = parse_tool_arguments(function.get("arguments", "{}"))
    except ToolArgumentError as exc:
        raise ToolArgumentError(str(exc), tool_call_id=call_id, tool_name=name) from None
    return call_id, name, arguments


async def execute_tool_calls(
    tool_calls: Sequence[dict[str, Any]] | RolloutContext,
    executor: Callable[[dict[str, Any]], Awaitable[Message]] | Sequence[Any],
    functions: Any = None,
    *,
    timeout_s: float | None = None,
) -> list[Message]:
    """The legacy ``execute_tool_calls(calls, executor)``: ``await executor(call)`` for every call,
    concurrently, results in input order.

    Called as ``execute_tool_calls(ctx, calls, functions)`` it is ours
    (``osmosis_rollout.tools.execute_tool_calls``: argument checks, timeouts, latency on ctx).
    """
    if isinstance(tool_calls, RolloutContext):
        calls = cast(Sequence[dict[str, Any]], executor)
        return await _execute_with_toolbox(tool_calls, calls, functions, timeout_s=timeout_s)
    if not tool_calls:
        return []
    run = cast(Callable[[dict[str, Any]], Awaitable[Message]], executor)
    return list(await asyncio.gather(*(run(call) for call in tool_calls)))


# -- message helpers ---------------------------------------------------------------------------


def parse_tool_calls(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The message's ``tool_calls`` list, or ``[]``."""
    calls = message.get("tool_calls")
    return calls if isinstance(calls, list) else []


def normalize_stop(stop: Any) -> list[str] | None:
    """``stop`` as a list of strings: a string becomes ``[stop]``; None stays None."""
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list):
        return [str(item) for item in stop]
    return None


def get_message_content(message: dict[str, Any]) -> str:
    """The message's text content, or ``""``."""
    content = message.get("content")
    return content if isinstance(content, str) else ""


def get_message_role(message: dict[str, Any]) -> str:
    """The message's role, or ``"unknown"``."""
    role = message.get("role")
    return role if isinstance(role, str) else "unknown"


def is_assistant_message(message: dict[str, Any]) -> bool:
    """True for ``"role": "assistant"``."""
    return get_message_role(message) == "assistant"


def is_tool_message(message: dict[str, Any]) -> bool:
    """True for ``"role": "tool"``."""
    return get_message_role(message) == "tool"


def is_user_message(message: dict[str, Any]) -> bool:
    """True for ``"role": "user"``."""
    return get_message_role(message) == "user"


def count_messages_by_role(messages: Sequence[dict[str, Any]]) -> dict[str, int]:
    """How many messages each role has (a missing role counts as ``"unknown"``)."""
    counts: dict[str, int] = {}
    for message in messages:
        role = get_message_role(message)
        counts[role] = counts.get(role, 0) + 1
    return counts
