"""The ``osmosis`` app itself (``osmosis_rollout.cli``): which commands it registers, and how."""

from __future__ import annotations

import subprocess
import sys

from typer.testing import CliRunner

from osmosis_rollout.cli import COMMANDS, app


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
