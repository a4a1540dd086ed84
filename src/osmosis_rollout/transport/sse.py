"""Chat-completions server-sent events (``stream: true``), read and written in one place.

Every part of the toolkit that meets an event stream meets OpenAI's: ``data: <chunk JSON>``
events ending with ``data: [DONE]``. The v2 chat channel reads a streaming-only endpoint's reply
(protocol v2, U2) and the real-model backend a server that streams; the rollout endpoint and
the mock TrainGate write one. One reader and one writer keep them agreeing on the grammar
(comments, ``event:`` names, the ``[DONE]`` sentinel, ``event: error``).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["DONE_EVENT", "encode_event", "read_event_stream"]

#: The event that ends a chat-completions stream.
DONE_EVENT = b"data: [DONE]\n\n"


def encode_event(data: Any) -> bytes:
    """One ``data:`` event holding ``data`` as compact JSON (one line: JSON escapes newlines)."""
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def read_event_stream(content: bytes) -> dict[str, Any]:
    """Fold a chat-completions event stream into one ``chat.completion`` body.

    Content and tool-call deltas are joined (tool calls by ``index``), the last
    ``finish_reason`` and ``usage`` kept; an ``event: error`` (a failure streamed under
    HTTP 200) is a ``ValueError``.
    """
    text = content.decode("utf-8", "replace")
    head: dict[str, Any] = {}
    parts: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish: str | None = None
    usage: dict[str, Any] | None = None
    role = "assistant"
    event = "message"
    seen = False
    for line in text.splitlines():
        if not line:
            event = "message"
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            event = value
            continue
        if field != "data" or value.strip() == "[DONE]":
            continue
        if event == "error":
            raise ValueError(f"the stream reported an error: {value[:200]}")
        chunk = json.loads(value)
        if not isinstance(chunk, dict):
            continue
        if "error" in chunk:
            raise ValueError("the stream reported an error")
        seen = True
        for key in ("id", "model", "created"):
            if key in chunk:
                head[key] = chunk[key]
        if chunk.get("usage"):
            usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or choice.get("message") or {}
            role = delta.get("role") or role
            if delta.get("content"):
                parts.append(delta["content"])
            for call in delta.get("tool_calls") or []:
                slot = calls.setdefault(
                    int(call.get("index", len(calls))),
                    {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                )
                if call.get("id"):
                    slot["id"] = call["id"]
                function = call.get("function") or {}
                slot["function"]["name"] += function.get("name") or ""
                slot["function"]["arguments"] += function.get("arguments") or ""
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
    if not seen:
        raise ValueError("the event stream held no completion chunk")
    message: dict[str, Any] = {"role": role, "content": "".join(parts) if parts else None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    body: dict[str, Any] = {
        **head,
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }
    if usage is not None:
        body["usage"] = usage
    return body
