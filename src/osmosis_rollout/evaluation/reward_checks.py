"""Reward checks before training: reference policies over the dataset, and what they expose.

A reward that a do-nothing policy can collect is a leak the trainer will find and exploit. Each
row is run with built-in policies of the mock LLM: ``none`` (answers nothing, calls no tool),
``random`` (schema-valid random tool calls, then an answer) and, for the rows whose
``mock_replies`` column holds gold replies, ``gold`` (those replies). Findings:

- ``reward_leak``: the no-op or random policy scores at least as much as the gold replies on a
  row the gold passes (without gold rows: the no-op scores above the reward's minimum);
- ``reward_constant``: every rollout of every policy got the same reward (with gold rows, or a
  reward above the minimum);
- ``reward_out_of_range`` and ``reward_not_finite``: a reward outside ``reward_range``, or one
  the server refused as NaN or infinite;
- ``gold_fails``: a row whose gold replies do not pass (``reward >= pass_threshold``).

:func:`check_rewards` is the Python twin of ``osmosis validate --reward -d rows.jsonl``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..findings import (
    GOLD_FAILS,
    REWARD_CONSTANT,
    REWARD_LEAK,
    REWARD_NOT_FINITE,
    REWARD_OUT_OF_RANGE,
)
from ..testing.records import Finding

if TYPE_CHECKING:
    from .options import TestOptions

__all__ = ["PolicyRun", "RewardCheckOptions", "RewardCheckReport", "check_rewards"]

#: What each policy is, in the report.
POLICY_NAMES = {
    "none": "no-op (no answer, no tool call)",
    "random": "random (schema-valid random tool calls)",
    "gold": "gold (the rows' mock_replies)",
}
_LISTED = 10


@dataclass(frozen=True)
class RewardCheckOptions:
    """What to check: the agent (``target`` in process, or the server at ``server`` or started
    from ``launch``, as ``osmosis test`` takes them), the rows, the rewards' range and what
    passes. The policies are the mock's chat replies, so they work on any rollout server."""

    target: str | None
    dataset: Path | str
    reward_range: tuple[float, float] = (0.0, 1.0)
    pass_threshold: float = 1.0
    seed: int = 0
    limit: int | None = None
    concurrency: int = 8
    timeout: float = 60.0
    server: str | None = None
    #: A command (or ``LaunchSpec``), started once for the three policies and stopped after.
    launch: Any = None
    #: The wire; None asks a server's ``/health`` (``osmosis test``'s rule).
    protocol: str | None = "v1"
    api_key: str | None = None


@dataclass
class PolicyRun:
    """One policy over the rows: each row's reward (None: none) and error, if any."""

    policy: str
    rewards: dict[int, float | None] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)

    @property
    def mean(self) -> float | None:
        scored = [r for r in self.rewards.values() if r is not None]
        return round(sum(scored) / len(scored), 6) if scored else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "description": POLICY_NAMES[self.policy],
            "rows": len(self.rewards),
            "mean_reward": self.mean,
            "errors": len(self.errors),
        }


@dataclass
class RewardCheckReport:
    """Each policy's run and the findings; exit 1 on any."""

    runs: list[PolicyRun]
    findings: list[Finding]

    @property
    def passed(self) -> bool:
        return not self.findings

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "policies": [run.as_dict() for run in self.runs],
            "findings": [f.as_dict() for f in self.findings],
        }


async def check_rewards(
    options: RewardCheckOptions, say: Callable[[str], None] = lambda _: None
) -> RewardCheckReport:
    """Run each reference policy over the rows and report what the rewards allow; ``say``
    hears which server was launched and which wire it speaks."""
    from .assembly import load_rows
    from .options import TestOptions
    from .served import served

    rows, _ = load_rows(Path(options.dataset), limit=options.limit, offset=0)
    gold_rows = {r.index for r in rows if r.replies is not None}
    base = TestOptions(
        target=options.target,
        dataset=options.dataset,
        limit=options.limit,
        seed=options.seed,
        concurrency=options.concurrency,
        timeout=options.timeout,
        server=options.server,
        launch=options.launch,
        protocol=options.protocol,
        api_key=options.api_key,
    )
    async with served(base, say) as live:
        live = dataclasses.replace(live, launch=None)  # started once, for every policy
        runs = [await _run(live, "none"), await _run(live, "random")]
        if gold_rows:
            gold = await _run(live, "gold")
            gold.rewards = {i: r for i, r in gold.rewards.items() if i in gold_rows}
            gold.errors = {i: e for i, e in gold.errors.items() if i in gold_rows}
            runs.append(gold)
    return RewardCheckReport(runs, findings(runs, options))


