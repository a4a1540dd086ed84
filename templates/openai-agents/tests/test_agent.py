"""Run __CLASS__ through a mock TrainGate: the real protocol, in process, offline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from osmosis_rollout.testing import Harness, MockLLMBackend, ScriptedBackend

from __PACKAGE__.agent import __CLASS__
from __PACKAGE__.reward import score

pytestmark = pytest.mark.anyio

DATASET = Path(__file__).parents[1] / "dataset.jsonl"
QUESTION = [
    {"role": "system", "content": "Use the tools, then answer with the number only."},
    {"role": "user", "content": "What is 6 * 7?"},
]


def call(name: str, **arguments: float) -> dict[str, Any]:
    """An assistant message that calls one tool, as the model would send it."""
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {"tool_calls": [{"id": "call_1", "type": "function", "function": function}]}


async def test_calls_a_tool_then_scores_the_answer() -> None:
    """The tool's result goes back to the model and a correct answer earns reward 1.0."""
    backend = ScriptedBackend([call("multiply", a=6, b=7), {"content": "42"}])
    async with Harness(__CLASS__(), backend=backend) as harness:
        outcome = await harness.run(QUESTION, metadata={"ground_truth": "42"})

    result = outcome.result
    assert result is not None
    assert result.status == "COMPLETED"
    assert result.reward == 1.0
    assert outcome.findings == []
    tool_reply = result.final_messages[3]
    assert tool_reply["role"] == "tool"
    assert float(tool_reply["content"]) == 42.0


async def test_wrong_answer_earns_nothing() -> None:
    """A wrong final number completes the rollout with reward 0.0."""
    backend = ScriptedBackend([{"content": "41"}])
    async with Harness(__CLASS__(), backend=backend) as harness:
        outcome = await harness.run(QUESTION, metadata={"ground_truth": "42"})

    assert outcome.result is not None
    assert outcome.result.status == "COMPLETED"
    assert outcome.result.reward == 0.0


async def test_stops_at_the_turn_budget() -> None:
    """A model that never stops calling tools ends with finish_reason max_turns."""
    backend = ScriptedBackend([call("add", a=1, b=1)] * 5)
    async with Harness(__CLASS__(), backend=backend) as harness:
        outcome = await harness.run(QUESTION, metadata={"ground_truth": "42"}, max_turns=2)

    assert outcome.result is not None
    assert outcome.result.finish_reason == "max_turns"
    assert outcome.result.reward == 0.0


async def test_every_dataset_row_completes_with_the_mock_llm() -> None:
    """Each row of dataset.jsonl completes without protocol findings and gets a reward."""
    rows = [json.loads(line) for line in DATASET.read_text().splitlines() if line.strip()]
    async with Harness(__CLASS__(), backend=MockLLMBackend(seed=0)) as harness:
        for row in rows:
            messages = [
                {"role": "system", "content": row["system_prompt"]},
                {"role": "user", "content": row["user_prompt"]},
            ]
            outcome = await harness.run(messages, metadata={"ground_truth": row["ground_truth"]})
            assert outcome.result is not None
            assert outcome.result.status == "COMPLETED", outcome.result.error_message
            assert outcome.findings == []
            assert outcome.result.reward in (0.0, 1.0)


@pytest.mark.parametrize(
    ("answer", "ground_truth", "expected"),
    [
        ("42", "42", 1.0),
        ("The answer is 42.0", 42, 1.0),
        ("6 * 7 = 42", "42", 1.0),
        ("41", "42", 0.0),
        ("I don't know", "42", 0.0),
        (None, "42", 0.0),
        ("42", None, None),
    ],
)
def test_score(answer: str | None, ground_truth: object, expected: float | None) -> None:
    """The reward compares the answer's last number with the ground truth."""
    assert score(answer, ground_truth) == expected
