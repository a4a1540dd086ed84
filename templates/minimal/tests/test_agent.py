"""Run __CLASS__ through a mock TrainGate: the real protocol, in process, offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from osmosis_rollout.testing import Harness, MockLLMBackend, ScriptedBackend

from __PACKAGE__.agent import __CLASS__, score

pytestmark = pytest.mark.anyio

DATASET = Path(__file__).parents[1] / "dataset.jsonl"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


async def test_correct_answer_earns_reward() -> None:
    """One model call; a correct answer completes the rollout with reward 1.0."""
    backend = ScriptedBackend([{"content": "Paris."}])
    async with Harness(__CLASS__(), backend=backend) as harness:
        outcome = await harness.run(QUESTION, metadata={"ground_truth": "Paris"})

    result = outcome.result
    assert result is not None
    assert result.status == "COMPLETED"
    assert result.reward == 1.0
    assert outcome.findings == []
    assert [m["role"] for m in result.final_messages] == ["user", "assistant"]


async def test_wrong_answer_earns_nothing() -> None:
    """A wrong answer still completes, with reward 0.0."""
    backend = ScriptedBackend([{"content": "Lyon"}])
    async with Harness(__CLASS__(), backend=backend) as harness:
        outcome = await harness.run(QUESTION, metadata={"ground_truth": "Paris"})

    assert outcome.result is not None
    assert outcome.result.status == "COMPLETED"
    assert outcome.result.reward == 0.0


async def test_every_dataset_row_completes_with_the_mock_llm() -> None:
    """Each row of dataset.jsonl completes without protocol findings and gets a reward."""
    rows = [json.loads(line) for line in DATASET.read_text().splitlines() if line.strip()]
    async with Harness(__CLASS__(), backend=MockLLMBackend()) as harness:
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
        ("Paris", "Paris", 1.0),
        ("It is  PARIS.", "paris", 1.0),
        ("Lyon", "Paris", 0.0),
        (None, "Paris", 0.0),
        ("Paris", None, None),
    ],
)
def test_score(answer: str | None, ground_truth: object, expected: float | None) -> None:
    """The reward checks that the answer contains the ground truth."""
    assert score(answer, ground_truth) == expected
