"""`--json` everywhere (docs/json.md): every shape versioned, and errors as JSON on stdout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .commands import run_cli


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["test", "--json", "--bogus"], 2),
        (["validate", "--json", "--protocol", "v9"], 2),
        (["validate", "--json", "--dataset", "rows.jsonl", "agent.py:X"], 2),
        (["doctor", "--json", "--bogus"], 2),
        (["init", "--json"], 2),
        (["init", "Bad Name", "--json"], 2),
        (["skills", "list", "--json", "--bogus"], 2),
        (["outbox", "list", "--json", "--bogus"], 2),
    ],
)
def test_an_error_under_json_is_json_on_stdout_with_the_exit_code_kept(
    args: list[str], code: int
) -> None:
    result = run_cli(*args)
    assert result.exit_code == code, result.stdout + result.stderr
    error = json.loads(result.stdout)
    assert error["version"] == 1
    assert error["exit_code"] == code
    assert error["error"]["kind"] in ("usage", "error")
    assert error["error"]["message"]
    assert "Error:" in result.stderr  # the person watching still reads it


def test_without_json_an_error_stays_off_stdout() -> None:
    result = run_cli("test", "--bogus")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert "No such option" in result.stderr


def test_init_json_names_every_file_it_wrote(tmp_path: Path) -> None:
    dest = tmp_path / "demo"
    result = run_cli("init", "demo", "--path", str(dest), "--json")
    assert result.exit_code == 0, result.stderr
    created = json.loads(result.stdout)
    assert created["version"] == 1
    assert created["target"] == "demo.agent:DemoAgent"
    assert created["path"] == str(dest)
    written = {p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()}
    assert set(created["files"]) == written
    assert {"AGENTS.md", "CLAUDE.md", ".agents/skills/debug-agent/SKILL.md"} <= written


def test_list_templates_json() -> None:
    result = run_cli("init", "--list-templates", "--json")
    assert result.exit_code == 0
    listed = json.loads(result.stdout)
    assert listed["version"] == 1
    defaults = [t["name"] for t in listed["templates"] if t["default"]]
    assert defaults == ["tools"]
    assert all(t["description"] for t in listed["templates"])


def test_every_command_with_json_is_in_docs_json_md() -> None:
    """docs/json.md is where a script finds each shape: a command's --json is named there."""
    import typer.main

    from osmosis_rollout.cli import app

    page = (Path(__file__).resolve().parents[1] / "docs" / "json.md").read_text(encoding="utf-8")
    group = typer.main.get_command(app)
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        subcommands = getattr(command, "commands", None) or {"": command}
        for sub, each in subcommands.items():
            if any("--json" in param.opts for param in each.params):
                shown = f"osmosis {name} {sub}".strip()
                assert shown in page or f"`{sub} --json`" in page, shown
