"""endpoint/tool_history.py: a harness's tool calls read back from the history it sends."""

from __future__ import annotations

import asyncio
import shlex
import sys
from pathlib import Path

import pytest

from osmosis_rollout.endpoint.tool_history import ToolHistory, counts_from_turns, reads_as_error
from osmosis_rollout.evaluation import TestOptions, run_test
from osmosis_rollout.evaluation.launch import LaunchSpec

from .support import ASSETS


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


def _call(call_id: str, name: str) -> dict[str, object]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}


def test_a_servers_turns_give_each_tools_calls_and_the_errors_its_results_read() -> None:
    """Turn 1 asks for ``lookup`` and ``echo``; turn 2's history answers them (``lookup``
    failed); turn 2 asks for ``lookup`` again, answered only in the final messages. A call
    never answered is a call, not an error; a repeated history counts each result once."""
    failed = {"role": "tool", "tool_call_id": "a", "content": "error: no such record"}
    echoed = {"role": "tool", "tool_call_id": "b", "content": "hi"}
    again = {"role": "tool", "tool_call_id": "c", "content": '{"error": "still none"}'}
    user = {"role": "user", "content": "q"}
    histories = [[user], [user, failed, echoed], [user, failed, echoed, again]]
    asked = [[_call("a", "lookup"), _call("b", "echo")], [_call("c", "lookup")], []]
    assert counts_from_turns(histories, asked) == {"lookup": [2, 2, 0], "echo": [1, 0, 0]}
    unanswered = counts_from_turns(histories[:2], asked[:2])
    assert unanswered == {"lookup": [2, 1, 0], "echo": [1, 0, 0]}
    at_the_end = counts_from_turns(histories[:2], asked[:2], final_messages=histories[2])
    assert at_the_end == {"lookup": [2, 2, 0], "echo": [1, 0, 0]}


def test_a_foreign_servers_failing_tool_is_counted_and_found(tmp_path: Path) -> None:
    """A v2 server of nothing but Starlette runs its own tools and counts none in its metrics,
    as the official SDK's workflows do: ``osmosis test --launch`` counts each tool's calls and
    errors from the turns, marks them observed from the history, and finds the tool that
    always fails, saying its results read as errors (not that it raised)."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"user_prompt": "find it"}\n{"user_prompt": "find more"}\n')
    server = ASSETS / "foreign" / "starlette_v2.py"
    options = TestOptions(
        launch=LaunchSpec(shlex.join([sys.executable, str(server), "tools"]), cwd=tmp_path),
        dataset=rows,
        protocol=None,
        conformance=False,
    )
    report = asyncio.run(run_test(options))
    summary = report.summary
    assert (summary["rows"], summary["passed"]) == (2, 2)
    assert summary["tools"]["lookup"]["calls"] == 2
    assert summary["tools"]["lookup"]["errors"] == 2
    assert summary["tools"]["echo"]["calls"] == 2
    assert summary["tools"]["echo"]["errors"] == 0
    assert summary["tool_errors"] == 2
    assert summary["tool_calls_from_history"] == 4
    assert [row.tool_errors for row in report.rows] == [{"lookup": 1}, {"lookup": 1}]
    (always,) = [f for f in summary["run_findings"] if f["code"] == "tool_always_fails"]
    assert always["details"]["tool"] == "lookup"
    assert '(its results read as errors; the first: "error: no such record")' in always["message"]
