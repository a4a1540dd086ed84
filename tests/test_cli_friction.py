"""Frictions a new user met in the first hour (issue 16), each pinned by a test."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr
from typer.testing import CliRunner

from osmosis_rollout.cli import app
from osmosis_rollout.config import ServerSettings
from osmosis_rollout.server import create_app

from .support import load_asset, serve_in_thread

ROOT = Path(__file__).resolve().parent.parent
CALCULATOR = f"{ROOT}/examples/calculator/agent.py:CalculatorAgent"
DATASET = str(ROOT / "examples/calculator/dataset.jsonl")


@pytest.fixture(autouse=True)
def no_inherited_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("OSMOSIS_"):
            monkeypatch.delenv(name)


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    return result.exit_code, result.stdout, result.stderr


# --- item 5: the server key is checked once, before the run ---------------------------------------


@pytest.fixture
def keyed_server() -> Iterator[str]:
    """A rollout server on 127.0.0.1 that requires the key `right-key`."""
    agent = load_asset("tool_agent")
    settings = ServerSettings(api_key=SecretStr("right-key"))
    app_ = create_app(agent.ToolAgent(), settings=settings)
    with serve_in_thread(app_, lifespan="on") as url:
        yield url


@pytest.mark.parametrize(
    ("key_args", "problem"),
    [([], "requires a key and none was given"), (["--api-key", "wrong"], "refused the key given")],
)
def test_a_missing_or_wrong_server_key_stops_before_the_first_row(
    keyed_server: str, key_args: list[str], problem: str
) -> None:
    code, out, err = invoke("test", "--server", keyed_server, "-d", DATASET, *key_args)
    assert code == 2
    assert f"the rollout server at {keyed_server} {problem}" in err
    assert "--api-key KEY or the OSMOSIS_API_KEY environment variable" in err
    assert "REFUSED" not in out + err  # no row was run
    assert "--verbose" not in out + err


def test_the_right_server_key_runs_the_rows(keyed_server: str) -> None:
    code, out, err = invoke(
        "test", "--server", keyed_server, "-d", DATASET, "--limit", "2", "--api-key", "right-key"
    )
    assert "REFUSED" not in out, out + err
    assert code == 0, out + err


# --- item 7: shell completion ---------------------------------------------------------------------


def osmosis_process(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The installed `osmosis` command as a user runs it (completion needs a real process)."""
    osmosis = Path(sys.executable).parent / "osmosis"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("OSMOSIS_", "_OSMOSIS"))}
    full_env.update(env or {})
    return subprocess.run(
        [str(osmosis), *args], env=full_env, capture_output=True, text=True, timeout=60, check=False
    )


def test_show_completion_prints_a_bash_script() -> None:
    proc = osmosis_process("--show-completion", "bash")
    assert proc.returncode == 0, proc.stderr
    assert "complete -o default -F _osmosis_completion osmosis" in proc.stdout


def test_install_completion_writes_the_script_for_the_shell(tmp_path: Path) -> None:
    proc = osmosis_process("--install-completion", "bash", env={"HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert "_osmosis_completion" in (tmp_path / ".bash_completions" / "osmosis.sh").read_text()
    assert "osmosis.sh" in (tmp_path / ".bashrc").read_text()


@pytest.mark.parametrize(
    ("words", "cword", "expected"),
    [("osmosis val", "1", "validate"), ("osmosis test --conc", "2", "--concurrency")],
)
def test_completion_completes_commands_and_options(words: str, cword: str, expected: str) -> None:
    """What bash calls on <Tab> once the script is installed."""
    env = {"_OSMOSIS_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": cword}
    proc = osmosis_process(env=env)
    assert proc.stdout.split() == [expected], proc.stderr


# --- item 11: help and usage errors look like one tool --------------------------------------------


@pytest.mark.parametrize("command", [[], ["init"], ["validate"], ["test"], ["serve"]])
def test_help_shows_no_bool_type_on_flags_and_no_braces(command: list[str]) -> None:
    code, out, _ = invoke(*command, "--help")
    assert code == 0
    assert "<bool>" not in out
    assert "{" not in out
    assert "--help" in out


@pytest.mark.parametrize(
    ("args", "message", "usage"),
    [
        (["validate", "--bogus"], "No such option: --bogus", "osmosis validate [OPTIONS] [TARGET]"),
        (["tset"], "No such command 'tset'. Did you mean 'test'?", "osmosis [OPTIONS] COMMAND"),
        (
            ["test", "--concurrency", "x"],
            "Invalid value for '--concurrency'",
            "osmosis test [OPTIONS] [TARGET]",
        ),
    ],
)
def test_usage_errors_are_plain_error_lines_like_every_other_error(
    args: list[str], message: str, usage: str
) -> None:
    """Typer's boxed panel is gone: `Error:` then `Hint:`, as `fail()` prints them."""
    code, out, err = invoke(*args)
    assert code == 2
    lines = err.splitlines()
    assert lines[0].startswith(f"Error: {message}")
    assert lines[1].startswith(f"Hint: usage: {usage}")
    assert lines[1].endswith("--help")
    assert "╭" not in err + out
