"""endpoint/tool_history.py: a harness's tool calls read back from the history it sends."""

from __future__ import annotations

import pytest

from osmosis_rollout.endpoint.tool_history import ToolHistory, reads_as_error


@pytest.mark.parametrize(
    ("content", "failed"),
    [
        ("Error: division by zero", True),  # v1's create_tool_error_result
        ("error: give numbers a and b", True),
        ("An error occurred while running the tool. Please try again. Error: x", True),
        ('{"error": "not found"}', True),
        ('{"isError": true, "content": []}', True),
        ([{"type": "text", "text": "ERROR: boom"}], True),
        ("42", False),
        ('{"error": null, "value": 1}', False),
        ("The error bars are small", False),
        (None, False),
    ],
)
def test_a_tool_message_reads_as_an_error_as_it_says(content: object, failed: bool) -> None:
    assert reads_as_error(content) is failed


def test_each_result_is_counted_once_by_its_call_id() -> None:
    history = ToolHistory()
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}
    history.replied([call])
    result = {"role": "tool", "tool_call_id": "c1", "content": "3"}
    messages = [{"role": "user", "content": "1+2"}, {"role": "assistant", "tool_calls": [call]}]
    [seen] = history.answered([*messages, result])
    assert (seen.tool, seen.failed) == ("add", False)
    assert seen.latency_ms >= 0
    assert history.answered([*messages, result]) == []  # the next history repeats it
    assert history.answered([{"role": "tool", "tool_call_id": "other", "content": "x"}]) == []
