"""``results``: the reply dict an agent appends."""

from __future__ import annotations

from osmosis_rollout.protocol import ChatMessage, CompletionsResponse
from osmosis_rollout.results import CompletionsResult, reply_message, without_nulls


def test_a_tool_call_reply_has_content_none() -> None:
    """``content`` is always a key (None beside tool calls), as OpenAI and v1 sent it."""
    message = ChatMessage.model_validate(
        {"tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}]}
    )
    reply = reply_message(message)
    assert reply["content"] is None
    assert list(reply) == ["role", "content", "tool_calls"]


def test_the_reply_keeps_the_nulls_it_was_sent_and_adds_no_others() -> None:
    response = CompletionsResponse.model_validate(
        {
            "choices": [{"message": {"role": "assistant", "content": "hi", "refusal": None}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1},
        }
    )
    message = CompletionsResult.from_response(response).message
    assert message == {"role": "assistant", "content": "hi", "refusal": None}


def test_without_nulls_leaves_out_none_fields_only() -> None:
    message = {"role": "assistant", "content": None, "tool_calls": []}
    assert without_nulls(message) == {"role": "assistant", "tool_calls": []}
    clean = {"role": "user", "content": "hi"}
    assert without_nulls(clean) is clean
