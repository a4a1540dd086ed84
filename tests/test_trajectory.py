"""Full trajectories: every turn, tool call, finding and result in the trace, and read back."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from prompt_toolkit import PromptSession
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput
from rich.console import Console
from typer.testing import CliRunner

from osmosis_rollout import RolloutAgentLoop, RolloutContext, RolloutRequest, RolloutResult
from osmosis_rollout.cli import app
from osmosis_rollout.evaluation.runner import RowInput
from osmosis_rollout.repl import run_repl
from osmosis_rollout.repl.views import message_view
from osmosis_rollout.testing import Harness, ScriptedBackend
from osmosis_rollout.tools import Toolbox
from osmosis_rollout.tracing import MAX_TRACED_TEXT, TRACE_VERSION
from osmosis_rollout.trajectory import parse_trace, read_trace

from .support import load_asset, load_path

ROOT = Path(__file__).resolve().parent.parent
CALCULATOR = f"{ROOT}/examples/calculator/agent.py:CalculatorAgent"
SYSTEM = {"role": "system", "content": "You are a careful calculator."}
QUESTION = [SYSTEM, {"role": "user", "content": "What is (12 + 30) * 2?"}]


def call(name: str, call_id: str, **arguments: Any) -> dict[str, Any]:
    """An assistant reply asking for one tool call."""
    return {
        "content": None,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        ],
    }


THREE_TURNS = [call("add", "c1", a=12, b=30), call("multiply", "c2", a=42, b=2), {"content": "84"}]


def calculator() -> Any:
    """examples/calculator/agent.py:CalculatorAgent, freshly imported."""
    path = ROOT / "examples" / "calculator" / "agent.py"
    return load_path(path, "trajectory_example_calculator").CalculatorAgent()


pytestmark = pytest.mark.anyio


async def test_trace_holds_every_turn_tool_call_and_the_result(tmp_path: Path) -> None:
    """Each turn's delta, reply, finish reason, usage and latency; each tool call's arguments,
    result and latency; the reward and final messages, all under the current version."""
    async with Harness(
        calculator(), backend=ScriptedBackend(THREE_TURNS), debug_dir=tmp_path
    ) as harness:
        outcome = await harness.run(QUESTION, rollout_id="r-1", metadata={"ground_truth": "84"})
        path = harness.trace_path("r-1")
    assert path is not None
    assert outcome.result is not None
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert {r["v"] for r in records} == {TRACE_VERSION}
    assert [r["event"] for r in records] == [
        "rollout_start",
        "turn",
        "tool_call",
        "turn",
        "tool_call",
        "turn",
        "rollout_end",
    ]
    start = records[0]
    assert start["metadata"] == {"ground_truth": "84"}
    assert start["tools"] == ["add", "subtract", "multiply", "divide"]

    trajectory = read_trace(path)
    assert trajectory.rollout_id == "r-1"
    assert trajectory.bad_lines == 0
    first, second, third = trajectory.turns
    assert first.new_messages == QUESTION  # the first turn adds the whole prompt
    assert first.delta_from == 0
    assert first.finish_reason == "tool_calls"
    assert first.reply is not None
    assert first.reply["tool_calls"][0]["function"]["name"] == "add"
    assert first.usage["prompt_tokens"] > 0
    assert first.latency_ms >= 0
    (add,) = first.tool_calls
    assert (add.tool, add.tool_call_id, add.result, add.error) == ("add", "c1", "42.0", None)
    assert json.loads(add.arguments) == {"a": 12, "b": 30}
    # later turns add only what is new: the tool result after the previous reply
    assert second.delta_from == 3
    assert second.new_messages == [{"role": "tool", "tool_call_id": "c1", "content": "42.0"}]
    assert second.tool_calls[0].result == "84.0"
    assert third.reply == {"role": "assistant", "content": "84"}
    assert third.finish_reason == "stop"
    assert third.tool_calls == []
    assert trajectory.end is not None
    assert trajectory.end["reward"] == outcome.result.reward
    assert trajectory.end["status"] == "COMPLETED"
    # the deltas rebuild exactly what the agent returned
    assert trajectory.messages() == outcome.result.final_messages


class BigOutputAgent(RolloutAgentLoop):
    """Calls a tool whose result is far longer than a trace keeps."""

    name = "big-output"

    def __init__(self) -> None:
        self.toolbox = Toolbox([self.dump])

    def dump(self, n: int) -> str:
        """Return n characters.

        Args:
            n: How many.
        """
        return "x" * n

    def get_tools(self, request: RolloutRequest) -> list[Any]:
        return self.toolbox.schemas

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = list(ctx.request.messages)
        result = await ctx.chat(messages)
        messages.append(result.message)
        messages.extend(await self.toolbox.execute(ctx, result.tool_calls))
        return ctx.complete(messages)


async def test_tool_results_are_clipped_in_traces_but_not_in_results(tmp_path: Path) -> None:
    """A huge tool output is cut to MAX_TRACED_TEXT in the trace, with its full length noted;
    the rollout's own final messages keep all of it."""
    size = MAX_TRACED_TEXT * 3
    backend = ScriptedBackend([call("dump", "c1", n=size)])
    async with Harness(BigOutputAgent(), backend=backend, debug_dir=tmp_path) as harness:
        outcome = await harness.run(QUESTION, rollout_id="big")
        path = harness.trace_path("big")
    assert path is not None
    assert outcome.result is not None
    (tool,) = read_trace(path).turns[0].tool_calls
    assert tool.result == "x" * MAX_TRACED_TEXT
    assert tool.result_chars == size
    assert outcome.result.final_messages[-1]["content"] == "x" * size


