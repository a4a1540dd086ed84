"""Run model-written Python in a subprocess, with a time limit and an output limit.

The child gets a fresh temporary folder as its working directory, an almost empty environment
(so secrets such as API keys in this process's environment are not visible to it), Python's
isolated mode (``-I``: no user site-packages, no ``PYTHON*`` variables), and is killed with its
whole process group when time runs out or it prints too much. This keeps a rollout from hanging
or flooding the context, but it is **not a security boundary**: run untrusted code in a
container or VM (for example, start ``osmosis serve`` inside one).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import anyio
from anyio.abc import Process


@dataclass(frozen=True)
class SandboxResult:
    """What one run produced: the combined stdout/stderr and how the process ended."""

    output: str
    exit_code: int | None
    timed_out: bool = False
    truncated: bool = False

    def for_model(self) -> str:
        """The text the model sees as the tool's result."""
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
    code: str, *, timeout_s: float = 5.0, max_output_chars: int = 4000
) -> SandboxResult:
    """Run ``code`` with this interpreter in a subprocess; never raises for the code's errors."""
    limit = max_output_chars * 4  # bytes: a character is at most four in UTF-8
    output = bytearray()
    truncated = False
    with tempfile.TemporaryDirectory(prefix="sandbox-") as workdir:
        script = Path(workdir) / "main.py"
        script.write_text(code, encoding="utf-8")
        process = await anyio.open_process(
            [sys.executable, "-I", "-X", "utf8", str(script)],
            cwd=workdir,
            env=_child_environment(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, so children die with it
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
    text = output.decode("utf-8", errors="replace")
    if len(text) > max_output_chars:
        text, truncated = text[:max_output_chars], True
    exit_code = None if deadline.cancelled_caught else process.returncode
    return SandboxResult(text, exit_code, timed_out=deadline.cancelled_caught, truncated=truncated)


def _child_environment() -> dict[str, str]:
    env = {"PATH": os.defpath}
    if sys.platform == "win32":  # Python cannot start on Windows without it
        env["SYSTEMROOT"] = os.environ.get("SYSTEMROOT", r"C:\Windows")
    return env


def _kill(process: Process) -> None:
    if sys.platform != "win32":
        try:
            os.killpg(process.pid, signal.SIGKILL)
            return
        except ProcessLookupError:
            return
    process.kill()
