"""``osmosis test --config configs/eval/NAME.toml`` on an osmosis-ai workspace, unchanged: its
rollout's entrypoint launched in the rollout's own venv (here the SDK 0.3.2 venv of
``tests/peer_sdk.py``), its dataset from ``data/``, ``n`` as ``--samples``, ``[env]`` set for
the server, the keys it does not use named; a flag given on the command line wins."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .peer_sdk import python_of, sdk_venv
from .processes import clean_env
from .support import ASSETS

pytestmark = pytest.mark.slow

CONFIG = """\
[experiment]
rollout = "multiply"
entrypoint = "main.py"
model_path = "openai/gpt-5-mini"
dataset = "multiply"

[evaluation]
n = 2
pass_threshold = 1.0
limit = 1
agent_workflow_timeout_s = 30
grader_timeout_s = 30
batch_size = 4

[env]
ROLLOUT_MARK = "from-the-config"
"""


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace as osmosis-ai's template lays one out, its rollout's .venv the SDK's."""
    root = tmp_path_factory.mktemp("workspace")
    rollout = root / "rollouts" / "multiply"
    (rollout / ".venv" / "bin").mkdir(parents=True)
    shutil.copy(ASSETS / "foreign" / "sdk_rollout" / "main.py", rollout / "main.py")
    python = rollout / ".venv" / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec "{python_of(sdk_venv("0.3.2"))}" "$@"\n')
    python.chmod(0o755)
    (root / "configs" / "eval").mkdir(parents=True)
    (root / "configs" / "eval" / "multiply.toml").write_text(CONFIG)
    (root / "data").mkdir()
    rows = [
        {"user_prompt": "6*7?", "ground_truth": "42", "mock_replies": [{"content": "42"}]},
        {"user_prompt": "2*2?", "ground_truth": "4", "mock_replies": [{"content": "4"}]},
    ]
    (root / "data" / "multiply.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def _test(workspace: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "osmosis_rollout", "test", "--config",
         "configs/eval/multiply.toml", "--json", *flags],
        cwd=workspace, env=clean_env(), capture_output=True, text=True, timeout=180,
    )  # fmt: skip


def test_an_eval_config_runs_its_rollout_with_its_settings(workspace: Path) -> None:
    done = _test(workspace)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout)
    assert summary["rows"] == 2  # limit 1, n 2
    assert summary["groups"]["samples"] == 2
    assert summary["mean_reward"] == 1.0
    err = " ".join(done.stderr.split())
    assert "launched" in err
    assert "not used: evaluation.batch_size" in err
    assert "grader_timeout_s" in err


def test_a_flag_on_the_command_line_wins(workspace: Path) -> None:
    done = _test(workspace, "--samples", "1", "--limit", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout)
    assert summary["rows"] == 2
    assert summary["groups"]["samples"] == 1


def test_a_platform_dataset_without_a_file_asks_for_dataset(workspace: Path) -> None:
    config = workspace / "configs" / "eval" / "other.toml"
    config.write_text(CONFIG.replace('dataset = "multiply"', 'dataset = "elsewhere"'))
    done = subprocess.run(
        [sys.executable, "-m", "osmosis_rollout", "test", "--config", str(config)],
        cwd=workspace, env=clean_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--dataset" in done.stderr


def test_a_launch_beside_the_config_runs_in_the_rollouts_folder(workspace: Path) -> None:
    # run from the workspace root, as the config's own entrypoint is: main.py is the rollout's
    python = python_of(sdk_venv("0.3.2"))
    done = _test(workspace, "--launch", f"{python} main.py", "--samples", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout)
    assert summary["rows"] == 1
    assert summary["mean_reward"] == 1.0


def test_a_rollout_without_its_venv_is_told_where_its_dependencies_go(
    workspace: Path, tmp_path: Path
) -> None:
    # the same workspace without rollouts/multiply/.venv: the entrypoint runs with our Python,
    # which has not the rollout's dependencies (httpx, osmosis_ai)
    bare = tmp_path / "bare"
    shutil.copytree(workspace, bare, ignore=shutil.ignore_patterns(".venv"))
    done = _test(bare)
    assert done.returncode == 2, done.stdout + done.stderr
    message = json.loads(done.stdout)["error"]["message"]
    module = re.search(r"ModuleNotFoundError: No module named '(\w+)'", message)
    assert module is not None, message
    hint = message.split("\nHint: ", 1)[1]
    assert hint.startswith(f"the Python {sys.executable} has no module {module[1]!r}")
    assert "or create rollouts/multiply/.venv with the rollout's dependencies" in hint
