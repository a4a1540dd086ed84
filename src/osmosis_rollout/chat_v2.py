"""``V2ChatChannel``: one rollout's LLM turns on protocol v2 (``docs/protocol-v2.md``).

v2 gives each rollout an OpenAI-compatible base URL: every turn is ``POST
<chat_completions_url>/chat/completions`` with the rollout's LLM key (never the callback key:
D15), the full history, and the agent's tools on every call (v2 declares none at init; the
context adds them and the agent's ``tool_choice`` because this channel ``sends_tools``). The
body has no ``rollout_id`` (the URL routes it) and the model is ``osmosis-rollout`` unless the
agent names one. The reply is JSON or, from a streaming-only endpoint (U2), server-sent events
folded into one completion; ``usage`` may be absent (zeros).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field, ValidationError

from .client import TrainGateClient
from .errors import ProtocolError
from .protocol import (
    CompletionsRequest,
    CompletionsResponse,
    CompletionUsage,
    describe_validation_error,
)
from .redaction import scrub
from .transport import Reply

__all__ = ["V2ChatChannel", "V2Completion", "read_event_stream"]

#: The model name v2 trainers expect when the agent names none (spec section 6).
DEFAULT_MODEL = "osmosis-rollout"


class V2Completion(CompletionsResponse):
    """A v2 chat reply: as v1's, but ``usage`` may be missing."""

    usage: CompletionUsage = Field(default_factory=CompletionUsage)


class V2ChatChannel:
    """One v2 rollout's door to its chat endpoint (the base URL and the LLM key bound in)."""

    #: Tells ``RolloutContext.chat`` to put the tools and ``tool_choice`` in every body.
    sends_tools = True

    def __init__(self, client: TrainGateClient, base_url: str, api_key: str | None) -> None:
        self.client = client
        self.server_url = base_url
        self.url = f"{base_url}/chat/completions"
        self._api_key = api_key

    def __repr__(self) -> str:
        return f"V2ChatChannel(server_url={self.server_url!r})"

    async def chat_completions(
        self, request: CompletionsRequest, *, request_id: str
    ) -> CompletionsResponse:
        """One LLM turn; ``ProtocolError`` when the reply is not a completion."""
        given = request.model_fields_set
        if "model" not in given:
            request.model = DEFAULT_MODEL
        exclude = {"rollout_id"} if "logprobs" in given else {"rollout_id", "logprobs"}
        content = request.__pydantic_serializer__.to_json(
            request, exclude_none=True, exclude=exclude
        )
        reply = await self.client.post(
            self.url, content, api_key=self._api_key, request_id=request_id
        )
        return self._read(reply)

    def _read(self, reply: Reply) -> V2Completion:
        kind = reply.headers.get("content-type", "")
        try:
            if kind.startswith("text/event-stream"):
                return V2Completion.model_validate(read_event_stream(reply.content))
            return V2Completion.model_validate_json(reply.content)
        except ValidationError as exc:
            detail = describe_validation_error(exc)
        except ValueError as exc:  # the stream's JSON, or an error it reported
            detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ProtocolError(
            f"the reply from {self.url} is not a chat completion "
            f"({scrub(detail, self._api_key)}); it needs choices[0].message"
        )


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
