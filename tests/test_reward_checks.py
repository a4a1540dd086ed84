"""``osmosis validate --reward -d rows.jsonl``: the no-op, random and gold policies over the
rows; a planted leak fails with a finding naming it, a sound reward passes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from osmosis_rollout.cli import app
from osmosis_rollout.evaluation.reward_checks import RewardCheckOptions, check_rewards

ASSETS = Path(__file__).parent / "assets"
AGENTS = f"{ASSETS}/reward_agents.py"


def gold_rows(tmp_path: Path, *, wrong_gold: bool = False) -> Path:
    rows = []
    for i, (a, b) in enumerate([(2, 3), (10, 32), (7, 8)]):
        total = a + b
        gold = [
            {"tool_calls": [{"name": "add", "arguments": {"a": a, "b": b}}]},
            f"The answer is {total + (1 if wrong_gold and i == 1 else 0)}",
        ]
        rows.append(
            {"user_prompt": f"What is {a} + {b}?", "ground_truth": str(total), "mock_replies": gold}
        )
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def check(agent: str, rows: Path, **options: object) -> dict:
    report = asyncio.run(
        check_rewards(RewardCheckOptions(target=f"{AGENTS}:{agent}", dataset=rows, **options))  # type: ignore[arg-type]
    )
    return report.as_dict()


def codes(report: dict) -> list[str]:
    return [f["code"] for f in report["findings"]]


def test_a_sound_reward_passes(tmp_path: Path) -> None:
    report = check("SoundAgent", gold_rows(tmp_path))
    assert report["passed"], report["findings"]
    means = {p["policy"]: p["mean_reward"] for p in report["policies"]}
    assert means == {"none": 0.0, "random": 0.0, "gold": 1.0}


def test_a_planted_leak_fails_with_a_finding_that_names_it(tmp_path: Path) -> None:
    """A reward of 1.0 for an empty answer: the no-op policy matches the gold on every row."""
    report = check("LeakyAgent", gold_rows(tmp_path))
    assert not report["passed"]
    (leak,) = [f for f in report["findings"] if f["code"] == "reward_leak"]
    assert leak["details"] == {"policy": "none", "rows": [1, 2, 3]}
    assert (
        "no-op (no answer, no tool call) policy scores as much as the gold replies"
        in (leak["message"])
    )
    assert "3 row(s) (1, 2, 3)" in leak["message"]


def test_without_gold_a_no_op_above_the_minimum_is_a_leak(tmp_path: Path) -> None:
    rows = tmp_path / "plain.jsonl"
    rows.write_text(json.dumps({"user_prompt": "What is 1 + 1?", "ground_truth": "2"}) + "\n")
    assert codes(check("LeakyAgent", rows)) == ["reward_leak"]
    assert check("SoundAgent", rows)["passed"]
    assert [p["policy"] for p in check("SoundAgent", rows)["policies"]] == ["none", "random"]


def test_a_constant_reward_is_a_finding(tmp_path: Path) -> None:
    found = codes(check("ConstantAgent", gold_rows(tmp_path)))
    assert "reward_constant" in found
    assert "gold_fails" in found  # 0.5 never reaches the pass threshold of 1.0


def test_rewards_out_of_range(tmp_path: Path) -> None:
    report = check("ScaledAgent", gold_rows(tmp_path))
    (finding,) = [f for f in report["findings"] if f["code"] == "reward_out_of_range"]
    assert "outside [0, 1]" in finding["message"]
    assert check("ScaledAgent", gold_rows(tmp_path), reward_range=(0.0, 10.0), pass_threshold=10.0)[
        "passed"
    ]


def test_rows_the_gold_fails_are_named(tmp_path: Path) -> None:
    report = check("SoundAgent", gold_rows(tmp_path, wrong_gold=True))
    (finding,) = report["findings"]
    assert finding["code"] == "gold_fails"
    assert finding["details"] == {"rows": [2]}
    assert "row 2: reward 0.0" in finding["message"]


def test_the_command_exits_1_on_a_finding_and_0_without(tmp_path: Path) -> None:
    rows = str(gold_rows(tmp_path))
    leaky = CliRunner().invoke(app, ["validate", f"{AGENTS}:LeakyAgent", "--reward", "-d", rows])
    assert leaky.exit_code == 1, leaky.output
    assert "reward_leak" in leaky.stdout
    assert "Reward checks" in leaky.stdout
    sound = CliRunner().invoke(
        app, ["validate", f"{AGENTS}:SoundAgent", "--reward", "-d", rows, "--json"]
    )
    assert sound.exit_code == 0, sound.output
    assert json.loads(sound.stdout)["passed"] is True


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--reward"], "--reward needs the rows to score: give --dataset"),
        (["--reward", "-d", "x.jsonl", "--reward-range", "1"], "--reward-range '1': give MIN,MAX"),
        (["--reward", "-d", "x.jsonl", "--reward-range", "1,0"], "MIN is above MAX"),
        (["-d", "x.jsonl"], "--dataset is for --reward"),
        (["--reward", "-d", "x.jsonl", "--launch", "python main.py"], "TARGET"),
        (["--reward", "-d", "x.jsonl", "--server", "http://127.0.0.1:1"], "not both"),
    ],
)
def test_usage_errors(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["validate", f"{AGENTS}:SoundAgent", *args])
    assert result.exit_code == 2
    assert message in " ".join(result.stderr.split())


def test_a_server_and_a_launch_command_together_are_refused() -> None:
    args = ["validate", "--reward", "-d", "x.jsonl", "--server", "http://127.0.0.1:1"]
    result = CliRunner().invoke(app, [*args, "--launch", "python main.py"])
    assert result.exit_code == 2
    assert "give either --server URL or --launch CMD, not both" in result.stderr


def test_the_rewards_of_a_running_server(tmp_path: Path) -> None:
    """``--server URL``: the policies run against a server already up (here ours, serving the
    leaky agent over v2); the leak is found there as in process."""
    from osmosis_rollout.loader import load_agent
    from osmosis_rollout.server import create_app

    from .support import serve_in_thread

    rows = str(gold_rows(tmp_path))
    app_ = create_app(load_agent(f"{AGENTS}:LeakyAgent"), shutdown_grace_s=0)
    with serve_in_thread(app_, lifespan="on") as url:
        result = CliRunner().invoke(
            app, ["validate", "--reward", "-d", rows, "--server", url, "--protocol", "v2"]
        )
    assert result.exit_code == 1, result.output
    assert "reward_leak" in result.stdout


def test_without_gold_rows_the_pass_says_what_was_not_checked(tmp_path: Path) -> None:
    """No gold replies: the checks pass a sound reward, and say that a reward always 0 would
    have passed too (nothing checked that it pays for a right answer); with gold, no note."""
    rows = tmp_path / "plain.jsonl"
    rows.write_text(json.dumps({"user_prompt": "What is 1 + 1?", "ground_truth": "2"}) + "\n")
    args = ["validate", f"{AGENTS}:SoundAgent", "--reward", "-d"]
    plain = CliRunner().invoke(app, [*args, str(rows)], env={"COLUMNS": "200"})
    assert plain.exit_code == 0, plain.output
    assert "a reward that is always 0 passes too" in plain.stdout
    gold = CliRunner().invoke(app, [*args, str(gold_rows(tmp_path))], env={"COLUMNS": "200"})
    assert gold.exit_code == 0, gold.output
    assert "always 0 passes too" not in gold.stdout
