"""Replay the run recorded in tests/cassettes/: offline, no model and no judge needed."""

from __future__ import annotations

from pathlib import Path

import pytest
from osmosis_rollout.testing import ReplayBackend

from __PACKAGE__.agent import __CLASS__

pytestmark = pytest.mark.anyio

CASSETTE = Path(__file__).parent / "cassettes" / "recorded.jsonl"
RECORD_AGAIN = (
    "\nIf you changed what the agent sends on purpose, record the run again:\n"
    "  osmosis test __TARGET__ -d dataset.jsonl --limit 2"
    " --record tests/cassettes/recorded.jsonl"
)


async def test_the_agent_still_behaves_as_recorded() -> None:
    """Every request the agent makes, and every result and reward, match the recording.

    After a deliberate change (a tool, the prompt, the loop), record it again (add --llm-url
    URL --model NAME for your model) and commit the cassette: see RECORD_AGAIN.
    """
    report = await ReplayBackend(CASSETTE).replay(__CLASS__())
    assert report.passed, report.explain() + RECORD_AGAIN
