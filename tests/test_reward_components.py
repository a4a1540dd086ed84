"""``ctx.complete(..., reward_components={...}, extra_fields={...})``: the reward's parts and the
agent's extra fields reach the results rows, the summary (a mean per part), the traces and the
completion callback's ``extra_fields``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from osmosis_rollout.cli import app
from osmosis_rollout.evaluation import TestOptions, run_test
from osmosis_rollout.results import result_extras

ASSETS = Path(__file__).parent / "assets"
PARTS = f"{ASSETS}/component_agents.py:PartsAgent"


def rows(tmp_path: Path) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"user_prompt": f"q{i}", "even": i % 2 == 0}) + "\n"
                            for i in range(4)))  # fmt: skip
    return path


def test_reward_components_reach_every_output(tmp_path: Path) -> None:
    out, traces = tmp_path / "out.jsonl", tmp_path / "traces"
    result = CliRunner().invoke(
        app, ["test", PARTS, "-d", str(rows(tmp_path)), "-o", str(out), "--json",
              "--debug-dir", str(traces)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["reward_components"] == {"format": 0.2, "correctness": 0.5}
    assert "reward parts" in result.stderr
    assert "correctness 0.5" in result.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()][:-1]
    assert [r["reward_components"] for r in lines] == [
        {"format": 0.2, "correctness": c} for c in (1.0, 0.0, 1.0, 0.0)
    ]
    assert lines[0]["extra_fields"] == {
        "judge": "exact-match",
        "reward_components": {"format": 0.2, "correctness": 1.0},
    }
    end = next(
        json.loads(line)
        for line in (tmp_path / lines[0]["trace"]).read_text().splitlines()
        if '"rollout_end"' in line
    )
    assert end["extra_fields"]["reward_components"] == {"format": 0.2, "correctness": 1.0}


def test_a_component_that_is_not_a_number_fails_the_rollout_clearly(tmp_path: Path) -> None:
    options = TestOptions(
        target=f"{ASSETS}/component_agents.py:BadPartsAgent", dataset=rows(tmp_path)
    )
    report = asyncio.run(run_test(options))
    row = report.rows[0]
    assert row.status == "ERROR"
    assert row.error_message is not None
    assert "reward_components['format'] must be a finite number, got 'good'" in row.error_message


@pytest.mark.parametrize("value", [float("nan"), float("inf"), True, None, "1"])
def test_result_extras_refuses_what_is_not_a_finite_number(value: object) -> None:
    with pytest.raises(TypeError, match=r"reward_components\['x'\] must be a finite number"):
        result_extras(None, {"x": value})


def test_result_extras_keeps_the_extra_fields() -> None:
    assert result_extras({"a": 1}, {"f": 1}) == {"a": 1, "reward_components": {"f": 1.0}}
    assert result_extras({"a": 1}, None) == {"a": 1}
