"""The append-only rule's message comparison: what a chat template renders alike is the same."""

from __future__ import annotations

from typing import Any

import pytest

from osmosis_rollout.append_only import first_divergence, same_message

CALLS = [{"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{}"}}]


@pytest.mark.parametrize("content", ["", None, "absent"])
@pytest.mark.parametrize("other", ["", None, "absent"])
def test_empty_null_and_absent_content_beside_tool_calls_are_the_same_message(
    content: Any, other: Any
) -> None:
    """llama.cpp sends `"content": ""` beside tool calls, vLLM `null`, our replies nothing: an
    agent rebuilding the reply with any of them sends what the template renders alike."""

    def message(value: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"role": "assistant", "tool_calls": CALLS}
        if value != "absent":
            out["content"] = value
        return out

    assert same_message(message(content), message(other))
    assert first_divergence([message(content)], [message(other), {"role": "tool"}]) is None


def test_text_beside_tool_calls_still_counts() -> None:
    """Only an empty text is nothing: words beside a call are part of the message."""
    with_text = {"role": "assistant", "content": "Let me add.", "tool_calls": CALLS}
    assert not same_message(with_text, {"role": "assistant", "content": "", "tool_calls": CALLS})
    assert not same_message(
        {"role": "assistant", "content": "", "tool_calls": []}, {"role": "assistant"}
    )
