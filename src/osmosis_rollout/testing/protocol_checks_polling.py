"""The polling wire's own checks (``docs/protocol-polling.md``): what a polling server can get
wrong that v1's and v2's checks do not cover. A controller on this wire reads the result
itself, so the rules are about reads: statuses only move forward, a finished result reads the
same until its retention ends, a wrong lease is refused, and a lease that runs out ends the
rollout. Each check turns one rule into a finding on the rollout's record.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..findings import (
    LEASE_IGNORED,
    RESULT_CHANGED_AFTER_FINISH,
    RESULT_LOST_AFTER_FINISH,
    REWARD_ON_FAILURE,
    STATUS_REGRESSED,
    WRONG_LEASE_ACCEPTED,
)
from ..protocol import POLLING_STATUS_RANK, TERMINAL_STATUSES, PollingResult

if TYPE_CHECKING:
    from .records import RolloutRecord

__all__ = [
    "check_lease_expiry",
    "check_progress",
    "check_reread",
    "check_result",
    "check_wrong_lease",
]


def check_progress(record: RolloutRecord, previous: str | None, status: str) -> None:
    """One poll's status after the one before it: never an earlier step (queued, running,
    grading, then an end); a controller that sees ``running`` after ``grading`` cannot tell
    which answer to believe."""
    if previous is None:
        return
    if POLLING_STATUS_RANK[status] < POLLING_STATUS_RANK[previous] or (
        previous in TERMINAL_STATUSES and status != previous
    ):
        record.add(
            STATUS_REGRESSED,
            f"a result poll answered {status!r} after an earlier poll had answered "
            f"{previous!r}: a status only moves forward",
        )


def check_result(record: RolloutRecord, result: PollingResult) -> None:
    """A finished result: a reward only with a successful, kept sample."""
    sample = result.sample
    if sample is None or sample.reward is None:
        return
    if result.status != "success":
        why = f"a {result.status!r} result"
    elif sample.remove_sample:
        why = "a sample marked remove_sample"
    else:
        return
    record.add(
        REWARD_ON_FAILURE,
        f"the result carries reward {sample.reward!r} for {why}: a reward is only sent with "
        "a successful, kept sample",
    )


def check_reread(record: RolloutRecord, first: dict[str, Any], code: int, again: Any) -> None:
    """A second read of a finished result, with the same lease: the same body, still there."""
    if code != 200:
        record.add(
            RESULT_LOST_AFTER_FINISH,
            f"a second read of the finished result answered HTTP {code or 'nothing'}: a "
            "result stays readable until its retention ends",
        )
    elif again != first:
        fields = sorted(
            key
            for key in set(first) | set(again if isinstance(again, dict) else {})
            if not isinstance(again, dict) or first.get(key) != again.get(key)
        )
        record.add(
            RESULT_CHANGED_AFTER_FINISH,
            "a second read of the finished result differs from the first"
            + (f" (in {', '.join(fields)})" if fields else ""),
        )


def check_wrong_lease(record: RolloutRecord, code: int) -> None:
    """A read with a token that is not the rollout's lease: refused with 403 (a 404 leaks
    nothing either); an answer, or a poll left waiting, hands one controller's result to
    anyone who names its id."""
    if code not in (403, 404):
        record.add(
            WRONG_LEASE_ACCEPTED,
            f"a result poll with a wrong X-Osmosis-Rollout-Lease was answered HTTP "
            f"{code or '(still waiting)'}, not refused with 403",
        )


def check_lease_expiry(record: RolloutRecord, lease_s: float, status: str, late: int) -> None:
    """After the controller stopped polling for longer than its lease: the rollout is no longer
    in flight, and its agent made no chat call past the lease (``late``: how many it made). A
    ``success`` is fine when it came before the lease ran out (then no call was late)."""
    if status in TERMINAL_STATUSES and not late:
        return
    what = f"still answered {status!r}" if status not in TERMINAL_STATUSES else "went on"
    record.add(
        LEASE_IGNORED,
        f"no poll for longer than the {lease_s:g} s lease, and the rollout {what}"
        + (f" ({late} chat call(s) past the lease)" if late else "")
        + ": a lease that runs out ends the rollout",
    )
