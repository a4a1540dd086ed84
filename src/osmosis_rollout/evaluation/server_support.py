"""What a rollout server supports of the wire beyond its rollouts: a run-level verdict.

The mock TrainGate reads each rollout's status after its grader callback and cancels a rollout
past its deadline. A server that keeps no status (osmosis-ai 0.3's ``LocalBackend`` answers
``unknown`` for every id) or whose cancel cancels nothing (it answers no disposition) breaks no
rollout: its rewards are right. Reported on every row, that would fail a correct run for a
property of the server, so those row findings are lifted into one run-level finding each
(``status_unsupported``, ``cancel_unsupported``), which a trainer's operator should know of,
and the rows pass. ``--strict`` keeps them on the rows too, so the run fails. So are two
defects of a server's start answer, each citing the line of docs/protocol-v2.md on its risk:
a ``POST /rollout`` started without a key (``init_without_key``), a ``202`` without the
``rollout_id`` (``init_without_id``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..findings import (
    CANCEL_UNSUPPORTED,
    CANCEL_WRONG,
    INIT_WITHOUT_ID,
    INIT_WITHOUT_KEY,
    STATUS_UNSUPPORTED,
    STATUS_WRONG,
)
from ..testing.records import Finding

if TYPE_CHECKING:
    from .runner import RowResult

__all__ = ["ServerSupport", "server_property"]


def server_property(finding: Finding) -> str | None:
    """The run-level code a row finding stands for, if it shows a property of the server (a
    missing feature, a defect of its start answer) rather than of the rollout."""
    details = finding.details or {}
    if finding.code == STATUS_WRONG and details.get("status") == "unknown":
        return STATUS_UNSUPPORTED
    if finding.code == CANCEL_WRONG and details.get("dispositions") == {}:
        return CANCEL_UNSUPPORTED
    if finding.code in (INIT_WITHOUT_KEY, INIT_WITHOUT_ID):
        return finding.code
    return None


@dataclass
class ServerSupport:
    """Counts, over a run's rows, the rollouts that showed a missing status or cancel."""

    strict: bool = False
    rows: int = 0
    seen: dict[str, list[str]] = field(default_factory=dict)
    #: The first finding of each code (a start answer's finding becomes the run's, counted).
    first: dict[str, Finding] = field(default_factory=dict)

    def take(self, row: RowResult) -> None:
        """Note ``row``'s findings of a missing feature, and (unless strict) drop them from it."""
        self.rows += 1
        kept = []
        for finding in row.findings:
            code = server_property(finding)
            if code is None:
                kept.append(finding)
                continue
            self.seen.setdefault(code, []).append(row.rollout_id)
            self.first.setdefault(code, finding)
            if self.strict:
                kept.append(finding)
        row.findings[:] = kept

    def findings(self) -> list[Finding]:
        """One finding per missing feature, naming how many rollouts showed it."""
        found = []
        if STATUS_UNSUPPORTED in self.seen:
            ids = self.seen[STATUS_UNSUPPORTED]
            found.append(
                Finding(
                    STATUS_UNSUPPORTED,
                    f"GET /rollout/{{id}}/status answered 'unknown' for {len(ids)} of "
                    f"{self.rows} finished rollout(s): the server keeps no status, so a trainer "
                    "that missed a callback cannot learn the rollout's outcome (rows pass; "
                    "--strict fails them)",
                    details={"rollouts": len(ids), "first": ids[0]},
                )
            )
        if CANCEL_UNSUPPORTED in self.seen:
            ids = self.seen[CANCEL_UNSUPPORTED]
            found.append(
                Finding(
                    CANCEL_UNSUPPORTED,
                    f"POST /rollout/cancel answered no disposition for {len(ids)} rollout(s) "
                    "cancelled at their deadline: the server cancels nothing, so a stuck "
                    "rollout keeps its slot (--strict fails the rows)",
                    details={"rollouts": len(ids), "first": ids[0]},
                )
            )
        if INIT_WITHOUT_KEY in self.seen:
            found.append(self._as_run(INIT_WITHOUT_KEY, self.seen[INIT_WITHOUT_KEY]))
        if INIT_WITHOUT_ID in self.seen:
            found.append(self._as_run(INIT_WITHOUT_ID, self.seen[INIT_WITHOUT_ID]))
        return found

    def _as_run(self, code: str, ids: list[str]) -> Finding:
        """A start answer's finding for the run: its first message and how many showed it."""
        first = self.first[code]
        return dataclasses.replace(
            first,
            message=f"{first.message}; {len(ids)} of {self.rows} rollout(s)",
            rollout_id=None,
            turn=None,
            details={"rollouts": len(ids), "first": ids[0]},
        )
