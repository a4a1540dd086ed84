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
    {"role": "system", "content": "Run Python to solve it, then answer with the number only."},
    {"role": "user", "content": "What is the sum of the integers from 1 to 100?"},
]


def run_code(code: str) -> dict[str, Any]:
    """An assistant message that calls run_python, as the model would send it."""
    function = {"name": "run_python", "arguments": json.dumps({"code": code})}
    return {"tool_calls": [{"id": "call_1", "type": "function", "function": function}]}


@pytest.mark.usefixtures("sandbox")
async def test_runs_the_code_then_scores_the_answer() -> None:
    """The program's output goes back to the model and a correct answer earns reward 1.0."""
    backend = ScriptedBackend([run_code("print(sum(range(101)))"), {"content": "5050"}])
    async with Harness(__CLASS__(), backend=backend) as harness:
        outcome = await harness.run(QUESTION, metadata={"ground_truth": "5050"})

    result = outcome.result
    assert result is not None
    assert result.status == "COMPLETED"
    assert result.reward == 1.0
    assert outcome.findings == []
    tool_reply = result.final_messages[3]
    assert tool_reply["role"] == "tool"
    assert tool_reply["content"].strip() == "5050"


@pytest.mark.usefixtures("sandbox")
async def test_a_hanging_program_does_not_hang_the_rollout() -> None:
    """Code that never ends is killed; the model is told and the rollout still completes."""
    agent = __CLASS__()
    agent.code_timeout_s = 0.3
    backend = ScriptedBackend([run_code("while True: pass"), {"content": "I could not compute it"}])
    async with Harness(agent, backend=backend) as harness:
        outcome = await harness.run(QUESTION, metadata={"ground_truth": "5050"})

    result = outcome.result
    assert result is not None
    assert result.status == "COMPLETED"
    assert result.reward == 0.0
    assert "time limit" in result.final_messages[3]["content"]


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
    [("5050", "5050", 1.0), ("The sum is 5050.", 5050, 1.0), ("5051", "5050", 0.0)],
)
def test_score(answer: str, ground_truth: object, expected: float) -> None:
    """The reward compares the answer's last number with the ground truth."""
    assert score(answer, ground_truth) == expected
