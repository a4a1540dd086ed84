"""``chat_v2``: the v2 chat channel's event-stream reader (the channel itself runs in
tests/test_wire_v2.py against a real controller stand-in)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from osmosis_rollout.chat_v2 import V2ChatChannel, V2Completion, read_event_stream
from osmosis_rollout.client import TrainGateClient
from osmosis_rollout.errors import ProtocolError
from osmosis_rollout.transport import Reply


def _stream(*chunks: Any, tail: str = "data: [DONE]\n\n") -> bytes:
    text = ": ping\n\n" + "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + tail
    return text.encode()


def _delta(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}


def test_content_and_tool_call_deltas_are_joined() -> None:
    """Content pieces are concatenated, tool calls merged by index, usage and the last
    finish_reason kept."""
    body = read_event_stream(
        _stream(
            _delta({"role": "assistant", "content": "Let me "}),
            _delta({"content": "add."}),
            _delta({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "add"}}]}),
            _delta({"tool_calls": [{"index": 0, "function": {"arguments": '{"a":'}}]}),
            _delta({"tool_calls": [{"index": 0, "function": {"arguments": "3}"}}]}, "tool_calls"),
            {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}},
        )
    )
    reply = V2Completion.model_validate(body)
    assert reply.message.content == "Let me add."
    [call] = reply.message.tool_calls or []
    assert (call.id, call.function.name, call.function.arguments) == ("c1", "add", '{"a":3}')
    assert reply.choices[0].finish_reason == "tool_calls"
    assert (reply.usage.prompt_tokens, reply.usage.total_tokens) == (4, 6)


def test_a_reply_without_usage_counts_zero_tokens() -> None:
    """v2 replies may carry no usage at all."""
    reply = V2Completion.model_validate_json(
        json.dumps({"choices": [{"message": {"role": "assistant", "content": "hi"}}]})
    )
    assert reply.usage.total_tokens == 0


@pytest.mark.parametrize(
    "content",
    [
        b'event: error\ndata: {"error": "provider down"}\n\ndata: [DONE]\n\n',
        _stream({"error": {"message": "boom"}}),
        b": ping\n\ndata: [DONE]\n\n",
    ],
)
def test_streamed_errors_and_empty_streams_are_refused(content: bytes) -> None:
    """A failure streamed under HTTP 200, or a stream without a chunk, is not a completion."""
    with pytest.raises(ValueError, match="stream"):
        read_event_stream(content)


@pytest.mark.parametrize(
    ("content_type", "content"),
    [
        ("application/json", b"not json at all"),
        ("application/json", b'{"choices": []}'),
        ("text/event-stream", b'event: error\ndata: {"error": "k-123 down"}\n\n'),
    ],
)
def test_a_reply_that_is_not_a_completion_is_a_protocol_error(
    content_type: str, content: bytes
) -> None:
    """Unreadable JSON, no choice, or a streamed error: one ProtocolError naming the URL, the
    LLM key scrubbed from whatever the reply echoed."""
    channel = V2ChatChannel(TrainGateClient(transport=_Unused()), "http://gate/v1/r", "k-123")
    with pytest.raises(ProtocolError, match="http://gate/v1/r/chat/completions") as caught:
        channel._read(Reply(200, {"content-type": content_type}, content))
    assert "k-123" not in str(caught.value)


class _Unused:
    """A transport the reader never calls."""

    async def post(self, url: str, content: bytes, headers: Any) -> Reply:
        raise AssertionError("not called")

    async def aclose(self) -> None:
        pass
