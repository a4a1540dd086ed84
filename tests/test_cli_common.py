"""cli/_common.py: the piped stdout wrapper and the one bridge from the CLI into async code."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
import typer

from osmosis_rollout.cli._common import EXIT_INTERRUPTED, INTERRUPTED_BY, run_async
from osmosis_rollout.errors import ConfigError


@pytest.mark.usefixtures("no_inherited_settings")
def test_the_piped_stdout_wrapper_outlives_a_closed_stream_quietly() -> None:
    """The wrapper may be collected after the stream under it closed (a test runner's capture,
    a closed pipe): that must not raise, or pytest's unraisable hook fails the caller's test."""
    import gc
    import io

    from osmosis_rollout.cli._common import _RstripLines

    target = io.StringIO()
    wrapper = _RstripLines(target)
    wrapper.write("a line  \npending")
    assert target.getvalue() == "a line\n"
    target.close()
    wrapper.flush()  # nothing to write to any more: dropped, not an error
    del wrapper
    gc.collect()


async def _rows_fail_together() -> None:
    raise ExceptionGroup("rows", [ConfigError("server went away"), ConfigError("again")])


async def _mixed_failure() -> None:
    raise ExceptionGroup("rows", [ConfigError("server went away"), RuntimeError("bug")])


def test_run_async_shows_a_group_of_domain_errors_as_the_first_one() -> None:
    """Concurrent rows failing with one domain error reach the CLI as that error, not a group."""
    with pytest.raises(ConfigError, match="server went away"):
        run_async(_rows_fail_together())


def test_run_async_keeps_a_group_with_a_real_bug_intact() -> None:
    """A group that holds anything but domain errors is a bug: it keeps its traceback."""
    with pytest.raises(ExceptionGroup):
        run_async(_mixed_failure())


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
