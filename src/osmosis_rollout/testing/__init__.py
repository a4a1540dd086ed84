"""Test helpers for agent developers: a mock TrainGate, LLM backends, datasets and a runner.

Import from here in your own pytest suite::

    from osmosis_rollout.testing import MockTrainGate, ScriptedBackend
"""

from .backends import MockLLMBackend, OpenAICompatibleBackend
from .cassette import read_cassette
from .datasets import DatasetRow, load_dataset
from .harness import Harness, RolloutOutcome
from .replay import ReplayBackend, ReplayReport
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
    "ReplayBackend",
    "ReplayReport",
    "RolloutOutcome",
    "RolloutRecord",
    "ScriptedBackend",
    "completion_from_message",
    "load_dataset",
    "read_cassette",
]
