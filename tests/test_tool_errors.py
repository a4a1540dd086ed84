"""Tool errors are results: a tool that raises or times out is counted per rollout and per
tool in every output of ``osmosis test``, named by run findings, and fails its rows with
``--fail-on tool_errors``; an agent that blocks the event loop is named with its line."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from osmosis_rollout.cli import app
from osmosis_rollout.evaluation import TestOptions, run_test
from osmosis_rollout.evaluation.tool_errors import run_findings

ASSETS = Path(__file__).parent / "assets"
SQLITE = f"{ASSETS}/sqlite_agent.py:SqliteAgent"
TOOLS = ["list_tables", "describe_table", "run_query", "submit_answer"]


def rows_file(tmp_path: Path, count: int = 5) -> Path:
    path = tmp_path / "rows.jsonl"
    lines = [
        json.dumps({"user_prompt": f"How many people live in city {i}?"}) for i in range(count)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def run_cli(*args: str) -> Any:
    return CliRunner().invoke(app, ["test", *args])


def test_the_sqlite_agent_shows_its_tool_errors_in_every_output(tmp_path: Path) -> None:
    """The issue's four-tool SQLite agent: every call raises in its worker thread. The table,
    the summary, ``--json``, ``--output`` and the traces all say so, and each tool gets a
    ``tool_always_fails`` run finding; the rows still pass (the rollouts completed)."""
    output, traces = tmp_path / "out.jsonl", tmp_path / "traces"
    result = run_cli(
        SQLITE, "-d", str(rows_file(tmp_path)), "--json", "-o", str(output),
        "--debug-dir", str(traces),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    called = summary["tools"]
    assert set(called) <= set(TOOLS)
    assert called
    assert all(t["errors"] == t["calls"] > 0 for t in called.values())
    assert summary["tool_errors"] == summary["tool_calls"] > 0
    always = [f for f in summary["run_findings"] if f["code"] == "tool_always_fails"]
    assert sorted(f["details"]["tool"] for f in always) == sorted(called)
    assert "failed in every one of its" in always[0]["message"]
    # each finding quotes the tool's first error as the model read it: no second run needed
    for finding in always:
        first = finding["details"]["first_error"]
        assert first.startswith("Error: "), first
        assert f'the first: "{first}"' in finding["message"]
        assert len(first) <= 240
    assert "tool_always_fails" in result.stderr  # the summary table
    assert "none in the rows; 4 run finding(s) below" in result.stderr
    assert "err)" in result.stderr  # the rows table: "4 (4 err)"
    lines = [json.loads(line) for line in output.read_text().splitlines()]
    rows, closing = lines[:-1], lines[-1]
    assert len(rows) == 5
    assert closing["run_findings"] == summary["run_findings"]
    for row in rows:
        assert row["passed"] is True
        assert sum(row["tool_errors"].values()) == row["tool_calls"] > 0
        assert set(row["tool_errors"]) <= set(TOOLS)
    trace = next(traces.glob("*.jsonl")).read_text().splitlines()
    events = [json.loads(line) for line in trace]
    calls = [e for e in events if e["event"] == "tool_call"]
    assert calls
    assert all(e["failed"] == "raised" for e in calls)
    assert "ProgrammingError" in calls[0]["error"]
    end = next(e for e in events if e["event"] == "rollout_end")
    assert all(c[1] == c[0] for c in end["metrics"]["tool_counts"].values())


def test_fail_on_tool_errors_fails_the_rows_whose_tools_failed(tmp_path: Path) -> None:
    """``--fail-on tool_errors``: each row with a failed call gets a ``tool_errors`` finding
    naming the tools, and the run exits 1."""
    output = tmp_path / "out.jsonl"
    result = run_cli(
        SQLITE, "-d", str(rows_file(tmp_path, 3)), "--fail-on", "tool_errors", "-o", str(output)
    )
    assert result.exit_code == 1, result.output
    rows = [json.loads(line) for line in output.read_text().splitlines()][:-1]
    assert all(not row["passed"] for row in rows)
    finding = rows[0]["findings"][0]
    assert finding["code"] == "tool_errors"
    assert "raised or timed out" in finding["message"]
    assert set(finding["details"]["tool_errors"]) <= set(TOOLS)


def test_fail_on_refuses_what_it_does_not_know(tmp_path: Path) -> None:
    result = run_cli(SQLITE, "-d", str(rows_file(tmp_path, 1)), "--fail-on", "tool_error")
    assert result.exit_code == 2
    assert "--fail-on 'tool_error'" in result.stderr
    assert "tool_errors" in result.stderr
    assert "Traceback" not in result.output


def test_a_calculator_whose_tools_work_has_no_tool_errors(tmp_path: Path) -> None:
    from .support import CALCULATOR, DATASET

    report = asyncio.run(
        run_test(TestOptions(target=CALCULATOR, dataset=DATASET, fail_on=("tool_errors",)))
    )
    assert report.passed
    assert report.summary["tool_errors"] == 0
    assert report.summary["run_findings"] == []


def test_a_tool_failing_in_a_large_share_of_its_calls_is_a_finding() -> None:
    totals = {
        "flaky": {"calls": 10, "errors": 3, "timeouts": 1},
        "fine": {"calls": 10, "errors": 1, "timeouts": 0},
        "dead": {"calls": 4, "errors": 4, "timeouts": 4},
    }
    findings = {f.details["tool"]: f for f in run_findings(totals, share=0.2) if f.details}
    assert set(findings) == {"flaky", "dead"}
    assert findings["flaky"].code == "tool_error_share"
    assert "3 of its 10 calls (30%, over 20%; 2 raised, 1 timed out)" in findings["flaky"].message
    assert findings["dead"].code == "tool_always_fails"
    assert "(timed out)" in findings["dead"].message
    assert run_findings(totals, share=0.5)[0].details == totals["dead"] | {"tool": "dead"}


BLOCKING = """
import time
from osmosis_rollout import RolloutAgentLoop


