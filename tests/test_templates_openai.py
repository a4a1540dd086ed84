"""The openai-sdk and openai-agents templates' projects beyond what tests/test_cli_init.py runs
for every template (validate, test, their pytest, ruff): replaying their cassette, stepping
through a rollout with -i, and `osmosis serve` + `osmosis test --server`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from osmosis_rollout.scaffold import create_project

from .processes import clean_env, osmosis_serve

pytest.importorskip("openai")
pytest.importorskip("agents")
pytestmark = pytest.mark.slow

TEMPLATES = ["openai-sdk", "openai-agents"]


def _project(tmp_path: Path, template: str) -> Path:
    project = tmp_path / f"demo-{template}"
    create_project(project, name=f"demo-{template}", template=template)
    return project


def _osmosis(project: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "osmosis_rollout", *args],
        cwd=project,
        env=clean_env(NO_COLOR="1"),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize("template", TEMPLATES)
def test_the_recorded_cassette_replays(tmp_path: Path, template: str) -> None:
    done = _osmosis(
        _project(tmp_path, template), "test", "--replay", "tests/cassettes/recorded.jsonl"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2/2" in done.stdout
    assert "trainable    yes" in done.stdout


@pytest.mark.parametrize("template", TEMPLATES)
def test_step_through_one_rollout_interactively(tmp_path: Path, template: str) -> None:
    project = _project(tmp_path, template)
    done = _osmosis(project, "test", "-i", "-d", "dataset.jsonl", "--row", "1", stdin="n\nc\nq\n")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "turn 1>" in done.stdout
    assert "rollout COMPLETED" in done.stdout
    assert "findings: none" in done.stdout


@pytest.mark.parametrize("template", TEMPLATES)
def test_served_then_tested_with_server(tmp_path: Path, template: str) -> None:
    project = _project(tmp_path, template)
    with osmosis_serve(tmp_path / "serve.log", "--port", "0", cwd=project) as served:
        done = _osmosis(project, "test", "--server", served.url, "-d", "dataset.jsonl")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5/5" in done.stdout


def test_the_agents_sdk_template_reports_its_tool_calls(tmp_path: Path) -> None:
    """The Agents SDK runs the template's tools itself; osmosis test counts them from the
    history each call sends back, and says so."""
    project = _project(tmp_path, "openai-agents")
    done = _osmosis(project, "test", "-d", "dataset.jsonl")
    assert done.returncode == 0, done.stdout + done.stderr
    line = next(line for line in done.stdout.splitlines() if "tool calls" in line)
    count = int(line.split("tool calls", 1)[1].split()[0])
    assert count > 0, line
    assert f"({count} observed from the history)" in line