async def _run(base: TestOptions, policy: str) -> PolicyRun:
    from .run import run_test

    report = await run_test(
        dataclasses.replace(
            base,
            mock_policy="walk" if policy == "gold" else policy,
            mock_replies=policy == "gold",
        )
    )
    run = PolicyRun(policy)
    for row in report.rows:
        run.rewards[row.index] = row.reward
        if row.status != "COMPLETED":
            run.errors[row.index] = row.error_message or row.status
    return run


def findings(runs: list[PolicyRun], options: RewardCheckOptions) -> list[Finding]:
    """What the policies' rewards say of the reward function."""
    found: list[Finding] = []
    low, high = options.reward_range
    by_policy = {run.policy: run for run in runs}
    gold = by_policy.get("gold")
    for run in runs:
        outside = [i for i, r in run.rewards.items() if r is not None and not low <= r <= high]
        if outside:
            found.append(
                Finding(
                    REWARD_OUT_OF_RANGE,
                    f"the {run.policy} policy got rewards outside [{low:g}, {high:g}] on "
                    f"{_rows(outside)}: {', '.join(f'{run.rewards[i]:g}' for i in outside[:3])}"
                    " (--reward-range MIN,MAX if that range is meant)",
                    details={"policy": run.policy, "rows": outside},
                )
            )
        refused = [i for i, e in run.errors.items() if "reward must be a finite number" in e]
        if refused:
            found.append(
                Finding(
                    REWARD_NOT_FINITE,
                    f"the {run.policy} policy got a NaN or infinite reward on {_rows(refused)} "
                    f"({run.errors[refused[0]]})",
                    details={"policy": run.policy, "rows": refused},
                )
            )
    for policy in ("none", "random"):
        run = by_policy[policy]
        if gold is not None:
            leaked = [
                i
                for i, g in gold.rewards.items()
                if g is not None
                and g >= options.pass_threshold
                and (r := run.rewards.get(i)) is not None
                and r >= g
            ]
            against = "as much as the gold replies"
        else:
            leaked = [
                i for i, r in run.rewards.items() if policy == "none" and r is not None and r > low
            ]
            against = f"above the reward's minimum ({low:g}), with no answer at all"
        if leaked:
            found.append(
                Finding(
                    REWARD_LEAK,
                    f"the {POLICY_NAMES[policy]} policy scores {against} on {_rows(leaked)}: "
                    "a policy that does nothing useful collects the reward, and training "
                    "will find that out; check what the reward pays for an empty or random "
                    "answer",
                    details={"policy": policy, "rows": leaked},
                )
            )
    every = [r for run in runs for r in run.rewards.values() if r is not None]
    # Without gold replies, no-op and random scoring the minimum everywhere is what a sound
    # reward does: constant only counts with gold rows or above the minimum.
    if len(every) >= 2 and len(set(every)) == 1 and (gold is not None or every[0] != low):
        found.append(
            Finding(
                REWARD_CONSTANT,
                f"every rollout of every policy got the reward {every[0]:g}: it does not "
                "depend on what the model does, so there is nothing to learn",
                details={"reward": every[0]},
            )
        )
    if gold is not None:
        failing = [
            i
            for i, g in gold.rewards.items()
            if i in gold.errors or g is None or g < options.pass_threshold
        ]
        if failing:
            first = failing[0]
            why = gold.errors.get(first) or f"reward {gold.rewards[first]}"
            found.append(
                Finding(
                    GOLD_FAILS,
                    f"the gold replies do not pass (reward >= {options.pass_threshold:g}) on "
                    f"{_rows(failing)} (row {first}: {why}): the reward or the gold is wrong",
                    details={"rows": failing},
                )
            )
    return found


def _rows(rows: list[int]) -> str:
    listed = ", ".join(str(r) for r in rows[:_LISTED])
    more = f" and {len(rows) - _LISTED} more" if len(rows) > _LISTED else ""
    return f"{len(rows)} row(s) ({listed}{more})"
