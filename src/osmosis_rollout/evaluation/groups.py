"""Groups: a row's ``--samples`` rollouts, and what an RL run needs to know of them.

GRPO-style training learns from the spread of rewards within a group (the samples of one
prompt); a group whose samples all score the same gives no signal. Per group this reports the
mean, spread (population standard deviation), min and max reward, and **pass@k** for k = 1..N
with the unbiased estimator ``1 - C(n - c, k) / C(n, k)`` (n samples, c of them passing,
"pass" being ``reward >= pass_threshold``); over the run, the mean of each figure and the share
of no-signal groups, and the same broken down by a metadata column (``--by``).

A rollout without a reward (it failed, or the agent gave none) does not pass, and is left out
of the mean, spread, min and max; a group with no reward at all has None there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .runner import RowResult

__all__ = ["DEFAULT_PASS_THRESHOLD", "Group", "group_rows", "groups_summary", "pass_at_k"]

#: ``--pass-threshold``: a sample passes when its reward is at least this.
DEFAULT_PASS_THRESHOLD = 1.0
#: How many no-signal rows the summary names.
NAMED_ROWS = 20


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one group: the chance that k of its n samples, drawn without
    replacement, hold at least one of its c passing ones."""
    if not 0 < k <= n:
        raise ValueError(f"pass@{k} needs 1 <= k <= n = {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass(frozen=True)
class Group:
    """One row's samples: their rewards (None: no reward) in sample order."""

    row: int
    rewards: tuple[float | None, ...]
    metadata: dict[str, Any]
    threshold: float = DEFAULT_PASS_THRESHOLD

    @property
    def scored(self) -> list[float]:
        return [r for r in self.rewards if r is not None]

    @property
    def passes(self) -> int:
        return sum(1 for r in self.rewards if r is not None and r >= self.threshold)

    @property
    def no_signal(self) -> bool:
        """Every sample got the same reward (or none got one): nothing to learn from."""
        return len(set(self.rewards)) <= 1

    def stats(self) -> dict[str, Any]:
        """The group's figures, as the results file's group line holds them."""
        scored = self.scored
        mean = sum(scored) / len(scored) if scored else None
        spread = (
            math.sqrt(sum((r - mean) ** 2 for r in scored) / len(scored))
            if scored and mean is not None
            else None
        )
        n = len(self.rewards)
        return {
            "row": self.row,
            "samples": n,
            "rewards": list(self.rewards),
            "mean": _round(mean),
            "spread": _round(spread),
            "min": min(scored) if scored else None,
            "max": max(scored) if scored else None,
            "passes": self.passes,
            "pass_at_k": {str(k): _round(pass_at_k(n, self.passes, k)) for k in range(1, n + 1)},
            "no_signal": self.no_signal,
        }


def group_rows(rows: Sequence[RowResult], threshold: float = DEFAULT_PASS_THRESHOLD) -> list[Group]:
    """The rows' results as groups, in row order (a row's samples in sample order)."""
    by_row: dict[int, list[RowResult]] = {}
    for result in rows:
        by_row.setdefault(result.index, []).append(result)
    groups = []
    for row, results in by_row.items():
        results.sort(key=lambda r: r.sample)
        rewards = tuple(r.reward for r in results)
        groups.append(Group(row, rewards, results[0].metadata, threshold))
    return groups


def groups_summary(groups: Sequence[Group], *, samples: int, by: str | None) -> dict[str, Any]:
    """What the summary says of the groups, and per value of the ``by`` column."""
    summary = _figures(groups, samples)
    if by is not None:
        values: dict[str, list[Group]] = {}
        for group in groups:
            value = group.metadata.get(by)
            values.setdefault("(none)" if value is None else str(value), []).append(group)
        summary["by"] = {
            "column": by,
            "values": {value: _figures(part, samples) for value, part in sorted(values.items())},
        }
    return summary


def _figures(groups: Sequence[Group], samples: int) -> dict[str, Any]:
    stats = [g.stats() for g in groups]
    complete = [s for s in stats if s["samples"] == samples]  # an interrupted run's are not
    silent = [g.row for g in groups if g.no_signal]

    def mean_of(key: str) -> float | None:
        values = [s[key] for s in stats if s[key] is not None]
        return _round(sum(values) / len(values)) if values else None

    return {
        "groups": len(groups),
        "samples": samples,
        "pass_threshold": groups[0].threshold if groups else DEFAULT_PASS_THRESHOLD,
        "pass_at_k": {
            str(k): _round(sum(s["pass_at_k"][str(k)] for s in complete) / len(complete))
            if complete
            else None
            for k in range(1, samples + 1)
        },
        "mean_reward": mean_of("mean"),
        "mean_spread": mean_of("spread"),
        "min_reward": min((s["min"] for s in stats if s["min"] is not None), default=None),
        "max_reward": max((s["max"] for s in stats if s["max"] is not None), default=None),
        "no_signal_groups": len(silent),
        "no_signal_share": _round(len(silent) / len(groups)) if groups else None,
        "no_signal_rows": silent[:NAMED_ROWS],
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)
