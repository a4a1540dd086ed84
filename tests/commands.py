"""``osmosis ARGS`` run in-process with Typer's ``CliRunner``, and the check of a usage error."""

from __future__ import annotations

from typing import Any

from typer.testing import CliRunner

from osmosis_rollout.cli import app

runner = CliRunner()


def run_cli(*args: str, env: dict[str, str] | None = None) -> Any:
    """The command's ``Result`` (exit code, stdout and stderr apart)."""
    return runner.invoke(app, list(args), env=env)


def run_cli_text(*args: str) -> tuple[int, str, str]:
    """Exit code, stdout and stderr, on a 200-column terminal (a table row stays one line)."""
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    return result.exit_code, result.stdout, result.stderr


def assert_one_clear_error(result: Any, message: str, *, code: int = 2) -> None:
    """Exit ``code`` with ``message`` on stderr and no traceback anywhere."""
    assert result.exit_code == code, result.stdout + result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stdout + result.stderr
