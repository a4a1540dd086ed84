"""The `osmosis` command group (cli/__init__.py, cli/_group.py): help, usage errors, completion."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from osmosis_rollout.cli import COMMANDS, app

from .commands import run_cli, run_cli_text


@pytest.mark.usefixtures("no_inherited_settings")
@pytest.mark.parametrize("command", [[], ["init"], ["validate"], ["test"], ["serve"]])
def test_help_shows_no_bool_type_on_flags_and_no_braces(command: list[str]) -> None:
    code, out, _ = run_cli_text(*command, "--help")
    assert code == 0
    assert "<bool>" not in out
    assert "{" not in out
    assert "--help" in out


@pytest.mark.usefixtures("no_inherited_settings")
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
    code, out, err = run_cli_text(*args)
    assert code == 2
    lines = err.splitlines()
    assert lines[0].startswith(f"Error: {message}")
    assert lines[1].startswith(f"Hint: usage: {usage}")
    assert lines[1].endswith("--help")
    assert "╭" not in err + out


@pytest.mark.parametrize("command", ["validate", "test", "serve"])
def test_usage_line_names_the_target_like_the_docs(command: str) -> None:
    """Every command's usage line calls the agent TARGET, as errors and docs do."""
    result = run_cli(command, "--help", env={"COLUMNS": "200"})
    assert result.exit_code == 0
    usage = next(line for line in result.stdout.splitlines() if "Usage:" in line)
    assert "TARGET" in usage


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


@pytest.mark.usefixtures("no_inherited_settings")
def test_show_completion_prints_a_bash_script() -> None:
    proc = osmosis_process("--show-completion", "bash")
    assert proc.returncode == 0, proc.stderr
    assert "complete -o default -F _osmosis_completion osmosis" in proc.stdout


@pytest.mark.usefixtures("no_inherited_settings")
def test_install_completion_writes_the_script_for_the_shell(tmp_path: Path) -> None:
    proc = osmosis_process("--install-completion", "bash", env={"HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert "_osmosis_completion" in (tmp_path / ".bash_completions" / "osmosis.sh").read_text()
    assert "osmosis.sh" in (tmp_path / ".bashrc").read_text()


@pytest.mark.usefixtures("no_inherited_settings")
@pytest.mark.parametrize(
    ("words", "cword", "expected"),
    [("osmosis val", "1", "validate"), ("osmosis test --conc", "2", "--concurrency")],
)
def test_completion_completes_commands_and_options(words: str, cword: str, expected: str) -> None:
    """What bash calls on <Tab> once the script is installed."""
    env = {"_OSMOSIS_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": cword}
    proc = osmosis_process(env=env)
    assert proc.stdout.split() == [expected], proc.stderr


def test_every_command_module_registers_its_command() -> None:
    """``osmosis --help`` lists each command module's command."""
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0, result.output
    for name in COMMANDS:
        assert name in result.output


def test_a_command_module_that_fails_to_import_fails_loudly() -> None:
    """A command module that cannot be imported stops the CLI with its import error; before,
    a ``ModuleNotFoundError`` naming the module itself was swallowed and the command vanished
    from ``osmosis --help`` without a word."""
    script = (
        "import importlib.abc, sys\n"
        "class Missing(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'osmosis_rollout.cli.view':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "        return None\n"
        "sys.meta_path.insert(0, Missing())\n"
        "import osmosis_rollout.cli\n"
        "print('imported')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode != 0, done.stdout
    assert "imported" not in done.stdout
    assert "No module named 'osmosis_rollout.cli.view'" in done.stderr


def test_each_commands_summary_is_one_line_so_help_never_breaks_it_mid_sentence() -> None:
    """`osmosis --help` shows each command's first docstring paragraph; a paragraph written over
    two source lines was printed with its line break, cut mid-sentence (`view` was)."""
    import typer.main

    group = typer.main.get_command(app)
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        summary = (command.help or "").strip().split("\n\n")[0]
        assert "\n" not in summary, name
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "80"})
    assert "Serve a local web page of the rollouts in PATH" in result.output
    assert "each rollout as a" not in result.output  # the second line of the old paragraph


# -- two `osmosis` commands ------------------------------------------------------------------


def test_version_names_the_toolkit_and_where_it_runs_from() -> None:
    """`osmosis --version` says which of the two `osmosis` commands this is."""
    import osmosis_rollout
    from osmosis_rollout._version import __version__

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    first = result.stdout.splitlines()[0]
    assert first.startswith(f"osmosis-rollout {__version__} (the osmosis-rollout toolkit, ")
    assert str(Path(osmosis_rollout.__file__).resolve().parent) in first


def test_version_says_when_the_platforms_sdk_is_installed_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With osmosis-ai beside us, the note says `osmosis-rollout` always runs this toolkit."""
    import osmosis_rollout.cli as cli

    monkeypatch.setattr(cli, "sdk_version", lambda: "0.3.2")
    result = CliRunner().invoke(app, ["--version"])
    note = " ".join(result.stdout.split())
    assert "note: osmosis-ai 0.3.2 is installed too" in note
    assert "`osmosis-rollout` always runs this toolkit" in note


def test_the_osmosis_rollout_command_is_the_same_app() -> None:
    """Both console scripts, and `python -m osmosis_rollout`, run the one app."""
    from importlib.metadata import entry_points

    scripts = {e.name: e.value for e in entry_points(group="console_scripts")}
    assert scripts["osmosis-rollout"] == scripts["osmosis"] == "osmosis_rollout.cli:main"
    done = subprocess.run(
        [sys.executable, "-m", "osmosis_rollout", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0
    assert done.stdout.startswith("osmosis-rollout ")


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_at_80_columns_cuts_no_word(command: str) -> None:
    """An option name or a URL wider than its column was cut with "…" (``--tool-error-sh…``,
    ``http://127.0.0.1…``: 21 options of ``osmosis test --help`` at 80 columns, where a coding
    agent reads it); each folds onto the next line instead, whole."""
    result = run_cli(command, "--help", env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "…" not in result.stdout
    if command == "test":
        unfolded = "".join(line.strip("│ ") for line in result.stdout.splitlines())
        assert "--tool-error-sha" in result.stdout
        assert "http://127.0.0.1:" in unfolded
