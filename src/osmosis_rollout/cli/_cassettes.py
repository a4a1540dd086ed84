"""``osmosis test --record / --replay``: the flag checks and reports of record and replay.

Kept apart from ``cli/test.py`` so the command reads as options -> run -> report; the cassettes
themselves are read and written by ``osmosis_rollout.evaluation``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

from ._common import fail

if TYPE_CHECKING:
    from ..evaluation.runner import RowResult


def check_flags(
    *,
    record: Path | None,
    replay: Path | None,
    replay_mode: str | None,
    llm: str,
    llm_url: str | None,
    interactive: bool,
) -> None:
    """Refuse combinations that cannot mean what the user wants."""
    if record is not None and replay is not None:
        fail(
            "give either --record PATH (run a model and keep its replies) or --replay PATH "
            "(serve recorded replies), not both"
        )
    if replay_mode is not None and replay is None:
        fail("--replay-mode works only with --replay PATH")
    if replay_mode is not None and replay_mode not in ("strict", "lenient"):
        fail(f"--replay-mode {replay_mode!r}: choose strict or lenient")
    if replay is not None and (llm_url is not None or llm.lower() != "mock"):
        fail(
            "--replay serves the recorded replies instead of a model: drop --llm/--llm-url",
            hint="osmosis test agent.py:MyAgent --replay runs/cassette.jsonl",
        )
    if record is not None and interactive:
        fail(
            "--record works only in batch mode, not with --interactive",
            hint="record with --dataset, then step through it with -i --replay PATH",
        )


def print_divergences(console: Console, rows: list[RowResult], *, limit: int = 10) -> None:
    """Each ``replay_diverged`` finding with its short diff, after the results table."""
    from ..findings import REPLAY_DIVERGED

    shown = 0
    for row in rows:
        for finding in row.findings:
            if finding.code != REPLAY_DIVERGED or finding.message in (row.error_message or ""):
                continue  # another code, or said already with the row's error
            if shown == limit:
                console.print("[dim]... more divergences in the results (--output FILE)[/]")
                return
            shown += 1
            console.print(f"[yellow]{REPLAY_DIVERGED}[/] {escape(finding.message)}")
            diff = (finding.details or {}).get("diff")
            for line in str(diff or "").splitlines():
                style = "red" if line.startswith("-") else "green" if line.startswith("+") else ""
                console.print(
                    f"  [{style}]{escape(line)}[/]" if style else f"  {escape(line)}",
                    soft_wrap=True,
                )
