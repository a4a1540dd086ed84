"""The polling wire against the official controller: osmosis-ai 0.3.8's ``RolloutClient`` drives a
real ``osmosis serve`` on 127.0.0.1.

osmosis-ai needs Python 3.12+, so it lives in a venv of its own, made once and kept under
``~/.cache/osmosis-rollout-tests/`` (never in ours). The test skips, naming why, only when no
3.12+ interpreter exists or the package index cannot give the package; with
``TESTS_REQUIRE_PROGRAMS=1`` (CI) it fails instead. The controller's side is
``tests/assets/polling_sdk_controller.py``: success with the agent's reward, an agent that
raises, a cancel, a controller that stops polling, ``/health``, every body strict.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .gates import ADD_CALL, ANSWER
from .processes import REPO, clean_env, osmosis_serve
from .programs import skip_or_fail
from .support import serve_in_thread
from .v2_gate import V2Gate

pytestmark = pytest.mark.slow

SDK = "osmosis-ai==0.3.8"
AGENT = f"{REPO}/tests/assets/v2_interop_agent.py:InteropAgent"
CONTROLLER = REPO / "tests" / "assets" / "polling_sdk_controller.py"
SERVER_KEY = "polling-interop-key-01"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "osmosis-rollout-tests"


def _version(python: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print(*sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.split()
        return int(out[0]), int(out[1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def _candidates() -> Iterator[str]:
    """Pythons that may be 3.12+: ours, those on PATH, pyenv's."""
    yield sys.executable
    for name in ("python3.13", "python3.12", "python3"):
        found = shutil.which(name)
        if found:
            yield found
    roots = [Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")]
    pyenv = shutil.which("pyenv")
    if pyenv:
        root = subprocess.run([pyenv, "root"], capture_output=True, text=True, timeout=30)
        if root.returncode == 0 and root.stdout.strip():
            roots.insert(0, Path(root.stdout.strip()))
    for root in roots:
        for version in sorted((root / "versions").glob("3.1[2-9]*"), reverse=True):
            yield str(version / "bin" / "python3")


def _python312() -> str | None:
    for python in _candidates():
        version = _version(python)
        if version is not None and version >= (3, 12):
            return python
    return None


def _sdk_venv() -> Path:
    """The cached venv's python with the SDK in it, made (atomically) if missing."""
    venv = CACHE / SDK.replace("==", "-")
    python = venv / "bin" / "python"
    check = [str(python), "-c", "import osmosis_ai.rollout.client"]
    if python.exists() and subprocess.run(check, capture_output=True, timeout=120).returncode == 0:
        return python
    base = _python312()
    if base is None:
        skip_or_fail(f"no Python 3.12+ interpreter found for {SDK} (install one, e.g. pyenv)")
    CACHE.mkdir(parents=True, exist_ok=True)
    building = CACHE / f"{venv.name}.{os.getpid()}.tmp"
    shutil.rmtree(building, ignore_errors=True)
    subprocess.run([base, "-m", "venv", str(building)], check=True, timeout=300)
    install = subprocess.run(
        [str(building / "bin" / "python"), "-m", "pip", "install", "-q", SDK],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if install.returncode != 0:
        shutil.rmtree(building, ignore_errors=True)
        tail = install.stderr.strip().splitlines()[-1:] or ["no output"]
        skip_or_fail(f"pip could not install {SDK} (is the package index reachable?): {tail[0]}")
    shutil.rmtree(venv, ignore_errors=True)
    building.rename(venv)
    return python


@pytest.fixture(scope="module")
def sdk_python() -> Path:
    return _sdk_venv()


def test_the_official_controller_drives_osmosis_serve(sdk_python: Path, tmp_path: Path) -> None:
    gate = V2Gate(replies=[ADD_CALL, ANSWER])
    env = clean_env(OSMOSIS_API_KEY=SERVER_KEY, OSMOSIS_POLL_WAIT_S="1", OSMOSIS_POLL_LEASE_S="3")
    args = [AGENT, "--port", "0", "--max-concurrent", "4", "--log-level", "debug"]
    with (
        serve_in_thread(gate.app()) as gate_url,
        osmosis_serve(tmp_path / "serve.log", *args, env=env) as served,
    ):
        gate.url = gate_url
        run = subprocess.run(
            [str(sdk_python), str(CONTROLLER), served.url, SERVER_KEY, gate_url],
            capture_output=True,
            text=True,
            timeout=180,
            env={"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)},
        )
        log = served.output()
    assert run.returncode == 0, f"{run.stderr}\n--- server log ---\n{log}"
    seen = json.loads(run.stdout.strip().splitlines()[-1])

    success = seen["success"]
    assert success["status"] == "success"
    assert success["sample"]["reward"] == 1.0
    assert success["sample"]["messages"][-1]["content"] == ANSWER["content"]
    assert success["err_category"] is None

    failed = seen["raise"]
    assert failed["status"] == "failure"
    assert failed["err_category"] == "agent_error"
    assert "boom from the interop agent" in failed["err_message"]

    assert seen["cancel"]["dispositions"] == {"stop": "cancelled_running"}
    assert seen["cancel"]["result"]["status"] == "cancelled"

    strict = seen["strict"]
    assert strict["init_status"] == "queued"
    assert strict["statuses"][-1] == "success"
    assert strict["reward"] == 1.0
    assert strict["same_again"] is True
    assert strict["cancel_after"] == {"strict": "not_found"}

    lease = seen["lease"]
    assert lease["result"]["status"] == "failure"
    assert lease["result"]["err_category"] == "lease_expired"
    assert lease["active_after"] == 0  # the slot is free: the agent was cancelled

    assert seen["health"]["lifecycle"] == {"accepting_rollouts": True, "active_rollouts": 0}
    assert len(seen["tokens"]) == 2
    for secret in (SERVER_KEY, "llm-key", *seen["tokens"]):
        assert secret not in log
