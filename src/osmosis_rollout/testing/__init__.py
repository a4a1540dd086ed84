"""Test helpers for agent developers: a mock TrainGate, LLM backends, datasets and a runner.

Import from here in your own pytest suite::

    from osmosis_rollout.testing import MockTrainGate, ScriptedBackend
"""

from .backends import MockLLMBackend, OpenAICompatibleBackend
from .datasets import DatasetRow, load_dataset
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
    "DatasetRow",
    "Finding",
    "Harness",
    "LLMBackend",
    "MockLLMBackend",
    "MockTrainGate",
    "OpenAICompatibleBackend",
    "RolloutOutcome",
    "RolloutRecord",
    "ScriptedBackend",
    "completion_from_message",
    "load_dataset",
]
