"""The mock LLM walks the agent: one tool call a turn in a seeded order with terminal-looking
tools last, then an answer (``walk``, the default); ``--mock-policy`` picks the others; a row's
``mock_replies`` column scripts its replies; the replies depend on row, sample and seed only."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from osmosis_rollout.cli import app
from osmosis_rollout.errors import DatasetError
from osmosis_rollout.evaluation import TestOptions, run_test
from osmosis_rollout.evaluation.datasets import read_dataset
from osmosis_rollout.testing.mock_policy import POLICIES, scripted_message, tool_plan

ASSETS = Path(__file__).parent / "assets"
SUBMIT = f"{ASSETS}/walk_agents.py:SubmitAgent"
ECHO = f"{ASSETS}/walk_agents.py:EchoAgent"
NAMES = ["submit_answer", "lookup", "search", "final", "fetch_page"]


def rows_file(tmp_path: Path, rows: list[dict[str, Any]]) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def questions(tmp_path: Path, count: int = 4) -> Path:
    return rows_file(tmp_path, [{"user_prompt": f"question {i}"} for i in range(count)])


def test_walk_calls_each_tool_once_one_a_turn_terminal_ones_last() -> None:
    plan = tool_plan("walk", NAMES, seed=0, key="1")
    assert all(len(turn) == 1 for turn in plan)
    order = [NAMES[turn[0]] for turn in plan]
    assert sorted(order) == sorted(NAMES)
    assert set(order[-2:]) == {"submit_answer", "final"}


def test_walk_orders_are_seeded_by_seed_and_key_only() -> None:
    orders = {
        (seed, key): [t[0] for t in tool_plan("walk", NAMES, seed=seed, key=key)]
        for seed in range(6)
        for key in ("1", "2", "2/1")
    }
    assert orders == {
        (seed, key): [t[0] for t in tool_plan("walk", NAMES, seed=seed, key=key)]
        for seed in range(6)
        for key in ("1", "2", "2/1")
    }
    assert len({tuple(order[:3]) for order in orders.values()}) > 1  # the order varies


def test_the_other_policies() -> None:
    assert tool_plan("all", NAMES, 0, "1") == [[0, 1, 2, 3, 4]]
    assert tool_plan("first", NAMES, 0, "1") == [[0]]
    assert tool_plan("none", NAMES, 0, "1") == []
    random_plans = [tool_plan("random", NAMES, seed, "1") for seed in range(20)]
    assert all(len(p) <= len(NAMES) and all(len(t) == 1 for t in p) for p in random_plans)
    assert len({len(p) for p in random_plans}) > 1
    assert tool_plan("walk", [], 0, "1") == []


def test_the_default_mock_reaches_a_submit_terminated_agents_second_turn(tmp_path: Path) -> None:
    """The issue's case: an agent that ends at ``submit_answer`` (listed first) gets its
    lookups first; with ``--mock-policy all`` it ends in one turn, as the old mock made it."""
    rows = questions(tmp_path)
    walked = asyncio.run(run_test(TestOptions(target=SUBMIT, dataset=rows)))
    assert walked.passed
    assert all(r.turns == 3 and r.tool_calls == 3 and r.reward == 1.0 for r in walked.rows)
    at_once = asyncio.run(run_test(TestOptions(target=SUBMIT, dataset=rows, mock_policy="all")))
    assert all(r.turns == 1 and r.status == "ERROR" for r in at_once.rows)


def test_validates_dry_run_walks_the_agent() -> None:
    """``osmosis validate``'s dry run uses the walking mock: the agent that errors on a
    first-turn submission passes."""
    result = CliRunner().invoke(app, ["validate", SUBMIT])
    assert result.exit_code == 0, result.output


def test_mock_policy_on_the_command_line(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(
        app, ["test", SUBMIT, "-d", str(questions(tmp_path, 2)), "--mock-policy", "first",
              "-o", str(out)],
    )  # fmt: skip
    rows = [json.loads(line) for line in out.read_text().splitlines()][:-1]
    assert result.exit_code == 1  # `first` submits at once: the agent's error
    assert all(row["turns"] == 1 for row in rows)
    bad = CliRunner().invoke(app, ["test", SUBMIT, "-d", "x.jsonl", "--mock-policy", "greedy"])
    assert bad.exit_code == 2
    assert f"choose {', '.join(POLICIES)}" in bad.stderr


def test_a_rows_mock_replies_script_its_turns(tmp_path: Path) -> None:
    """The scripted row runs its replies (short tool-call form), the others walk; the column
    never reaches the agent's metadata."""
    script = [
        {"tool_calls": [{"name": "lookup", "arguments": {"term": "x"}}]},
        {"tool_calls": [{"name": "submit_answer", "arguments": {"answer": "42"}}]},
    ]
    rows = rows_file(tmp_path, [{"user_prompt": "a", "mock_replies": script}, {"user_prompt": "b"}])
    report = asyncio.run(run_test(TestOptions(target=SUBMIT, dataset=rows)))
    scripted, walked = report.rows
    assert scripted.turns == 2
    assert scripted.reward == 1.0
    calls = [m for m in scripted.final_messages if m.get("tool_calls")]
    assert [json.loads(c["tool_calls"][0]["function"]["arguments"]) for c in calls] == [
        {"term": "x"},
        {"answer": "42"},
    ]
    assert walked.turns == 3
    assert "mock_replies" not in scripted.metadata
    echo = asyncio.run(run_test(TestOptions(target=ECHO, dataset=rows)))
    assert [r.reward for r in echo.rows] == [1.0, 1.0]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("not json", "'mock_replies' must be a list of assistant replies"),
        ({"content": "x"}, "'mock_replies' must be a list"),
        ([3], "'mock_replies' reply 1: a reply must be a string or an object, got int"),
        ([{"tool_calls": [{"arguments": {}}]}], "reply 1: each tool call needs a name"),
        (["ok", {"text": "x"}], "reply 2: a reply has content and tool_calls only, not ['text']"),
    ],
)
def test_bad_mock_replies_are_a_clear_dataset_error(
    tmp_path: Path, value: Any, message: str
) -> None:
    rows = rows_file(tmp_path, [{"user_prompt": "a", "mock_replies": value}])
    with pytest.raises(DatasetError) as caught:
        read_dataset(rows)
    assert message in str(caught.value)


def test_mock_replies_from_a_csv_cell_are_json(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text('user_prompt,mock_replies\nhi,"[""hello""]"\n')
    (row,) = read_dataset(path).rows
    assert row.replies == ["hello"]
    assert scripted_message(row.replies[0], 0) == {"content": "hello"}


def test_two_runs_of_one_command_send_the_same_messages(tmp_path: Path) -> None:
    """The replies depend on row, sample and seed, not on a run's random rollout ids."""
    from .support import CALCULATOR, DATASET

    outputs = []
    for name in ("a", "b"):
        out = tmp_path / f"{name}.jsonl"
        asyncio.run(run_test(TestOptions(target=CALCULATOR, dataset=DATASET, seed=5, output=out)))
        rows = [json.loads(line) for line in out.read_text().splitlines()][:-1]
        outputs.append(rows)
    a, b = outputs
    assert a[0]["rollout_id"] != b[0]["rollout_id"]
    keys = ("final_messages", "prompt_tokens", "response_tokens", "reward", "turns")
    assert [[r[k] for k in keys] for r in a] == [[r[k] for k in keys] for r in b]
