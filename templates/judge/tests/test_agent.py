"""Run __CLASS__ through a mock TrainGate, graded by the mock judge: offline, no model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from osmosis_rollout.judging import MockJudge
from osmosis_rollout.testing import Harness, MockLLMBackend, ScriptedBackend

from __PACKAGE__ import agent
from __PACKAGE__.agent import __CLASS__

pytestmark = pytest.mark.anyio

DATASET = Path(__file__).parents[1] / "dataset.jsonl"
QUESTION = [{"role": "user", "content": "Why does ice float on water?"}]
REFERENCE = "Water expands when it freezes, so ice is less dense than liquid water and floats."


async def test_an_answer_like_the_reference_earns_the_full_reward() -> None:
    """The judge's verdict is the reward; each criterion is a reward component."""
    backend = ScriptedBackend([{"content": REFERENCE}])
    async with Harness(__CLASS__(), backend=backend) as harness:
        outcome = await harness.run(QUESTION, metadata={"ground_truth": REFERENCE})

    result = outcome.result
    assert result is not None
    assert result.status == "COMPLETED", result.error_message
    assert result.reward == 1.0
    assert result.extra_fields["reward_components"] == dict.fromkeys(agent.RUBRIC.names, 1.0)
    assert outcome.findings == []


async def test_an_empty_answer_earns_nothing() -> None:
    """The judge gives an empty answer 0: no reward for saying nothing."""
    async with Harness(__CLASS__(), backend=ScriptedBackend([{"content": ""}])) as harness:
        outcome = await harness.run(QUESTION, metadata={"ground_truth": REFERENCE})

    assert outcome.result is not None
    assert outcome.result.reward == 0.0


async def test_a_failed_judge_is_an_error_not_reward_0(monkeypatch: pytest.MonkeyPatch) -> None:
    """A judge that times out leaves the rollout without a reward, saying why."""
    agent.judge.cache_clear()
    monkeypatch.setattr(agent, "load_judge", lambda **_: MockJudge(fail="timeout"))
    try:
        backend = ScriptedBackend([{"content": REFERENCE}])
        async with Harness(__CLASS__(), backend=backend) as harness:
            outcome = await harness.run(QUESTION, metadata={"ground_truth": REFERENCE})
    finally:
        agent.judge.cache_clear()

    result = outcome.result
    assert result is not None
    assert result.status == "ERROR"
    assert result.reward is None
    assert "JudgeError" in (result.error_message or "")


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
            assert outcome.result.reward is not None
            assert 0.0 <= outcome.result.reward <= 1.0
