"""The verdict ``osmosis test`` prints for the agent under test: are its trajectories trainable
as they are? A finding that breaks what a trainer relies on (one growing history per rollout,
the tools it was told, one reply per turn, one result) says no; the others (a truncated reply,
a tool call written as text) are worth fixing but leave the trajectory sound."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["UNTRAINABLE", "untrainable_codes"]

#: Finding codes whose trajectories a trainer cannot use as they are.
UNTRAINABLE = frozenset(
    {
        "history_rewritten",
        "tools_changed",
        "parallel_calls",
        "n_greater_than_one",
        "chat_after_completion",
        "call_after_completion",
        "tools_sent",
        "unknown_tool",
        "duplicate_completion",
        "no_completion",
    }
)


def untrainable_codes(findings: Mapping[str, int]) -> list[str]:
    """The codes among ``findings`` (code -> count) that make the verdict "no", sorted."""
    return sorted(code for code in findings if code in UNTRAINABLE)
