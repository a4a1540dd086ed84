"""The engine behind ``osmosis test``: datasets, the batch runner, ``--jobs``, cassettes and
recording, replay and the token check, assembled by :func:`run_test`, the command's Python twin::

    import asyncio
    from osmosis_rollout.evaluation import TestOptions, run_test

    report = asyncio.run(run_test(TestOptions(target="agent.py:MyAgent", dataset="rows.jsonl")))

The names load on first use, like ``osmosis_rollout.testing``'s: ``osmosis test --jobs`` imports
``evaluation.parallel`` to start its workers before it imports the rest.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .run import RunObserver, TestOptions, TestReport, run_test
    from .runner import BatchReport, RowInput, RowResult, RunOptions, run_batch, summarise

#: Each public name and the submodule that defines it.
_HOMES = {
    "RunObserver": "run",
    "TestOptions": "run",
    "TestReport": "run",
    "run_test": "run",
    "BatchReport": "runner",
    "RowInput": "runner",
    "RowResult": "runner",
    "RunOptions": "runner",
    "run_batch": "runner",
    "summarise": "runner",
}

__all__ = [
    "BatchReport",
    "RowInput",
    "RowResult",
    "RunObserver",
    "RunOptions",
    "TestOptions",
    "TestReport",
    "run_batch",
    "run_test",
    "summarise",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        # A submodule (``osmosis_rollout.evaluation.runner``...) is an attribute once imported.
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