class Blocking(RolloutAgentLoop):
    name = "blocking"

    def get_tools(self, request):
        return []

    async def run(self, ctx):
        result = await ctx.chat(list(ctx.request.messages))
        if ctx.request.metadata.get("block"):
            time.sleep(0.4)  # blocks every rollout
        return ctx.complete([*ctx.request.messages, result.message], reward=1.0)
"""


def test_an_agent_that_blocks_the_event_loop_is_named_with_its_line(tmp_path: Path) -> None:
    """A ``time.sleep`` in ``run``: an ``event_loop_stall`` finding on that rollout, naming
    the line and how long; the rollouts that did not block have none."""
    agent = tmp_path / "blocking.py"
    agent.write_text(BLOCKING)
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "\n".join(json.dumps({"user_prompt": f"q{i}", "block": i == 1}) for i in range(4)) + "\n"
    )
    report = asyncio.run(run_test(TestOptions(target=f"{agent}:Blocking", dataset=rows)))
    by_row = {r.index: r for r in report.rows}
    stalls = [f for f in by_row[2].findings if f.code == "event_loop_stall"]
    assert len(stalls) == 1, by_row[2].findings
    assert stalls[0].rollout_id == by_row[2].rollout_id
    assert "blocking.py:15 in run" in stalls[0].message
    assert stalls[0].details is not None
    assert stalls[0].details["stall_s"] >= 0.3
    assert all(not r.findings for i, r in by_row.items() if i != 2)
    assert report.summary["findings"] == {"event_loop_stall": 1}


EVERY_ROW_BLOCKS = """
import time
from osmosis_rollout import RolloutAgentLoop


class Sleepy(RolloutAgentLoop):
    name = "sleepy"

    def get_tools(self, request):
        return []

    async def run(self, ctx):
        time.sleep(0.3)  # before the first await: every rollout blocks in the loop's first turn
        result = await ctx.chat(list(ctx.request.messages))
        return ctx.complete([*ctx.request.messages, result.message], reward=1.0)
"""


def test_every_rollout_that_blocks_in_the_same_turn_of_the_loop_is_named(tmp_path: Path) -> None:
    """A cold trial: ``time.sleep(0.3)`` before the first ``ctx.chat`` blocks every rollout
    in the loop's first turn, one after the other; three runs of four reported none. Each row
    gets its own finding, naming the line."""
    agent = tmp_path / "sleepy.py"
    agent.write_text(EVERY_ROW_BLOCKS)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"user_prompt": f"q{i}"}) + "\n" for i in range(4)))
    report = asyncio.run(run_test(TestOptions(target=f"{agent}:Sleepy", dataset=rows)))
    assert report.summary["findings"] == {"event_loop_stall": 4}
    for row in report.rows:
        (stall,) = row.findings
        assert "sleepy.py:13 in run" in stall.message
        assert stall.details is not None
        assert stall.details["stall_s"] >= 0.2


BUSY = """
import time
from osmosis_rollout import RolloutAgentLoop


class Busy(RolloutAgentLoop):
    name = "busy"

    def get_tools(self, request):
        return []

    async def run(self, ctx):
        result = await ctx.chat(list(ctx.request.messages))
        if ctx.request.metadata.get("block"):
            end = time.thread_time() + 0.4
            while time.thread_time() < end:  # computes, holding the loop
                pass
        return ctx.complete([*ctx.request.messages, result.message], reward=1.0)
"""


def test_cpu_bound_code_that_holds_the_loop_is_a_stall_too(tmp_path: Path) -> None:
    """A long computation in ``run`` (the thread running, not sleeping) is named the same way."""
    agent = tmp_path / "busy.py"
    agent.write_text(BUSY)
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"user_prompt": "q", "block": True}) + "\n")
    report = asyncio.run(run_test(TestOptions(target=f"{agent}:Busy", dataset=rows)))
    (finding,) = report.rows[0].findings
    assert finding.code == "event_loop_stall"
    assert re.search(r"busy\.py:1[56] in run", finding.message)  # the loop's line
