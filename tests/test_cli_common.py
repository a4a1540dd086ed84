"""What every command shares (``cli/_common.py``): the async bridge and its interruptions."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
import typer

from osmosis_rollout.cli._common import EXIT_INTERRUPTED, INTERRUPTED_BY, run_async


async def _stopped_by_sigterm() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.sleep(30)  # cancelled by the SIGTERM, which ends the run as Ctrl-C does


async def _interruption() -> str:
    return INTERRUPTED_BY["signal"]


def test_sigterm_ends_a_run_as_ctrl_c_does_and_says_so() -> None:
    """SIGTERM cancels the run (exit 130) and is what the run's summary names."""
    with pytest.raises(typer.Exit) as stopped:
        run_async(_stopped_by_sigterm())
    assert stopped.value.exit_code == EXIT_INTERRUPTED
    assert INTERRUPTED_BY["signal"] == "SIGTERM"


def test_a_second_run_does_not_see_the_first_runs_interruption() -> None:
    """``INTERRUPTED_BY`` is reset as each run starts: after a run stopped by SIGTERM, the
    next run in the same process (tests, a notebook) starts as "Ctrl-C", not "SIGTERM"."""
    with pytest.raises(typer.Exit):
        run_async(_stopped_by_sigterm())
    assert run_async(_interruption()) == "Ctrl-C"
