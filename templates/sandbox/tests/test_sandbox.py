"""The sandbox: output, errors, time limit, output limit, a clean environment, and refusing to
run code unconfined. The attacks it stops are in test_sandbox_attacks.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from __PACKAGE__.sandbox import Limits, run_python

pytestmark = pytest.mark.anyio
needs_sandbox = pytest.mark.usefixtures("sandbox")


@needs_sandbox
async def test_returns_what_the_program_printed() -> None:
    """stdout comes back with exit code 0."""
    result = await run_python("print(6 * 7)")
    assert result.output == "42\n"
    assert result.exit_code == 0
    assert result.for_model() == "42\n"


@needs_sandbox
async def test_an_exception_is_output_not_a_crash() -> None:
    """A failing program returns its traceback and exit code for the model to read."""
    result = await run_python("1 / 0")
    assert "ZeroDivisionError" in result.output
    assert result.exit_code == 1
    assert "[exit code 1]" in result.for_model()


@needs_sandbox
async def test_a_program_that_runs_too_long_is_killed() -> None:
    """An endless loop is killed at the time limit and reported as such."""
    result = await run_python("while True: pass", timeout_s=0.3)
    assert result.timed_out
    assert result.exit_code is None
    assert "time limit" in result.for_model()


@needs_sandbox
async def test_output_is_cut_at_the_limit() -> None:
    """Endless printing is stopped and the model sees at most max_output_chars."""
    result = await run_python("while True: print('x' * 100)", max_output_chars=1000)
    assert result.truncated
    assert len(result.output) == 1000
    assert "[output truncated]" in result.for_model()


@needs_sandbox
async def test_the_program_does_not_see_our_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Secrets in this process's environment are not passed to model-written code."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    result = await run_python("import os; print(os.environ.get('OPENAI_API_KEY'))")
    assert result.output == "None\n"


@needs_sandbox
async def test_packages_of_the_servers_virtualenv_import() -> None:
    """The program runs on the server's Python: what is installed beside osmosis-rollout (here
    pydantic, one of its dependencies) imports, read-only."""
    result = await run_python("import pydantic; print(pydantic.__name__)")
    assert result.output == "pydantic\n"


@needs_sandbox
async def test_the_limits_are_the_ones_given() -> None:
    """256 MiB fits the default 512 MiB of address space, not a 128 MiB limit."""
    code = "block = bytearray(256 << 20); print('allocated')"
    assert (await run_python(code)).output == "allocated\n"
    small = await run_python(code, limits=Limits(memory_bytes=128 << 20))
    assert "MemoryError" in small.output


async def test_without_bubblewrap_the_code_is_refused_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No bwrap on PATH: the model is told why, and its program never starts."""
    monkeypatch.setenv("PATH", str(tmp_path))  # a folder without bwrap
    ran = tmp_path / "ran"
    result = await run_python(f"open({str(ran)!r}, 'w').write('unconfined')")
    assert result.refused is not None
    assert "bubblewrap (bwrap) is not installed" in result.refused
    assert result.for_model().startswith("[not run: bubblewrap (bwrap) is not installed")
    assert not ran.exists()
