"""What a dataset row must hold, whatever file it came from: the prompt columns
(``system_prompt`` + ``user_prompt``, or ``messages``), ``ground_truth``, and JSON-able metadata.

Apart from the file readers (``datasets.py``): one set of rules for JSONL, JSON, CSV and Parquet,
each problem a :class:`~osmosis_rollout.errors.DatasetError` naming the row and the column.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from ..errors import DatasetError

__all__ = ["MESSAGE_ROLES", "DatasetRow", "row_from"]

#: Roles a dataset message may have.
MESSAGE_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
#: The column that scripts the mock LLM's replies for a row (docs/evaluating.md).
REPLIES = "mock_replies"
_PROMPT_COLUMNS = ("messages", "user_prompt", "system_prompt")


@dataclass
class DatasetRow:
    """One row, ready to become a rollout's initial ``messages`` and ``metadata``.

    ``index`` is the row's 0-based position in the file; ``offset`` does not renumber it, so
    results can always be traced back to the file (the row a person counts is ``index + 1``).
    """

    index: int
    messages: list[dict[str, Any]]
    ground_truth: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    #: ``mock_replies``: the assistant replies the mock LLM gives this row, in order (kept out
    #: of the metadata the agent sees: they are the answers).
    replies: list[Any] | None = None

    @property
    def number(self) -> int:
        """The 1-based row number, as error messages and people count rows."""
        return self.index + 1


def row_from(number: int, data: Any, where: str) -> DatasetRow:
    at = f" ({where})" if where else ""
    if not isinstance(data, dict):
        raise DatasetError(
            f"must be an object with 'user_prompt' or 'messages', got {_kind(data)}{at}",
            row=number,
        )
    given = {k for k in _PROMPT_COLUMNS if data.get(k) is not None}
    if {"messages", "user_prompt"} <= given:
        raise DatasetError(
            f"gives both 'messages' and 'user_prompt'; keep one of them{at}",
            row=number,
            column="messages",
        )
    if "messages" in given:
        if "system_prompt" in given:
            raise DatasetError(
                f"'system_prompt' cannot be combined with 'messages'; put the system message "
                f"first in 'messages'{at}",
                row=number,
                column="system_prompt",
            )
        messages = _messages(data["messages"], number, at)
    elif "user_prompt" in given:
        messages = []
        if "system_prompt" in given:
            system = _string(data["system_prompt"], "system_prompt", number, at)
            messages.append({"role": "system", "content": system})
        user = _string(data["user_prompt"], "user_prompt", number, at)
        messages.append({"role": "user", "content": user})
    else:
        columns = ", ".join(repr(str(k)) for k in data) or "none"
        raise DatasetError(
            f"needs a 'user_prompt' string or a 'messages' list; its columns are {columns}{at}",
            row=number,
            column="user_prompt",
        )
    ground_truth = _ground_truth(data.get("ground_truth"), number, at)
    metadata = {
        str(key): _jsonable(value, str(key), number, at)
        for key, value in data.items()
        if key not in _PROMPT_COLUMNS and key not in ("ground_truth", REPLIES)
    }
    if ground_truth is not None:
        metadata["ground_truth"] = ground_truth
    replies = _replies(data.get(REPLIES), number, at)
    return DatasetRow(number - 1, messages, ground_truth, metadata, replies)


def _replies(value: Any, number: int, at: str) -> list[Any] | None:
    """A ``mock_replies`` column: a list of replies (or its JSON text, from a CSV file)."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            value = None
    if not isinstance(value, list):
        raise DatasetError(
            f"'{REPLIES}' must be a list of assistant replies (strings, or objects with content "
            f'and tool_calls), e.g. [{{"tool_calls": [{{"name": "add", "arguments": {{"a": 1, '
            f'"b": 2}}}}]}}, "3"]{at}',
            row=number,
            column=REPLIES,
        )
    from ..testing.mock_policy import scripted_message

    for turn, item in enumerate(value):
        try:
            scripted_message(item, turn)
        except ValueError as exc:
            raise DatasetError(
                f"'{REPLIES}' reply {turn + 1}: {exc}{at}", row=number, column=REPLIES
            ) from None
    return list(_jsonable(value, REPLIES, number, at))


def _string(value: Any, column: str, number: int, at: str) -> str:
    if not isinstance(value, str):
        raise DatasetError(f"must be a string, got {_kind(value)}{at}", row=number, column=column)
    if not value.strip():
        raise DatasetError(f"must not be empty{at}", row=number, column=column)
    return value


def _ground_truth(value: Any, number: int, at: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return str(value)
    raise DatasetError(
        f"must be a string (or a number), got {_kind(value)}{at}",
        row=number,
        column="ground_truth",
    )


def _messages(value: Any, number: int, at: str) -> list[dict[str, Any]]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise DatasetError(
                f"is not valid JSON ({exc.msg} at character {exc.pos}){at}",
                row=number,
                column="messages",
            ) from None
    if not isinstance(value, list):
        raise DatasetError(
            f"must be a list of messages, got {_kind(value)}{at}", row=number, column="messages"
        )
    if not value:
        raise DatasetError(f"must not be an empty list{at}", row=number, column="messages")
    messages = []
    for i, message in enumerate(value):
        column = f"messages[{i}]"
        if not isinstance(message, dict):
            raise DatasetError(
                f"must be an object with 'role' and 'content', got {_kind(message)}{at}",
                row=number,
                column=column,
            )
        # Parquet structs carry every field of every message; a None field was not given.
        message = {k: v for k, v in message.items() if v is not None or k == "content"}
        role = message.get("role")
        if role not in MESSAGE_ROLES:
            got = f"got {role!r}" if "role" in message else "but it is missing"
            raise DatasetError(
                f"must be one of {', '.join(sorted(MESSAGE_ROLES))}, {got}{at}",
                row=number,
                column=f"{column}.role",
            )
        content = message.get("content")
        calls_tools = role == "assistant" and bool(message.get("tool_calls"))
        if not (isinstance(content, str | list) or (content is None and calls_tools)):
            got = f"got {_kind(content)}" if "content" in message else "but it is missing"
            raise DatasetError(
                f"must be a string or a list of content parts, {got}{at}",
                row=number,
                column=f"{column}.content",
            )
        messages.append(_jsonable(message, column, number, at))
    return messages


def _jsonable(value: Any, column: str, number: int, at: str) -> Any:
    """Plain JSON for metadata (request metadata must serialise without NaN)."""
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Decimal):
        return float(value) if value.is_finite() else None
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): _jsonable(v, column, number, at) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v, column, number, at) for v in value]
    raise DatasetError(
        f"holds a {type(value).__name__} value, which is not JSON; convert it to a string{at}",
        row=number,
        column=column,
    )


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"a number ({value!r})"
    return names.get(type(value), type(value).__name__)
