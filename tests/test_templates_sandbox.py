"""The sandbox template's project: its own tests, attacks included, run for real in bubblewrap.

tests/test_cli_init.py runs every template's pytest too, but there a missing bwrap only skips
the sandbox's tests; here bwrap is required (CI fails instead of skipping, tests/programs.py)
and no test of the project may skip.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from osmosis_rollout.scaffold import create_project

from .programs import require_program

pytestmark = pytest.mark.slow


def _project(tmp_path: Path) -> Path:
    project = tmp_path / "demo-sandbox"
    create_project(project, name="demo-sandbox", template="sandbox")
    return project


def _pytest(project: Path, *args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-rs", "-W", "error", "-p", "no:cacheprovider", *args],
        cwd=project,
        env=env or {**os.environ, "NO_COLOR": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    return done.stdout


def test_the_projects_tests_run_every_attack_in_the_sandbox(tmp_path: Path) -> None:
    """Keys in /proc, /etc/passwd, a loopback listener, 1 GiB, 50 forks, a setsid grandchild:
    the project's own tests run each in bubblewrap, and none is skipped."""
    require_program("bwrap")
    out = _pytest(_project(tmp_path))
    assert "skipped" not in out
    assert " passed" in out


def test_without_bubblewrap_the_project_refuses_and_says_why(tmp_path: Path) -> None:
    """With no bwrap on PATH, the project's tests pass: the sandbox's skip naming bubblewrap,
    the refusal tested; no model code runs unconfined."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    env = {**os.environ, "NO_COLOR": "1", "PATH": str(bin_dir)}
    out = _pytest(_project(tmp_path), "-v", env=env)
    assert "the sandbox cannot run here: bubblewrap (bwrap) is not installed" in out
    assert "test_without_bubblewrap_the_code_is_refused_not_run PASSED" in out
    assert "test_every_dataset_row_completes_with_the_mock_llm PASSED" in out
