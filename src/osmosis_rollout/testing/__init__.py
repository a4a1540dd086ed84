"""Test helpers for agent developers: a mock TrainGate, LLM backends, datasets and a runner.

Import from here in your own pytest suite::

    from osmosis_rollout.testing import MockTrainGate, ScriptedBackend

The names load on first use: ``osmosis test --jobs`` imports a submodule of this package
before it starts its workers, and must not wait for the whole toolkit to import first.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

#: Each public name and the submodule that defines it.
_HOMES = {
    "MockLLMBackend": "backends",
    "OpenAICompatibleBackend": "backends",
    "read_cassette": "cassette",
    "DatasetRow": "datasets",
    "load_dataset": "datasets",
    "Harness": "harness",
    "RolloutOutcome": "harness",
    "ReplayBackend": "replay",
    "ReplayReport": "replay",
    "Finding": "traingate",
    "LLMBackend": "traingate",
    "MockTrainGate": "traingate",
    "RolloutRecord": "traingate",
    "ScriptedBackend": "traingate",
    "completion_from_message": "traingate",
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


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        # A submodule (``osmosis_rollout.testing.runner``...): an attribute of the package once
        # imported, as it was when the package imported its submodules eagerly.
        if name.isidentifier() and not name.startswith("_"):
            try:
                return importlib.import_module(f".{name}", __name__)
            except ModuleNotFoundError as exc:
                if exc.name != f"{__name__}.{name}":
                    raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value  # the next lookup is a plain module attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
