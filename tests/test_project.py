"""The project around the current folder: ``[tool.osmosis] agent`` for every command, found from
a subfolder, with imports relative to the project root; file targets inside packages."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from osmosis_rollout.cli import app
from osmosis_rollout.errors import ConfigError
from osmosis_rollout.project import find_project
from osmosis_rollout.scaffold import create_project

TERM = {"COLUMNS": "200"}
SUPPORT_AGENT = Path(__file__).parent / "assets" / "docs_sandbox" / "agent.py"


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """tmp_path as the working folder; sys.path, sys.modules and OSMOSIS_* restored after."""
    for name in list(os.environ):
        if name.startswith("OSMOSIS_"):
            monkeypatch.delenv(name)
    monkeypatch.syspath_prepend(str(tmp_path / "unused"))  # snapshots sys.path for undo
    monkeypatch.chdir(tmp_path)
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        del sys.modules[name]


@pytest.fixture
def project(isolated: Path) -> Path:
    """A generated project (minimal template) whose package is osm_proj_agent."""
    root = isolated / "osm-proj-agent"
    create_project(root, name="osm-proj-agent", template="minimal")
    return root


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env=TERM)
    return result.exit_code, result.stdout + result.stderr


def test_validate_without_target_uses_the_configured_agent_from_a_subfolder(
    project: Path,
) -> None:
    """Inside tests/, `osmosis validate` finds pyproject.toml above and imports from the root."""
    os.chdir(project / "tests")
    code, output = invoke("validate")
    assert code == 0, output
    assert "osm-proj-agent" in output


def test_test_without_target_uses_the_configured_agent_from_a_subfolder(project: Path) -> None:
    os.chdir(project / "tests")
    code, output = invoke("test", "-d", "../dataset.jsonl", "--json")
    assert code == 0, output
    assert '"completed"' in output


def test_serve_without_target_imports_from_the_project_root_in_a_subfolder(
    project: Path,
) -> None:
    """The agent loads (the command gets as far as binding the busy port)."""
    os.chdir(project / "tests")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, output = invoke("serve", "--no-validate", "--port", str(port))
    assert code == 2
    assert f"port {port} on 127.0.0.1 is already in use" in output


def test_a_module_target_given_in_a_subfolder_imports_from_the_project_root(
    project: Path,
) -> None:
    os.chdir(project / "tests")
    code, output = invoke("validate", "osm_proj_agent.agent:OsmProjAgent", "--no-dry-run")
    assert code == 0, output


@pytest.mark.parametrize(
    "line", ["from osm_lib_agent.prompts import SYSTEM", "from .prompts import SYSTEM"]
)
def test_a_file_target_inside_a_package_validates(isolated: Path, line: str) -> None:
    """`osmosis validate pkg/agent.py:Class` on a bare package in the current folder, whether the
    file imports its package absolutely (was: "not installed") or relatively (was: "use the
    module form")."""
    package = isolated / "osm_lib_agent"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "prompts.py").write_text('SYSTEM = "Be brief."\n')
    source = (SUPPORT_AGENT).read_text()
    future = "from __future__ import annotations\n"
    (package / "agent.py").write_text(source.replace(future, f"{future}{line}\n", 1))
    # A real process: pytest's own sys.path would hide the bug (it has the working folder on it).
    osmosis = Path(sys.executable).parent / "osmosis"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OSMOSIS_")}
    proc = subprocess.run(
        [str(osmosis), "validate", "osm_lib_agent/agent.py:MyAgent", "--no-dry-run"],
        cwd=isolated,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("command", "hint"),
    [
        (["validate"], "osmosis validate agent.py:MyAgent"),
        (["test", "-d", "rows.jsonl"], "osmosis test agent.py:MyAgent --dataset rows.jsonl"),
        (["serve"], "osmosis serve path/to/agent.py:MyAgent"),
    ],
)
def test_no_target_and_no_project_says_how_to_give_one(
    isolated: Path, command: list[str], hint: str
) -> None:
    code, output = invoke(*command)
    assert code == 2
    assert f"Error: missing TARGET: the agent to {command[0]}" in output
    assert f"{hint}  (or set `agent` in [tool.osmosis] of pyproject.toml)" in output


def test_a_configured_file_target_is_relative_to_the_project_root(isolated: Path) -> None:
    (isolated / "pyproject.toml").write_text('[tool.osmosis]\nagent = "src/agent.py:A"\n')
    (isolated / "deep" / "er").mkdir(parents=True)
    found = find_project(isolated / "deep" / "er")
    assert found is not None
    assert found.root == isolated.resolve()
    assert found.agent_target(isolated / "deep" / "er") == "../../src/agent.py:A"
    assert found.agent_target(isolated) == "src/agent.py:A"


@pytest.mark.parametrize(
    ("agent", "message"),
    [
        ("42", "agent must be a target string"),
        ('"my_agent.agent"', "must be MODULE:ATTR or FILE.py:ATTR"),
    ],
)
def test_a_bad_configured_agent_names_the_file(isolated: Path, agent: str, message: str) -> None:
    (isolated / "pyproject.toml").write_text(f"[tool.osmosis]\nagent = {agent}\n")
    with pytest.raises(ConfigError, match=message) as info:
        find_project(isolated)
    assert str(isolated / "pyproject.toml") in str(info.value)
    code, output = invoke("validate")
    assert code == 2
    assert message in output


def test_without_a_tool_osmosis_table_the_root_stays_off_sys_path(isolated: Path) -> None:
    """An unrelated pyproject.toml above (a monorepo's) does not change what imports."""
    (isolated / "pyproject.toml").write_text('[project]\nname = "x"\n')
    found = find_project(isolated)
    assert found is not None
    assert (found.agent, found.configured) == (None, False)
    found.put_root_on_path()
    assert str(isolated.resolve()) not in sys.path
