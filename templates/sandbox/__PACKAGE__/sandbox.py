"""Run model-written Python in a bubblewrap sandbox, with limits on time, output and resources.

Each run is a fresh sandbox (see ``bwrap.py`` for what it holds): no network, its own process
and mount namespaces, nothing of this process's environment, files or ``/proc``, rlimits and a
single process (``sandbox_boot.py``). It is killed, with everything in it, when time runs out
or it prints too much. Where bubblewrap is missing or cannot work, the code is not run: the
result says why (``refused``) instead of running it unconfined.

The process that calls ``run_python`` (``osmosis serve``) is made non-dumpable on first use, so
a process of the same user outside the sandbox cannot read its memory or environment either.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import anyio
import anyio.to_thread
from anyio.abc import Process

from .bwrap import Limits, bwrap_command, find_bwrap, prepare_workdir, sandbox_problem

__all__ = ["Limits", "SandboxResult", "make_undumpable", "run_python"]

_log = logging.getLogger(__name__)
_PR_SET_DUMPABLE = 4


@dataclass(frozen=True)
class SandboxResult:
    """What one run produced: the combined stdout/stderr and how the process ended."""

    output: str
    exit_code: int | None
    timed_out: bool = False
    truncated: bool = False
    refused: str | None = None  # why the code was not run at all

    def for_model(self) -> str:
        """The text the model sees as the tool's result."""
        if self.refused:
            return f"[not run: {self.refused}]"
        notes = []
        if self.timed_out:
            notes.append("[killed: the time limit was reached]")
        if self.truncated:
            notes.append("[output truncated]")
        if self.exit_code not in (0, None) and not self.timed_out:
            notes.append(f"[exit code {self.exit_code}]")
        text = self.output if self.output.strip() else "(no output)"
        return "\n".join([text, *notes])


async def run_python(
    code: str,
    *,
    timeout_s: float = 5.0,
    max_output_chars: int = 4000,
    limits: Limits | None = None,
) -> SandboxResult:
    """Run ``code`` in a fresh sandbox; never raises for the code's errors."""
    make_undumpable()
    problem = await anyio.to_thread.run_sync(sandbox_problem)
    bwrap = find_bwrap()
    if problem is not None or bwrap is None:
        reason = problem or "bubblewrap (bwrap) is not installed"
        _log.warning("model code not run: %s", reason)
        return SandboxResult("", None, refused=reason)
    limits = limits or Limits()
    limits = replace(limits, cpu_s=max(limits.cpu_s, math.ceil(timeout_s) + 1))
    limit = max_output_chars * 4  # bytes: a character is at most four in UTF-8
    output = bytearray()
    truncated = False
    with tempfile.TemporaryDirectory(prefix="sandbox-") as workdir:
        prepare_workdir(Path(workdir), code)
        process = await anyio.open_process(
            bwrap_command(bwrap, Path(workdir), limits),
            env={},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # bwrap leads its own process group
        )
        async with process:  # on exit: pipes closed, process reaped
            try:
                with anyio.move_on_after(timeout_s) as deadline:
                    assert process.stdout is not None
                    async for chunk in process.stdout:
                        output += chunk
                        if len(output) > limit:
                            truncated = True
                            break
                    if not truncated:
                        await process.wait()
            finally:  # time is up, too much output, or the rollout was cancelled
                if process.returncode is None:
                    _kill(process)
                await _gone(process)
    text = output.decode("utf-8", errors="replace")
    if len(text) > max_output_chars:
        text, truncated = text[:max_output_chars], True
    exit_code = None if deadline.cancelled_caught else process.returncode
    return SandboxResult(text, exit_code, timed_out=deadline.cancelled_caught, truncated=truncated)


_undumpable = False


def make_undumpable() -> None:
    """``prctl(PR_SET_DUMPABLE, 0)`` on this process, once (Linux): no ptrace, no /proc/PID/mem."""
    global _undumpable
    if _undumpable or sys.platform != "linux":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        _log.warning("prctl(PR_SET_DUMPABLE, 0) failed: %s", os.strerror(ctypes.get_errno()))
        return
    _undumpable = True


async def _gone(process: Process) -> None:
    """Wait (briefly, even when cancelled) until nothing in the sandbox holds its output open.

    The kernel empties the pid namespace once bwrap's init dies, but not instantly: reading to
    the end of the output means every process that could still print is gone.
    """
    assert process.stdout is not None
    with anyio.CancelScope(shield=True), anyio.move_on_after(5):
        try:
            async for _ in process.stdout:
                pass
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass


def _kill(process: Process) -> None:
    # bwrap leads the group; its sandbox's pid 1 dies with it (--die-with-parent), and the
    # kernel then kills every process left in that pid namespace.
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
