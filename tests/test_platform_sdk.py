"""The trainer's own code drives us: osmosis-ai 0.3.2's ``HttpRolloutDriver``, ``CallbackStore``
and callback app (run in the SDK's own Python 3.12+ venv, tests/peer_sdk.py) against an
``osmosis init --layout workspace`` project started the platform's way,
``_OSMOSIS_ROLLOUT_PORT=P python rollouts/NAME/main.py``, with no key from the controller.

One server, one driver script (tests/assets/sdk032_driver.py), one report; each test reads its
part: a rollout ends ``success`` with the agent's reward, one that raises ends as the failure
the driver expects, a cancel by the driver cancels, the driver's capacity read of ``/health``
gives our concurrency, and every callback body passes the SDK's own pydantic models.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from osmosis_rollout.scaffold import create_project

from .peer_sdk import python_of, sdk_venv
from .processes import REPO, clean_env, stop_process, wait_healthy
from .support import free_port

pytestmark = pytest.mark.slow

DRIVER = REPO / "tests" / "assets" / "sdk032_driver.py"
INSTANCE = "platform-instance-7"
CONCURRENCY = 5

#: A subclass of the generated agent that raises on request: the "agent raises" case.
RAISING = """
from .agent import PlatformCheckAgent


class RaisingOnRequest(PlatformCheckAgent):
    async def run(self, ctx):
        if "please raise" in str(ctx.request.messages):
            raise RuntimeError("the agent failed on purpose")
        return await super().run(ctx)
"""


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The workspace served as the platform starts it, driven once by the SDK's driver."""
    venv = sdk_venv("0.3.2")
    workspace = tmp_path_factory.mktemp("platform") / "workspace"
    create_project(workspace, name="platform-check", layout="workspace")
    project = workspace / "rollouts" / "platform-check"
    (project / "platform_check" / "raising.py").write_text(RAISING)
    port = free_port()
    artifacts = workspace / "artifacts"
    env = clean_env(
        _OSMOSIS_ROLLOUT_PORT=str(port),
        _OSMOSIS_ROLLOUT_INSTANCE_ID=INSTANCE,
        _OSMOSIS_ROLLOUT_ARTIFACT_ROOT=str(artifacts),
        OSMOSIS_HOST="127.0.0.1",  # tests bind loopback only; the platform binds 0.0.0.0
    )
    log = workspace / "serve.log"
    main = ["rollouts/platform-check/main.py", "platform_check.raising:RaisingOnRequest"]
    with log.open("wb") as sink:
        server = subprocess.Popen(
            [str(_our_python()), *main, "--max-concurrent", str(CONCURRENCY)],
            cwd=workspace,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, server, log, timeout=60)
        driven = subprocess.run(
            [str(python_of(venv)), str(DRIVER), url],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            env=clean_env(),
        )
        assert driven.returncode == 0, f"{driven.stderr[-4000:]}\n--- server\n{log.read_text()}"
        found: dict[str, Any] = json.loads(driven.stdout.splitlines()[-1])
    finally:
        stop_process(server)  # drained: every trajectory is written
    found["server_log"] = log.read_text(errors="replace")
    found["artifacts"] = str(artifacts)
    return found


def _our_python() -> Path:
    import sys

    return Path(sys.executable)


def _callbacks(report: dict[str, Any], rollout_id: str) -> list[dict[str, Any]]:
    return [c for c in report["callbacks"] if f"/{rollout_id}/" in c["path"]]


def test_a_rollout_ends_success_with_the_agents_reward(report: dict[str, Any]) -> None:
    """The driver's outcome is SUCCESS, its sample carries the reward our agent computed."""
    assert report["success"]["status"] == "success", report["server_log"][-3000:]
    assert report["success"]["reward"] == 1.0
    assert report["success"]["messages"] == 2  # the question and the answer "7"
    kinds = [c["path"].rsplit("/", 1)[1] for c in _callbacks(report, "row-0-success")]
    assert kinds == ["completion", "grader"]


def test_an_agent_that_raises_ends_as_the_failure_the_driver_expects(
    report: dict[str, Any],
) -> None:
    """A RuntimeError is FAILURE with the SDK's agent_error, and no reward."""
    assert report["raises"]["status"] == "failure"
    assert report["raises"]["reward"] is None
    bodies = [c["parsed"]["value"] for c in _callbacks(report, "row-1-raises")]
    assert [b["status"] for b in bodies] == ["failure", "failure"]
    assert all(b["err_category"] == "agent_error" for b in bodies)
    assert all("failed on purpose" in (b["err_message"] or "") for b in bodies)


def test_a_cancel_by_the_driver_cancels(report: dict[str, Any]) -> None:
    """The driver's POST /rollout/cancel ends the rollout as cancelled; its callbacks say so."""
    assert report["cancelled"]["raised"] is True
    assert report["cancelled"]["status"]["status"] == "cancelled"
    bodies = [c["parsed"]["value"] for c in _callbacks(report, "row-2-cancelled")]
    assert bodies
    assert bodies[0]["status"] == "cancelled"


def test_the_drivers_capacity_read_of_health_gives_our_concurrency(
    report: dict[str, Any],
) -> None:
    """health_capacity() reads --max-concurrent; the instance header is the platform's id."""
    assert report["health"] == {"capacity": CONCURRENCY, "instance_id": INSTANCE}


def test_every_callback_body_passes_the_sdks_own_models(report: dict[str, Any]) -> None:
    """Each callback parses with RolloutCompleteRequest or GraderCompleteRequest, is
    acknowledged 200 by the SDK's callback app, and carries the controller's key as bearer."""
    assert len(report["callbacks"]) >= 6
    for callback in report["callbacks"]:
        assert callback["parsed"]["valid"], callback
        assert callback["status"] == 200, callback
        assert callback["authorization"] == "Bearer controller-key-for-callbacks-0123"
    assert report["terminals"] == ["grader", "grader"]  # the cancelled one was never committed


def test_the_chat_calls_carry_the_llm_key_never_the_controllers(report: dict[str, Any]) -> None:
    """The agent's chat turns go to the per-rollout URL with the LLM key."""
    assert report["chat_calls"]
    for call in report["chat_calls"]:
        assert call["authorization"] == "Bearer llm-key-for-chat-4567"
    assert "controller-key-for-callbacks-0123" not in report["server_log"]


def test_each_rollout_leaves_a_trajectory_the_runner_can_read(report: dict[str, Any]) -> None:
    """Under ``_OSMOSIS_ROLLOUT_ARTIFACT_ROOT``, every rollout the driver ran has its
    ``<rollout_id>/trajectory.json``, valid against the ``atif`` package's models."""
    import atif

    root = Path(report["artifacts"])
    for rollout_id in ("row-0-success", "row-1-raises", "row-2-cancelled"):
        document = json.loads((root / rollout_id / "trajectory.json").read_text())
        trajectory = atif.Trajectory.model_validate(document, strict=True)
        assert trajectory.session_id == rollout_id
