"""The verdict ``osmosis test`` prints for the agent under test: are its trajectories trainable
as they are? A finding that breaks what a trainer relies on (one growing history per rollout,
the tools it was told, one reply per turn, one result) says no; the others (a truncated reply,
a tool call written as text) are worth fixing but leave the trajectory sound. Which is which is
the findings table's ``untrainable`` column (:mod:`osmosis_rollout.findings`)."""

from __future__ import annotations

from collections.abc import Mapping

from ..findings import FINDINGS

__all__ = ["UNTRAINABLE", "untrainable_codes"]

#: Finding codes whose trajectories a trainer cannot use as they are.
UNTRAINABLE = frozenset(kind.code for kind in FINDINGS if kind.untrainable)


def untrainable_codes(findings: Mapping[str, int]) -> list[str]:
    """The codes among ``findings`` (code -> count) that make the verdict "no", sorted."""
    return sorted(code for code in findings if code in UNTRAINABLE)
