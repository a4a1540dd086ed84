"""``osmosis test --record / --replay``: the flag checks and reports of record and replay.

Kept apart from ``cli/test.py`` so the command reads as options -> backend -> run -> report.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape

from ._common import fail

if TYPE_CHECKING:
    from ..evaluation.recording import CassetteRecorder
    from ..evaluation.replay import ReplayBackend
    from ..evaluation.runner import RowResult

#: The options a replay takes from the cassette unless they are given on the command line.
RECORDED_OPTIONS = ("max_turns", "temperature", "max_tokens")


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


def replay_backend(path: Path, mode: str | None, *, sources: bool = False) -> ReplayBackend:
    """Read the cassette (a bad one is a ConfigError with its file and line); ``sources``
    keeps each row's line, for ``--jobs`` workers."""
    from ..evaluation.cassette import read_cassette
    from ..evaluation.replay import ReplayBackend

    cassette = read_cassette(path, sources=sources)
    return ReplayBackend(cassette, mode="lenient" if mode == "lenient" else "strict")


def recorded_settings(
    backend: ReplayBackend, given: dict[str, Any], explicit: set[str]
) -> dict[str, Any]:
    """``max_turns``/``temperature``/``max_tokens`` as recorded, unless given on the command
    line: a replay asks the agent for what the recording asked."""
    options = backend.cassette.header.options
    recorded = {
        "max_turns": options.max_turns,
        "temperature": options.completion_params.get("temperature"),
        "max_tokens": options.completion_params.get("max_tokens"),
    }
    return {key: given[key] if key in explicit else recorded[key] for key in RECORDED_OPTIONS}


def make_recorder(
    path: Path, gate: Any, options: Any, *, agent: str | None, backend: Any, secrets: list[str]
) -> CassetteRecorder:
    """The recorder of one ``--record`` run, writing the header at once."""
    from ..evaluation.recording import CassetteRecorder, describe_llm

    return CassetteRecorder(
        path, gate, options, agent=agent, llm=describe_llm(backend), secrets=secrets
    )


def print_divergences(console: Console, rows: list[RowResult], *, limit: int = 10) -> None:
    """Each ``replay_diverged`` finding with its short diff, after the results table."""
    from ..evaluation.replay import REPLAY_DIVERGED

    shown = 0
    for row in rows:
        for finding in row.findings:
            if finding.code != REPLAY_DIVERGED:
                continue
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


def cassette_note(backend: ReplayBackend) -> str | None:
    """A warning for a cassette whose recording was interrupted."""
    cassette = backend.cassette
    if cassette.complete:
        return None
    return (
        f"{cassette.path} is a partial cassette (its recording was interrupted): replaying "
        f"its {len(cassette.rows)} complete row(s)"
    )
