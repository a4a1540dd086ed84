"""Test helpers for agent developers: a mock TrainGate, LLM backends, datasets and a runner.

Import from here in your own pytest suite::

    from osmosis_rollout.testing import MockTrainGate, ScriptedBackend
"""

from .harness import Harness, RolloutOutcome
from .traingate import (
    Finding,
    LLMBackend,
    MockTrainGate,
    RolloutRecord,
    ScriptedBackend,
    completion_from_message,
)

__all__ = [
    "Finding",
    "Harness",
    "LLMBackend",
    "MockTrainGate",
    "RolloutOutcome",
    "RolloutRecord",
    "ScriptedBackend",
    "completion_from_message",
]
