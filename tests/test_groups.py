"""``osmosis test --samples N``: per group mean, spread, min and max, the unbiased pass@k for
k = 1..N and the no-signal share, in the summary, ``--json``, ``--output`` and ``--by``;
checked against a brute-force reference on an agent whose outcomes are scripted."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from osmosis_rollout.cli import app
from osmosis_rollout.errors import ConfigError
from osmosis_rollout.evaluation import TestOptions, run_test
from osmosis_rollout.evaluation.groups import pass_at_k

ASSETS = Path(__file__).parent / "assets"
OUTCOMES = f"{ASSETS}/group_agents.py:OutcomeAgent"


def outcome_rows(n: int, count: int = 12, seed: int = 7) -> list[dict[str, Any]]:
    """Rows whose samples score known rewards: some always 1, some always 0, some mixed, a few
    without a reward; every third row is 'hard'."""
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        kind = i % 4
        if kind == 0:
            outcomes: list[float | None] = [1.0] * n
        elif kind == 1:
            outcomes = [0.0] * n
        else:
            outcomes = [rng.choice([0.0, 0.5, 1.0, 1.0, None]) for _ in range(n)]
        difficulty = "hard" if i % 3 == 0 else "easy"
        rows.append({"user_prompt": f"q{i}", "outcomes": outcomes, "difficulty": difficulty})
    return rows


def reference_pass_at_k(outcomes: list[float | None], k: int, threshold: float) -> float:
    """The share of k-subsets of the samples holding a pass: what pass@k estimates."""
    passing = [r is not None and r >= threshold for r in outcomes]
    subsets = list(itertools.combinations(range(len(outcomes)), k))
    return sum(any(passing[i] for i in subset) for subset in subsets) / len(subsets)


def reference(rows: list[dict[str, Any]], n: int, threshold: float) -> dict[str, Any]:
    groups = [row["outcomes"] for row in rows]
    silent = [i + 1 for i, g in enumerate(groups) if len(set(g)) == 1]
    return {
        "pass_at_k": {
            str(k): sum(reference_pass_at_k(g, k, threshold) for g in groups) / len(groups)
            for k in range(1, n + 1)
        },
        "no_signal_rows": silent,
        "no_signal_share": len(silent) / len(groups),
    }


def write(tmp_path: Path, rows: list[dict[str, Any]]) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("n", [1, 4, 16])
def test_pass_at_k_and_no_signal_match_a_reference(tmp_path: Path, n: int) -> None:
    rows = outcome_rows(n, count=8 if n == 16 else 12)
    for threshold in (1.0, 0.5):
        options = TestOptions(
            target=OUTCOMES, dataset=write(tmp_path, rows), samples=n, pass_threshold=threshold
        )
        report = asyncio.run(run_test(options))
        assert len(report.rows) == len(rows) * n
        groups = report.summary["groups"]
        expected = reference(rows, n, threshold)
        assert groups["samples"] == n
        assert groups["groups"] == len(rows)
        assert groups["pass_threshold"] == threshold
        assert groups["pass_at_k"].keys() == expected["pass_at_k"].keys()
        for k, value in expected["pass_at_k"].items():
            assert groups["pass_at_k"][k] == pytest.approx(value, abs=1e-6), k
        assert groups["no_signal_rows"] == expected["no_signal_rows"]
        assert groups["no_signal_share"] == pytest.approx(expected["no_signal_share"], abs=1e-6)


def test_each_group_s_figures_in_the_output_file(tmp_path: Path) -> None:
    """``--output``: every rollout line names its group and sample; one group line per row
    with its rewards, mean, spread, min, max and pass@k; the summary closes the file."""
    rows = outcome_rows(4, count=4)
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(
        app,
        ["test", OUTCOMES, "-d", str(write(tmp_path, rows)), "--samples", "4", "-o", str(out),
         "--json", "--pass-threshold", "0.5"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    rollouts = [line for line in lines if line["type"] == "row"]
    groups = [line for line in lines if line["type"] == "group"]
    assert [(r["group"], r["sample"]) for r in rollouts] == [
        (g, s) for g in range(1, 5) for s in range(4)
    ]
    assert [r["reward"] for r in rollouts] == [x for row in rows for x in row["outcomes"]]
    assert lines[-1]["type"] == "summary"
    assert [g["row"] for g in groups] == [1, 2, 3, 4]
    for group, row in zip(groups, rows, strict=True):
        scored = [r for r in row["outcomes"] if r is not None]
        assert group["rewards"] == row["outcomes"]
        if scored:
            mean = sum(scored) / len(scored)
            spread = math.sqrt(sum((r - mean) ** 2 for r in scored) / len(scored))
            assert group["mean"] == pytest.approx(mean, abs=1e-6)
            assert group["spread"] == pytest.approx(spread, abs=1e-6)
            assert group["min"] == min(scored)
            assert group["max"] == max(scored)
        for k in range(1, 5):
            ref = reference_pass_at_k(row["outcomes"], k, 0.5)
            assert group["pass_at_k"][str(k)] == pytest.approx(ref, abs=1e-6)
        assert group["no_signal"] == (len(set(row["outcomes"])) == 1)
    assert json.loads(result.stdout)["groups"] == lines[-1]["groups"]
    assert "pass@1" in result.stderr  # the summary table
    # "passed" is the protocol's verdict, pass@k the rewards': the table says which is which
    assert "(no error or finding; pass@k counts rewards)" in result.stderr
    assert "no signal" in result.stderr
    assert "rows 1, 2" in result.stderr  # the no-signal rows named


def test_by_breaks_every_figure_down_by_a_column(tmp_path: Path) -> None:
    rows = outcome_rows(4, count=9)
    options = TestOptions(
        target=OUTCOMES, dataset=write(tmp_path, rows), samples=4, by="difficulty"
    )
    groups = asyncio.run(run_test(options)).summary["groups"]
    by = groups["by"]
    assert by["column"] == "difficulty"
    assert set(by["values"]) == {"easy", "hard"}
    for value, part in by["values"].items():
        chosen = [r for r in rows if r["difficulty"] == value]
        expected = reference(chosen, 4, 1.0)
        assert part["groups"] == len(chosen)
        for k, v in expected["pass_at_k"].items():
            assert part["pass_at_k"][k] == pytest.approx(v, abs=1e-6)
        assert part["no_signal_share"] == pytest.approx(expected["no_signal_share"], abs=1e-6)


def test_by_a_column_no_row_has_is_a_clear_error(tmp_path: Path) -> None:
    rows = write(tmp_path, outcome_rows(1, count=2))
    with pytest.raises(ConfigError, match="--by 'level': no row has that column"):
        asyncio.run(run_test(TestOptions(target=OUTCOMES, dataset=rows, by="level")))
    result = CliRunner().invoke(app, ["test", OUTCOMES, "-d", str(rows), "--by", "level"])
    assert result.exit_code == 2
    assert "difficulty, outcomes" in result.stderr


def test_samples_are_seeded_apart(tmp_path: Path) -> None:
    """The mock's tool arguments differ between a row's samples, and are the same again in a
    second run."""
    from .support import CALCULATOR, DATASET

    def arguments() -> list[str]:
        options = TestOptions(target=CALCULATOR, dataset=DATASET, limit=1, samples=3)
        report = asyncio.run(run_test(options))
        return [
            json.dumps([m.get("tool_calls") for m in r.final_messages if m.get("tool_calls")])
            for r in report.rows
        ]

    first = arguments()
    assert len(set(first)) == 3
    assert arguments() == first


def test_samples_with_jobs_give_the_same_groups(tmp_path: Path) -> None:
    """``--jobs 2``: the same rollouts in the same order, the same group figures."""
    rows = write(tmp_path, outcome_rows(4, count=6))
    outputs = []
    for jobs in ("1", "2"):
        out = tmp_path / f"out{jobs}.jsonl"
        result = CliRunner().invoke(
            app,
            ["test", OUTCOMES, "-d", str(rows), "--samples", "4", "--jobs", jobs, "-o", str(out)],
        )
        assert result.exit_code == 0, result.output
        lines = [json.loads(line) for line in out.read_text().splitlines()]
        outputs.append(
            (
                [(r["row"], r["sample"], r["reward"]) for r in lines if r["type"] == "row"],
                [g for g in lines if g["type"] == "group"],
                lines[-1]["groups"],
            )
        )
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize("flag", [["--samples", "4"], ["--by", "difficulty"], ["--resume"]])
def test_batch_only_flags_are_refused_with_interactive(flag: list[str]) -> None:
    result = CliRunner().invoke(app, ["test", OUTCOMES, "-i", *flag])
    assert result.exit_code == 2
    assert f"{flag[0]} works only in batch mode, not with --interactive" in result.stderr


def test_the_unbiased_estimator() -> None:
    assert pass_at_k(4, 0, 1) == 0.0
    assert pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(10, 3, 2) == pytest.approx(1 - math.comb(7, 2) / math.comb(10, 2))
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(3, 1, 4)


def test_samples_are_recorded_and_each_replayed_as_recorded(tmp_path: Path) -> None:
    """``--samples 3 --record``: every sample is a row of the cassette (its ``sample`` kept);
    ``--replay`` runs them all, each sample bound to its own recording, whatever order the
    rollouts start in; asking for another number of samples says how many it holds."""
    from .support import CALCULATOR, DATASET

    cassette = tmp_path / "samples.jsonl"
    recorded = asyncio.run(
        run_test(
            TestOptions(target=CALCULATOR, dataset=DATASET, limit=2, samples=3, record=cassette)
        )
    )
    replayed = asyncio.run(run_test(TestOptions(target=CALCULATOR, replay=cassette, samples=3)))

    def by_sample(report: Any) -> dict[tuple[int, int], Any]:
        return {(r.index, r.sample): (r.status, r.final_messages) for r in report.rows}

    assert len(recorded.rows) == 6
    assert len({json.dumps(m) for _, m in by_sample(recorded).values()}) > 2  # samples differ
    assert by_sample(replayed) == by_sample(recorded)
    assert replayed.summary["passed"] == 6, [r.findings for r in replayed.rows]
    assert (replayed.summary["groups"]["groups"], replayed.summary["groups"]["samples"]) == (2, 3)
    with pytest.raises(ConfigError, match="holds 3 sample"):
        asyncio.run(run_test(TestOptions(target=CALCULATOR, replay=cassette, samples=2)))
