"""``osmosis_rollout.evaluation.run_test``, the Python twin of ``osmosis test``: the same rows
give the same report as the command, and the command is a thin layer over it."""

from __future__ import annotations

import asyncio
import base64
import html
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from osmosis_rollout.cli import app
from osmosis_rollout.evaluation import RunObserver, TestOptions, TestReport, run_test
from osmosis_rollout.evaluation.runner import RowResult

from .leaks import NASTY_KEY, every_form_absent, written_text
from .openai_stub import OpenAIStub, text

ROOT = Path(__file__).resolve().parent.parent
CALCULATOR = f"{ROOT}/examples/calculator/agent.py:CalculatorAgent"
DATASET = ROOT / "examples/calculator/dataset.jsonl"
REWRITES = f"{ROOT}/tests/assets/bad_agents.py:RewritesHistoryAgent"

#: Summary figures that differ between any two runs: timings, and token estimates (from the
#: text, which holds random rollout and tool-call ids).
TIMED = (
    "latency_ms_p50",
    "latency_ms_p95",
    "wall_s",
    "rollouts_per_s",
    "prompt_tokens",
    "response_tokens",
)


def untimed(summary: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in summary.items() if key not in TIMED}


def row_outcome(row: dict[str, Any]) -> tuple[Any, ...]:
    """What a results row says about its rollout, without ids, traces and timings."""
    findings = sorted(f["code"] for f in row["findings"])
    return row["row"], row["status"], row["reward"], row["turns"], row["tool_calls"], findings


@pytest.mark.parametrize("target", [CALCULATOR, REWRITES], ids=["passes", "findings"])
def test_run_test_reports_what_osmosis_test_reports(tmp_path: Path, target: str) -> None:
    """The same dataset through ``run_test`` and through ``osmosis test --json -o``: the same
    summary (but its timings), the same rows with the same findings, the same exit status."""
    limit = 4
    ours = tmp_path / "ours.jsonl"
    options = TestOptions(target=target, dataset=DATASET, limit=limit, seed=3, output=ours)
    report = asyncio.run(run_test(options))
    theirs = tmp_path / "theirs.jsonl"
    args = [target, "-d", str(DATASET), "--limit", str(limit), "--seed", "3"]
    result = CliRunner().invoke(app, ["test", *args, "-o", str(theirs), "--json"])

    assert result.exit_code == report.exit_code, result.stderr
    assert untimed(json.loads(result.stdout)) == untimed(report.summary)
    assert [r.index for r in report.rows] == list(range(1, limit + 1))
    our_rows = [json.loads(line) for line in ours.read_text().splitlines()]
    their_rows = [json.loads(line) for line in theirs.read_text().splitlines()]
    assert [row_outcome(r) for r in our_rows[:-1]] == [row_outcome(r) for r in their_rows[:-1]]
    assert [row_outcome(r.as_dict()) for r in report.rows] == [
        row_outcome(r) for r in their_rows[:-1]
    ]
    assert [f.code for f in report.findings] == [
        code for r in their_rows[:-1] for code in sorted(f["code"] for f in r["findings"])
    ]
    if target == CALCULATOR:
        assert report.passed
        assert report.exit_code == 0
        assert report.findings == []
    else:
        assert not report.passed
        assert report.exit_code == 1
        assert {f.code for f in report.findings} == {"history_rewritten"}


@pytest.mark.anyio
async def test_an_observer_sees_each_row_as_it_finishes() -> None:
    """``RunObserver.batch`` is entered around the rows and told of each one, which is how the
    command draws its progress bar."""
    seen: list[int] = []

    class Watch(RunObserver):
        def batch(self, total: int, *, workers: int | None, concurrency: int) -> Any:
            import contextlib

            assert (total, workers, concurrency) == (3, None, 2)
            return contextlib.nullcontext(lambda row: seen.append(row.index))

    report = await run_test(
        TestOptions(target=CALCULATOR, dataset=DATASET, limit=3, concurrency=2), Watch()
    )
    assert sorted(seen) == [1, 2, 3]
    assert isinstance(report, TestReport)
    assert all(isinstance(r, RowResult) for r in report.rows)


def test_options_are_frozen_and_named_like_the_command_options() -> None:
    """``TestOptions`` cannot change under a run, and each field is one of the command's
    options (``--llm-url`` is ``llm_url``)."""
    import dataclasses

    options = TestOptions(target=CALCULATOR)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.jobs = 2  # type: ignore[misc]
    help_text = CliRunner().invoke(app, ["test", "--help"], env={"COLUMNS": "200"}).output
    for field in dataclasses.fields(TestOptions):
        if field.name != "target":
            assert f"--{field.name.replace('_', '-')}" in help_text, field.name


def test_skip_bad_rows_is_an_option_of_run_test(tmp_path: Path) -> None:
    """TestOptions(skip_bad_rows=True): the good rows run, the summary counts the bad ones."""
    good = DATASET.read_text().splitlines()[0]
    path = tmp_path / "rows.jsonl"
    path.write_text(f'{good}\n{{"user_prompt": 5}}\n')
    warned: list[str] = []

    class Notes(RunObserver):
        def warn(self, message: str) -> None:
            warned.append(message)

    options = TestOptions(target=CALCULATOR, dataset=path, skip_bad_rows=True)
    report = asyncio.run(run_test(options, Notes()))

    assert [row.index for row in report.rows] == [1]
    assert report.summary["bad_rows_skipped"] == 1
    assert report.passed
    assert warned == [
        "skipping 1 bad row(s) of rows.jsonl:\n"
        "  row 2, column 'user_prompt': must be a string, got a number (5) (line 2)"
    ]


def test_the_llm_key_is_in_no_result_trace_or_cassette(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An LLM that echoes its key (raw, HTML-escaped, base64) into the conversation: the
    results file, the debug traces and the cassette hold none of its forms."""
    key = NASTY_KEY
    echoed = f"my key is {key} or {html.escape(key)} or {base64.b64encode(key.encode()).decode()}"
    stub = OpenAIStub(responder=lambda request: text(echoed))
    monkeypatch.setenv("OPENAI_API_KEY", key)
    out = tmp_path / "out"
    with stub.serve() as base_url:
        options = TestOptions(
            target=CALCULATOR,
            dataset=DATASET,
            limit=1,
            llm="openai",
            llm_url=base_url,
            model="stub-model",
            output=out / "results.jsonl",
            debug_dir=out / "traces",
            record=out / "run.cassette.jsonl",
        )
        report = asyncio.run(run_test(options, RunObserver()))
    assert report.rows
    assert stub.requests  # the LLM was asked, and answered with the key
    written = written_text(out)
    assert "my key is" in written
    assert every_form_absent(written, key) == []
