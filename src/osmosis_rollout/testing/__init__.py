"""Test helpers for agent developers: a mock TrainGate, LLM backends and the harness.

Import from here in your own pytest suite::

    from osmosis_rollout.testing import MockTrainGate, ScriptedBackend

The names load on first use: ``osmosis test --jobs`` imports a submodule of this package
before it starts its workers, and must not wait for the whole toolkit to import first.
Datasets, cassettes and replay belong to the engine of ``osmosis test``
(:mod:`osmosis_rollout.evaluation`); their names stay importable from here.

Public API: the names of ``__all__``. The submodules are internal (``_sampling`` most of all).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from ..evaluation.cassette import read_cassette
    from ..evaluation.datasets import DatasetRow, load_dataset
    from ..evaluation.replay import ReplayBackend, ReplayReport
    from .backends import MockLLMBackend, ScriptedBackend
    from .harness import Harness, RolloutOutcome
    from .openai_backend import OpenAICompatibleBackend
    from .records import Finding, LLMBackend, RolloutRecord, completion_from_message
    from .traingate import MockTrainGate

#: Each public name and the module that defines it (relative to ``osmosis_rollout``).
_HOMES = {
    "MockLLMBackend": ".testing.backends",
    "OpenAICompatibleBackend": ".testing.openai_backend",
    "ScriptedBackend": ".testing.backends",
    "read_cassette": ".evaluation.cassette",
    "DatasetRow": ".evaluation.datasets",
    "load_dataset": ".evaluation.datasets",
    "Harness": ".testing.harness",
    "RolloutOutcome": ".testing.harness",
    "ReplayBackend": ".evaluation.replay",
    "ReplayReport": ".evaluation.replay",
    "Finding": ".testing.records",
    "LLMBackend": ".testing.records",
    "MockTrainGate": ".testing.traingate",
    "RolloutRecord": ".testing.records",
    "completion_from_message": ".testing.records",
}

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


__getattr__, __dir__ = lazy_exports(__name__, _HOMES, globals(), anchor="osmosis_rollout")
