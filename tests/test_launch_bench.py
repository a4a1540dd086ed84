"""The rest of the bench on a launched official server (issue 36 item 5): ``osmosis validate
--reward``, ``--record``/``--replay``, ``--samples``/pass@k/``--by``/``--resume`` and ``-i``, each
on a rollout written with osmosis-ai 0.3's public API (``tests/assets/foreign/sdk_rollout``) and
run unchanged in the SDK's own Python 3.12 venv: 0.3.2 over the callback wire (v2), 0.3.8 over
polling. The policies and the model's replies are the mock TrainGate's chat replies, so none
of this needs the server's code."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from osmosis_rollout.evaluation import TestOptions, run_test
from osmosis_rollout.evaluation.cassette import read_cassette
from osmosis_rollout.evaluation.launch import LaunchSpec
from osmosis_rollout.evaluation.reward_checks import RewardCheckOptions, check_rewards

from .peer_sdk import python_of, sdk_venv
from .processes import clean_env
from .support import ASSETS

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

ROLLOUT = ASSETS / "foreign" / "sdk_rollout"
ROWS = [
    {"user_prompt": "What is 6*7?", "ground_truth": "42", "topic": "mul",
     "mock_replies": [{"content": "42."}]},
    {"user_prompt": "What is 2+2?", "ground_truth": "4", "topic": "add",
     "mock_replies": [{"content": "4, so."}]},
    {"user_prompt": "What is 3+3?", "ground_truth": "6", "topic": "add",
     "mock_replies": [{"content": "6"}]},
]  # fmt: skip


@pytest.fixture(scope="module", params=["0.3.2", "0.3.8"])
def sdk(request: pytest.FixtureRequest) -> tuple[str, Path]:
    """(the wire it speaks, its interpreter) for each official release."""
    version = request.param
    return ("v2" if version == "0.3.2" else "polling"), python_of(sdk_venv(version))


def _rows(tmp_path: Path) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return path


def _spec(python: Path, **env: str) -> LaunchSpec:
    return LaunchSpec(shlex.join([str(python), "main.py"]), cwd=ROLLOUT, env=env)


async def test_reward_checks_pass_a_sound_grader_and_find_a_leaky_one(
    sdk: tuple[str, Path], tmp_path: Path
) -> None:
    """The no-op and random policies score 0 against the grader that checks the label, the
    gold 1; a grader that rewards every answer is a leak and a constant reward."""
    protocol, python = sdk
    said: list[str] = []
    options = RewardCheckOptions(
        target=None, dataset=_rows(tmp_path), launch=_spec(python), protocol=None, timeout=20
    )
    report = await check_rewards(options, said.append)
    assert any(line.startswith(f"protocol {protocol}:") for line in said), said
    means = {run.policy: run.mean for run in report.runs}
    assert means == {"none": 0.0, "random": 0.0, "gold": 1.0}
    assert report.findings == []
    leaky = dataclasses.replace(options, launch=_spec(python, LEAKY_GRADER="1"))
    codes = {f.code for f in (await check_rewards(leaky)).findings}
    assert codes == {"reward_leak", "reward_constant"}


async def test_a_recorded_run_replays_on_the_launched_server(
    sdk: tuple[str, Path], tmp_path: Path
) -> None:
    """``--record`` keeps the chat turns the server made, on its wire; ``--replay`` serves
    them back with no divergence, and the rows come out the same."""
    protocol, python = sdk
    tape = tmp_path / "recorded.jsonl"
    base = TestOptions(launch=_spec(python), dataset=_rows(tmp_path), protocol=None, timeout=20)
    recorded = await run_test(dataclasses.replace(base, record=tape))
    assert recorded.exit_code == 0, recorded.findings
    assert read_cassette(tape).header.protocol == protocol
    replayed = await run_test(dataclasses.replace(base, dataset=None, replay=tape))
    assert replayed.exit_code == 0, replayed.findings
    assert [(r.index, r.reward, r.turns) for r in replayed.rows] == [
        (r.index, r.reward, r.turns) for r in recorded.rows
    ]
    assert replayed.summary["findings"] == {}


async def test_samples_pass_at_k_groups_and_resume(sdk: tuple[str, Path], tmp_path: Path) -> None:
    """Two samples a row, grouped by a column, written to a file; a resumed run of the same
    command keeps every row (a launched server's new port is not a changed option)."""
    _, python = sdk
    out = tmp_path / "results.jsonl"
    options = TestOptions(
        launch=_spec(python), dataset=_rows(tmp_path), protocol=None, timeout=20,
        samples=2, by="topic", output=out,
    )  # fmt: skip
    report = await run_test(options)
    assert report.exit_code == 0, report.findings
    groups = report.summary["groups"]
    assert groups["samples"] == 2
    assert groups["pass_at_k"] == {"1": 1.0, "2": 1.0}
    assert set(groups["by"]["values"]) == {"add", "mul"}
    again = await run_test(dataclasses.replace(options, resume=True))
    assert again.summary["resumed"] == 2 * len(ROWS)
    assert [r.reward for r in again.rows] == [r.reward for r in report.rows]


def test_step_through_a_launched_servers_turn_and_edit_the_reply(
    sdk: tuple[str, Path], tmp_path: Path
) -> None:
    """``osmosis test -i --launch``: the server's chat turn pauses at the prompt; the reply
    edited there is what its grader sees (reward 0 for a wrong answer), and the figures are
    the ones the mock served (the server reports none)."""
    protocol, python = sdk
    done = subprocess.run(
        [sys.executable, "-m", "osmosis_rollout", "test", "-i", "--launch",
         shlex.join([str(python), "main.py"]), "-d", str(_rows(tmp_path)), "--row", "1"],
        cwd=ROLLOUT, env=clean_env(NO_COLOR="1"), input="edit\nno idea\nn\nq\n",
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"protocol {protocol}:" in done.stderr
    assert "turn 1>" in done.stdout
    assert "rollout COMPLETED" in done.stdout
    assert "reward 0" in done.stdout
    assert "Metrics, as the mock TrainGate served them" in done.stdout
    assert re.search(r"^ llm calls +1 ", done.stdout, re.MULTILINE), done.stdout


def test_validate_reward_launches_the_server_from_the_command_line(
    sdk: tuple[str, Path], tmp_path: Path
) -> None:
    """``osmosis validate --reward --launch CMD``: the server is started once for the three
    policies and the verdict is the exit code; without ``--reward``, ``--launch`` is refused
    with what to do (the static checks need the agent's code)."""
    protocol, python = sdk
    command = shlex.join([str(python), "main.py"])
    rows = str(_rows(tmp_path))

    def validate(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "osmosis_rollout", "validate", *args],
            cwd=ROLLOUT, env=clean_env(NO_COLOR="1"), capture_output=True, text=True,
            timeout=180, check=False,
        )  # fmt: skip

    done = validate("--reward", "--launch", command, "-d", rows)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr.count("launched ") == 1
    assert f"protocol {protocol}:" in done.stderr
    assert "no findings" in done.stdout
    refused = validate("--launch", command)
    assert refused.returncode == 2
    assert "--launch is for --reward" in refused.stderr
    assert "Traceback" not in refused.stderr
