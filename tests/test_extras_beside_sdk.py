"""``osmosis-rollout[openai]`` installs into an environment that already holds the platform's
SDK, ``osmosis-ai[server]`` 0.3, as a workspace's rollout environment does: pip resolves both,
``pip check`` finds no conflict, the SDK stays at its version, and both packages import.
(README.md, "Two `osmosis` commands", says which combinations cannot, and why.)"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from .peer_sdk import INSTALL_TIMEOUT_S, find_python, python_of
from .processes import REPO
from .programs import skip_or_fail

pytestmark = pytest.mark.slow


def _pip(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), "-m", "pip", *args, "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
        check=False,
    )


def _tail(done: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in (done.stdout + done.stderr).splitlines() if "Location" not in line]
    return "\n".join(lines[-15:])


@pytest.mark.parametrize("sdk", ["0.3.2", "0.3.8"])
def test_the_openai_extra_installs_beside_the_sdk(tmp_path: Path, sdk: str) -> None:
    """The SDK first (the rollout's own pyproject, say), then this toolkit with its extra."""
    base = find_python()
    if base is None:
        skip_or_fail("no Python 3.12+ found (osmosis-ai needs one): install one with pyenv")
    assert base is not None
    venv = tmp_path / "venv"
    subprocess.run([base, "-m", "venv", str(venv)], check=True, timeout=300)
    python = python_of(venv)
    first = _pip(python, "install", "-q", f"osmosis-ai[server]=={sdk}")
    if first.returncode != 0:
        skip_or_fail(f"cannot install osmosis-ai[server]=={sdk}: {_tail(first)[-500:]}")
    ours = _pip(python, "install", "-q", f"{REPO}[openai]")
    assert ours.returncode == 0, _tail(ours)
    check = _pip(python, "check")
    assert check.returncode == 0, _tail(check)
    versions = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.metadata as m, openai, osmosis_rollout, osmosis_ai.rollout.server;"
            "print(m.version('osmosis-ai'), m.version('openai'))",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert versions.returncode == 0, versions.stderr[-2000:]
    assert versions.stdout.split()[0] == sdk  # the SDK kept its version
    command = subprocess.run(
        [str(venv / "bin" / "osmosis-rollout"), "--version"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert command.returncode == 0, command.stderr[-2000:]
    assert f"note: osmosis-ai {sdk} is installed too" in " ".join(command.stdout.split())
