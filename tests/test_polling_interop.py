"""The polling wire against the official controller: osmosis-ai 0.3.8's ``RolloutClient`` drives a
real ``osmosis serve`` on 127.0.0.1.

osmosis-ai needs Python 3.12+, so it lives in a venv of its own, made once and kept under
``~/.cache/osmosis-rollout-tests/`` by ``tests/peer_sdk.py`` (never in ours). The test skips,
naming why, only when no 3.12+ interpreter exists or the package index cannot give the
package; with ``TESTS_REQUIRE_PROGRAMS=1`` (CI) it fails instead. The controller's side is
``tests/assets/polling_sdk_controller.py``: success with the agent's reward, an agent that
raises, a cancel, a controller that stops polling, ``/health``, every body strict.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from .gates import ADD_CALL, ANSWER
from .peer_sdk import python_of, sdk_venv
from .processes import REPO, clean_env, osmosis_serve
from .support import serve_in_thread
from .v2_gate import V2Gate

pytestmark = pytest.mark.slow

SDK_VERSION = "0.3.8"
AGENT = f"{REPO}/tests/assets/v2_interop_agent.py:InteropAgent"
CONTROLLER = REPO / "tests" / "assets" / "polling_sdk_controller.py"
SERVER_KEY = "polling-interop-key-01"


@pytest.fixture(scope="module")
def sdk_python() -> Path:
    """osmosis-ai 0.3.8 in its cached Python 3.12+ venv (tests/peer_sdk.py)."""
    return python_of(sdk_venv(SDK_VERSION, extras=()))


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
