"""Tool calls written as text: found also when their JSON is broken, with advice that fits."""

from __future__ import annotations

import pytest

from osmosis_rollout.testing import Harness
from osmosis_rollout.testing.text_tool_calls import TAGS, advice, find_text_tool_call

from .openai_stub import OpenAIStub, stub_backend, text
from .support import load_asset

pytestmark = pytest.mark.anyio

HISTORY = load_asset("fnd_history")
QUESTION = [{"role": "user", "content": "What is 4 + 4 + 5?"}]
#: What Qwen2.5-Coder-0.5B wrote through llama.cpp: arithmetic inside the arguments.
BROKEN = '{"name": "add", "arguments": {"a": 4, "b": 4 + 5}}'


@pytest.mark.parametrize(
    ("content", "style", "broken"),
    [
        (BROKEN, "a JSON object", "Expecting ',' delimiter at character 46 of the call, before"),
        (f"```json\n{BROKEN}\n```", "a fenced JSON block", "Expecting ',' delimiter"),
        (f"<tool_call>\n{BROKEN}\n</tool_call>", TAGS, "Expecting ',' delimiter"),
        ("{'name': 'add', 'arguments': {'a': 1}}", "a JSON object", "single quotes"),
        ('<tool_call>\n{"name": "add", "arguments": {"a": 4', TAGS, "was the reply cut off?"),
        ('Sure. {"name": "add", "arguments": {"a": 4, "b": }} done', "a JSON object", "Expecting"),
    ],
)
def test_a_recognisable_call_with_broken_json_is_found_with_what_breaks_it(
    content: str, style: str, broken: str
) -> None:
    """`{"name": <a declared tool>, "arguments":` is a call even when what follows is not JSON."""
    found = find_text_tool_call(content, {"add"})
    assert found is not None
    assert (found.name, found.style) == ("add", style)
    assert found.broken is not None
    assert broken in found.broken


@pytest.mark.parametrize(
    "content",
    [
        '{"name": "multiply", "arguments": {"a": 4 + 5}}',  # not a declared tool
        '{"name": "add"} and {"b": 4 + 5}',  # no arguments after the name
        "add 4 and 4 + 5",
    ],
)
def test_broken_json_that_is_not_a_call_is_nothing(content: str) -> None:
    """Only a declared tool's name followed by its arguments counts."""
    assert find_text_tool_call(content, {"add"}) is None


def test_a_valid_call_has_nothing_broken() -> None:
    """The existing forms still parse, with no complaint."""
    found = find_text_tool_call('{"name": "add", "arguments": {"a": 1}}', {"add"})
    assert found is not None
    assert found.broken is None


def test_the_advice_tells_an_unparsed_call_from_a_format_the_template_does_not_write() -> None:
    """Tags unparsed: the server's parser. Bare JSON where the template expects tags: no flag
    helps, the template must match. Unknown template: both, in that order. Broken: neither."""
    tagged = find_text_tool_call('<tool_call>\n{"name": "add", "arguments": {}}', {"add"})
    bare = find_text_tool_call('{"name": "add", "arguments": {}}', {"add"})
    broken = find_text_tool_call(BROKEN, {"add"})
    assert tagged is not None
    assert bare is not None
    assert broken is not None
    assert "server did not parse it" in advice(tagged)
    assert "--jinja" in advice(tagged)
    known = advice(bare, template_tool_format=TAGS)
    assert "no parser flag helps" in known
    assert "--chat-template-file" in known
    assert "--jinja" not in known
    unknown = advice(bare)
    assert "if the server's tool-call parser is on" in unknown
    assert "--chat-template-file" in unknown
    assert "invalid JSON" in advice(broken)
    assert "--chat-template-file" not in advice(broken)


async def test_a_broken_text_call_fails_the_row_and_says_what_is_broken() -> None:
    """It used to pass silently (PASS, reward 0); now it is a tool_call_in_text finding."""
    stub = OpenAIStub([text(BROKEN), text("13")])
    backend = stub_backend(stub)
    async with backend, Harness(HISTORY.ToolAppendOnlyAgent(), backend=backend) as harness:
        outcome = await harness.run(QUESTION, timeout_s=10)
    (finding,) = outcome.findings
    assert finding.code == "tool_call_in_text"
    assert "call to tool 'add' as text (a JSON object) whose JSON is broken" in finding.message
    assert "before '+ 5}}'" in finding.message
    assert "invalid JSON" in finding.message
