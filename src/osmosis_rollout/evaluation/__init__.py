"""The engine behind ``osmosis test``: datasets, the batch runner, ``--jobs``, cassettes and
recording, replay and the token check, assembled by :func:`run_test`, the command's Python twin::

    import asyncio
    from osmosis_rollout.evaluation import TestOptions, run_test

    report = asyncio.run(run_test(TestOptions(target="agent.py:MyAgent", dataset="rows.jsonl")))

The names load on first use, like ``osmosis_rollout.testing``'s: ``osmosis test --jobs`` imports
``evaluation.parallel`` to start its workers before it imports the rest.

Public API: the names of ``__all__``; the submodules are internal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .reward_checks import RewardCheckOptions, RewardCheckReport, check_rewards
    from .run import RunObserver, TestOptions, TestReport, run_test
    from .runner import BatchReport, RowInput, RowResult, RunOptions, run_batch, summarise

#: Each public name and the submodule that defines it.
_HOMES = {
    "RewardCheckOptions": ".reward_checks",
    "RewardCheckReport": ".reward_checks",
    "check_rewards": ".reward_checks",
    "RunObserver": ".run",
    "TestOptions": ".run",
    "TestReport": ".run",
    "run_test": ".run",
    "BatchReport": ".runner",
    "RowInput": ".runner",
    "RowResult": ".runner",
    "RunOptions": ".runner",
    "run_batch": ".runner",
    "summarise": ".runner",
}

__all__ = [
    "BatchReport",
    "RewardCheckOptions",
    "RewardCheckReport",
    "RowInput",
    "RowResult",
    "RunObserver",
    "RunOptions",
    "TestOptions",
    "TestReport",
    "check_rewards",
    "run_batch",
    "run_test",
    "summarise",
]


__getattr__, __dir__ = lazy_exports(__name__, _HOMES, globals())
