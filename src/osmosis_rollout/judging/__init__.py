"""Rewards from a judge model: rubrics, a judge client, group-relative judging, a mock judge.

Part of the grading concept (``grading.py``): call a judge from ``grade()`` and return its
verdict, and the grader phase takes the verdict's score as the reward, each criterion as a
``reward_components`` entry and the judge's time and tokens as ``judge_*`` metrics; a judge that
fails (:class:`~osmosis_rollout.errors.JudgeError`) ends the grader phase as a ``judge_error``,
never as a reward. ``load_judge()`` finds the judge's own settings (arguments,
``OSMOSIS_JUDGE_*``, ``[tool.osmosis.judge]``); ``url = "mock"`` is the built-in mock judge.

Public API: the names of ``__all__``; the submodules are internal (import from the package).
"""

from __future__ import annotations

from typing import Any

from ..destinations import DestinationPolicy
from ..errors import ConfigError
from .client import Judge
from .groups import GroupJudge
from .mock import MockJudge
from .rubric import Criterion, Rubric, load_rubric
from .settings import MOCK_URL, JudgeSettings
from .verdict import CriterionVerdict, Ranking, Verdict

__all__ = [
    "MOCK_URL",
    "Criterion",
    "CriterionVerdict",
    "GroupJudge",
    "Judge",
    "JudgeSettings",
    "MockJudge",
    "Ranking",
    "Rubric",
    "Verdict",
    "load_judge",
    "load_rubric",
]


def load_judge(
    *, destinations: DestinationPolicy | None = None, **settings: Any
) -> Judge | MockJudge:
    """The judge its settings name (``JudgeSettings.resolve``): ``MockJudge`` for
    ``url = "mock"``, else a :class:`Judge`. No URL anywhere is a ``ConfigError``: the trainer's
    chat URL is never used for judging unless it is given as the judge's."""
    resolved = JudgeSettings.resolve(**settings)
    if resolved.url is None:
        raise ConfigError(
            "no judge configured: set url in [tool.osmosis.judge] or OSMOSIS_JUDGE_URL "
            "(an OpenAI-compatible base URL, or 'mock' for the built-in mock judge)"
        )
    if resolved.is_mock:
        return MockJudge()
    return Judge(resolved, destinations=destinations)
