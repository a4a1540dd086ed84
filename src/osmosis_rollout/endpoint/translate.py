"""OpenAI chat.completions bodies to and from a ``ctx.chat`` turn.

An agent written for the ``openai`` client sends a whole request body per call; a ``ctx.chat``
turn takes the history and sampling overrides, and TrainGate already knows the tools. This
module splits a body into those parts (keeping what TrainGate cannot carry for the findings)
and writes the turn's reply back the way OpenAI does: one JSON object, or SSE chunks.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from ..protocol import Message
from ..results import CompletionsResult
from ..transport.sse import DONE_EVENT, encode_event

__all__ = [
    "BadRequest",
    "ChatCall",
    "completion_body",
    "error_body",
    "parse_call",
    "sse_events",
]

#: Keys of a request body that are not sampling parameters for ``ctx.chat``. ``model`` is
#: TrainGate's choice: the policy being trained answers, whatever name the agent's code uses.
_NOT_PARAMS = frozenset(
    {"messages", "tools", "tool_choice", "stream", "stream_options", "n", "model", "functions"}
)


class BadRequest(Exception):
    """A body the endpoint cannot run: answered 400 with this message (what to change)."""


@dataclass(slots=True)
class ChatCall:
    """One chat.completions request, split into what a ``ctx.chat`` turn takes and the rest."""

    messages: list[Message]
    params: dict[str, Any]
    model: str
    stream: bool = False
    include_usage: bool = False
    n: int = 1
    tools: list[Any] | None = None
    tool_choice: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


def parse_call(content: bytes) -> ChatCall:
    """Read a request body; :class:`BadRequest` names what is wrong and how to fix it."""
    try:
        body = json.loads(content)
    except ValueError:
        raise BadRequest(
            "the request body is not JSON: send a chat.completions JSON object"
        ) from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object (a chat.completions request)")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("`messages` must be a non-empty list of chat messages")
    if not all(isinstance(m, dict) for m in messages):
        raise BadRequest("each entry of `messages` must be a JSON object (an OpenAI message)")
    n = body.get("n", 1)
    if n is None:
        n = 1
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise BadRequest("`n` must be a positive integer")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise BadRequest("`tools` must be a list of function tools")
    stream = body.get("stream") is True
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    params = {k: v for k, v in body.items() if k not in _NOT_PARAMS}
    model = body.get("model")
    return ChatCall(
        messages=[_plain(m) for m in messages],
        params=params,
        model=model if isinstance(model, str) and model else "default",
        stream=stream,
        include_usage=include_usage,
        n=n,
        tools=tools or None,
        tool_choice=body.get("tool_choice"),
    )


def _plain(message: dict[str, Any]) -> Message:
    """A message as TrainGate tokenises it, without what SDKs add when they echo a reply: null
    fields (``refusal``, ``audio``...), a streamed tool call's ``index``, the empty content a
    stream accumulates beside tool calls. Only these; anything else the agent changed stays,
    for the append-only check to judge."""
    out = {k: v for k, v in message.items() if v is not None}
    calls = out.get("tool_calls")
    if isinstance(calls, list) and calls:
        out["tool_calls"] = [
            {k: v for k, v in c.items() if k != "index" and v is not None}
            if isinstance(c, dict)
            else c
            for c in calls
        ]
        if out.get("content") == "":
            del out["content"]
    return out


def _reply(result: CompletionsResult) -> dict[str, Any]:
    message = dict(result.message)
    message.setdefault("role", "assistant")
    message.setdefault("content", None)
    return message


def _usage(result: CompletionsResult) -> dict[str, int]:
    prompt = int(result.usage.get("prompt_tokens", 0))
    completion = int(result.usage.get("completion_tokens", 0))
    total = int(result.usage.get("total_tokens", 0)) or prompt + completion
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total}


def _head(turn_id: str, model: str) -> dict[str, Any]:
    return {"id": f"chatcmpl-{turn_id}", "created": int(time.time()), "model": model}


def completion_body(result: CompletionsResult, turn_id: str, model: str) -> bytes:
    """The reply as OpenAI's ``chat.completion`` JSON."""
    body = {
        **_head(turn_id, model),
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": _reply(result),
                "finish_reason": result.finish_reason or "stop",
                "logprobs": None,
            }
        ],
        "usage": _usage(result),
    }
    return json.dumps(body, separators=(",", ":")).encode()


def sse_events(
    result: CompletionsResult, turn_id: str, model: str, *, include_usage: bool
) -> bytes:
    """The reply as ``stream: true`` server-sent events: the role, the content, each tool call
    whole, the finish reason, the usage when asked for, then ``[DONE]``.

    The turn has already finished (TrainGate answers whole), so every chunk goes at once."""
    head = {**_head(turn_id, model), "object": "chat.completion.chunk"}
    message = _reply(result)

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        data = {**head, "choices": [choice]}
        return encode_event(data)

    parts = [chunk({"role": "assistant", "content": None if message.get("tool_calls") else ""})]
    if message.get("content"):
        parts.append(chunk({"content": message["content"]}))
    for index, call in enumerate(message.get("tool_calls") or []):
        parts.append(chunk({"tool_calls": [{"index": index, **call}]}))
    parts.append(chunk({}, result.finish_reason or "stop"))
    if include_usage:
        usage = {**head, "choices": [], "usage": _usage(result)}
        parts.append(encode_event(usage))
    parts.append(DONE_EVENT)
    return b"".join(parts)


def error_body(message: str, kind: str, code: str | None = None) -> bytes:
    """OpenAI's error shape, which its client turns into an ``APIStatusError`` with ``message``."""
    return json.dumps({"error": {"message": message, "type": kind, "code": code}}).encode()