async def test_findings_are_traced_at_the_turn_they_happened(tmp_path: Path) -> None:
    """A history rewrite at turn 2 shows as a finding on turn 2, after the end of the rollout."""
    agent = load_asset("fnd_history").DropsMessageAgent()
    async with Harness(agent, backend=ScriptedBackend([]), debug_dir=tmp_path) as harness:
        outcome = await harness.run(QUESTION, rollout_id="rw")
        path = harness.trace_path("rw")
    assert path is not None
    assert [f.code for f in outcome.findings] == ["history_rewritten"]
    trajectory = read_trace(path)
    assert [f["code"] for f in trajectory.findings] == ["history_rewritten"]
    assert trajectory.turns[1].findings == trajectory.findings
    assert trajectory.turns[0].findings == []
    # after a rewrite the turn's delta is the whole history again
    assert trajectory.turns[1].delta_from == 0
    assert trajectory.turns[1].new_messages[0] == SYSTEM


def test_a_trace_cut_mid_line_still_reads() -> None:
    """A crash mid-write leaves a broken last line: it is counted, the rest is kept."""
    lines = [
        json.dumps({"v": 2, "event": "rollout_start", "rollout_id": "r"}),
        json.dumps({"v": 2, "event": "turn", "turn": 1, "messages": [SYSTEM], "reply": {}}),
        '{"v": 2, "event": "tool_ca',
    ]
    trajectory = parse_trace(lines)
    assert trajectory.bad_lines == 1
    assert len(trajectory.turns) == 1
    assert trajectory.end is None


async def test_trace_replays_into_the_transcript_the_repl_showed(tmp_path: Path) -> None:
    """Step through a three-turn tool-calling rollout in the REPL with a debug dir; rendering
    each traced turn's new messages and reply the REPL's way gives what the REPL printed."""
    screen_file = _Screen()
    row = RowInput(1, QUESTION, {"ground_truth": "84"})
    with create_pipe_input() as pipe:
        session: PromptSession[str] = PromptSession(input=pipe, output=DummyOutput())
        pipe.send_text("1\nn\nn\nn\nq\n")
        with anyio.fail_after(20):
            code = await run_repl(
                calculator(),
                backend=ScriptedBackend(THREE_TURNS),
                rows=[row],
                start_row=1,
                session=session,
                console=Console(file=screen_file, width=120),
                debug_dir=tmp_path,
            )
    assert code == 0
    shown = screen_file.getvalue()
    (name,) = os.listdir(tmp_path)
    trace = tmp_path / name
    trajectory = read_trace(trace)
    assert len(trajectory.turns) == 3
    position = 0
    for turn in trajectory.turns:
        assert turn.reply is not None
        for message in [*turn.new_messages, turn.reply]:
            limit = None if message is turn.reply else 400
            rendered = _render(message_view(message, limit=limit))
            found = shown.find(rendered, position)
            assert found >= 0, f"turn {turn.number}: {rendered!r} not shown in order"
            position = found + len(rendered)


class _Screen:
    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        self.parts.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def getvalue(self) -> str:
        return "".join(self.parts)


def _render(renderable: Any) -> str:
    console = Console(width=120, record=True, file=_Screen())
    console.print(renderable)
    return console.export_text().rstrip("\n")


# -- osmosis test --output --------------------------------------------------------------------


def test_output_rows_keep_dataset_order_and_link_their_trace(tmp_path: Path) -> None:
    """Rows that finish out of order are still written in dataset order, each with its
    ground_truth, metadata and a trace path relative to the results file."""
    dataset = tmp_path / "rows.jsonl"
    rows = [
        {"user_prompt": f"What is {i} + {i}?", "ground_truth": str(2 * i), "tag": f"t{i}"}
        for i in range(1, 9)
    ]
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out" / "results.jsonl"
    agent = f"{ROOT}/tests/assets/trajectory_agents.py:SlowFirstRowsAgent"
    result = CliRunner().invoke(
        app,
        ["test", agent, "-d", str(dataset), "-o", str(out), "--debug-dir", str(tmp_path / "tr")],
    )
    assert result.exit_code == 0, result.stdout + result.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    written = [line for line in lines if line["type"] == "row"]
    assert [r["row"] for r in written] == list(range(1, 9))
    for row, source in zip(written, rows, strict=True):
        assert row["ground_truth"] == source["ground_truth"]
        assert row["metadata"]["tag"] == source["tag"]
        trace = (out.parent / row["trace"]).resolve()
        assert trace.parent == (tmp_path / "tr").resolve()
        assert read_trace(trace).rollout_id == row["rollout_id"]
    assert list(lines[0])[-1] == "final_messages"  # last, so readers can skip it cheaply
    # rows really did finish out of order: the slow first row ended last
    ends = {
        r["row"]: read_trace((out.parent / r["trace"]).resolve()).end["ts"]  # type: ignore[index]
        for r in written
    }
    assert max(ends, key=ends.__getitem__) == 1
