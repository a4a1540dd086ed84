"""The interactive REPL, driven whole sessions at a time through prompt-toolkit's pipe input.

Assertions read the captured console text and the mock TrainGate's records (captured by a
backend wrapper, since every record passes through the LLM backend), never escape codes.
"""

from __future__ import annotations

import importlib.util
import io
import json
import re
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from prompt_toolkit import PromptSession
from prompt_toolkit.input import PipeInput, create_pipe_input
from prompt_toolkit.output import DummyOutput
from rich.console import Console

from osmosis_rollout.errors import LLMBackendError, ToolError
from osmosis_rollout.evaluation.runner import RowInput
from osmosis_rollout.protocol import (
    CompletionsRequest,
    CompletionsResponse,
    OpenAIFunctionToolSchema,
    RolloutStatus,
)
from osmosis_rollout.repl import run_repl
from osmosis_rollout.repl.commands import parse_command, parse_reply
from osmosis_rollout.repl.stepper import SteppingBackend, Turn
from osmosis_rollout.testing import RolloutRecord, ScriptedBackend
from osmosis_rollout.testing.backends import MockLLMBackend
from osmosis_rollout.testing.records import LLMBackend, completion_from_message

from .openai_stub import OpenAIStub, slow, stub_backend, text, tool_call

pytestmark = pytest.mark.anyio

EXAMPLES = Path(__file__).parent.parent / "examples"
SYSTEM = {"role": "system", "content": "You are a careful calculator."}
ROWS = [
    RowInput(1, [SYSTEM, {"role": "user", "content": "What is 12 + 30?"}], {"ground_truth": "42"}),
    RowInput(2, [SYSTEM, {"role": "user", "content": "What is 7 * 6?"}], {"ground_truth": "42"}),
]


def add_call(a: float, b: float) -> dict[str, Any]:
    """An assistant message calling the calculator's ``add``."""
    arguments = json.dumps({"a": a, "b": b})
    return {
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "add", "arguments": arguments},
            }
        ],
    }


def calculator() -> Any:
    """examples/calculator/agent.py:CalculatorAgent, freshly imported."""
    path = EXAMPLES / "calculator" / "agent.py"
    spec = importlib.util.spec_from_file_location("repl_example_calculator", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.CalculatorAgent()


class Recording:
    """Wraps a backend and keeps each rollout's record, the mock TrainGate's view of it."""

    def __init__(self, inner: LLMBackend) -> None:
        self.inner = inner
        self.records: dict[str, RolloutRecord] = {}

    async def complete(
        self, request: CompletionsRequest, record: RolloutRecord
    ) -> CompletionsResponse:
        self.records[record.rollout_id] = record
        return await self.inner.complete(request, record)

    @property
    def all(self) -> list[RolloutRecord]:
        return list(self.records.values())


class Blocking:
    """Answers the first turn with an ``add`` call, then hangs until cancelled."""

    def __init__(self) -> None:
        self.entered = anyio.Event()

    async def complete(
        self, request: CompletionsRequest, record: RolloutRecord
    ) -> CompletionsResponse:
        if not record.replies:
            return completion_from_message(request, add_call(1, 2))
        self.entered.set()
        await anyio.Event().wait()
        raise AssertionError("unreachable")


class Screen(io.StringIO):
    """The console's file; lets a test wait until some text has been printed."""

    def __init__(self) -> None:
        super().__init__()
        self._changed = anyio.Event()

    def write(self, s: str) -> int:
        n = super().write(s)
        self._changed.set()
        self._changed = anyio.Event()
        return n

    async def shows(self, text: str, times: int = 1) -> None:
        while self.getvalue().count(text) < times:
            await self._changed.wait()


@dataclass
class Repl:
    """A running REPL session: type into ``pipe``, read ``screen``, inspect ``backend``."""

    pipe: PipeInput
    screen: Screen
    backend: Recording
    code: list[int] = field(default_factory=list)

    @property
    def text(self) -> str:
        return self.screen.getvalue()


@asynccontextmanager
async def live_repl(
    inner: LLMBackend | None = None,
    *,
    rows: list[RowInput] | None = None,
    start_row: int | None = None,
) -> AsyncIterator[Repl]:
    """Run ``run_repl`` on the calculator in the background; the session must end in 10 s."""
    backend = Recording(inner or ScriptedBackend([add_call(12, 30), {"content": "42"}]))
    screen = Screen()
    with create_pipe_input() as pipe:
        session: PromptSession[str] = PromptSession(input=pipe, output=DummyOutput())
        repl = Repl(pipe, screen, backend)

        async def main() -> None:
            code = await run_repl(
                calculator(),
                backend=backend,
                rows=ROWS if rows is None else rows,
                start_row=start_row,
                session=session,
                console=Console(file=screen, width=120),
            )
            repl.code.append(code)

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(main)
                yield repl


async def session(keys: str, **kwargs: Any) -> Repl:
    """Type all of ``keys`` up front, close the input, and run the session to its end."""
    async with live_repl(**kwargs) as repl:
        repl.pipe.send_text(keys)
        repl.pipe.close()
    assert repl.code == [0]
    return repl


# --------------------------------------------------------------------------------------------
# whole sessions
# --------------------------------------------------------------------------------------------


async def test_each_turn_pauses_until_next() -> None:
    """The agent gets no reply while a turn is shown; `n` and Enter each release one turn."""
    async with live_repl(start_row=1) as repl:
        await repl.screen.shows("turn 1 | row 1")
        (record,) = repl.backend.all
        assert record.replies == []  # paused: the agent is still waiting for turn 1
        assert "-> add" in repl.text
        assert '{"a": 12, "b": 30}' in repl.text
        assert "finish tool_calls" in repl.text
        repl.pipe.send_text("n\n")
        await repl.screen.shows("turn 2 | row 1")
        assert len(record.replies) == 1
        assert "tool [call_1]: 42.0" in repl.text  # the tool result arrived with the next turn
        repl.pipe.send_text("\n")
        await repl.screen.shows("rollout COMPLETED")
        repl.pipe.send_text("q\n")
    assert repl.code == [0]
    assert record.result is not None
    assert record.result.status == RolloutStatus.COMPLETED
    assert record.result.reward == 1.0
    assert "reward 1" in repl.text
    assert "findings: none" in repl.text
    assert "llm calls" in repl.text


async def test_continue_runs_to_the_end_without_pausing() -> None:
    """After `c` the later turns are shown but not paused, so `q` lands at the idle prompt."""
    repl = await session("c\nq\n", start_row=1)
    (record,) = repl.backend.all
    assert "Running to the end without pausing" in repl.text
    assert "turn 2 | row 1" in repl.text
    assert record.result is not None
    assert record.result.status == RolloutStatus.COMPLETED


async def test_messages_shows_history_and_the_pending_reply() -> None:
    """`m` prints the conversation so far plus the reply the agent has not received yet."""
    repl = await session("m\nc\nq\n", start_row=1)
    assert "conversation: 2 message(s)" in repl.text
    assert "user: What is 12 + 30?" in repl.text
    assert "(pending: not yet sent to the agent)" in repl.text


async def test_tools_lists_names_and_schemas() -> None:
    """`t` prints every tool with its description and parameter schema."""
    repl = await session("t\nc\nq\n", start_row=1)
    assert "4 tool(s)" in repl.text
    for name in ("add", "subtract", "multiply", "divide"):
        assert name in repl.text
    assert "The divisor; must not be zero." in repl.text


async def test_metrics_live_and_after_the_end() -> None:
    """`metrics` shows the live split while paused, and the final table at the idle prompt."""
    repl = await session("n\nmetrics\nc\nmetrics\nq\n", start_row=1)
    assert "Metrics so far" in repl.text
    assert "paused" in repl.text
    assert re.search(r"llm calls +1\b", repl.text)  # live, at turn 2: one turn was answered
    assert len(re.findall(r"llm calls +2\b", repl.text)) == 2  # end of rollout, then `metrics`


@pytest.mark.usefixtures("no_inherited_settings")
def test_repl_metrics_show_paused_apart_from_llm_and_tool_wall_time() -> None:
    from rich.console import Console

    from osmosis_rollout.protocol import RolloutMetrics
    from osmosis_rollout.repl.views import metrics_table

    metrics = RolloutMetrics(
        total_latency_ms=6000,
        llm_latency_ms=5700,  # as the agent measured it: 5650 ms of it was you at the prompt
        tool_latency_ms=40,
        num_llm_calls=2,
        num_tool_calls=4,
        tool_wall_ms=10,
    )
    console = Console(width=100, record=True, no_color=True)
    console.print(metrics_table(metrics, paused_ms=5650, model_ms=18))
    rows = {line.split()[0]: line.strip() for line in console.export_text().splitlines() if line}
    cells = {name: row.split()[1:3] for name, row in rows.items()}
    assert cells["paused"] == ["5.65", "s"]  # a row of its own, not indented under llm
    assert cells["llm"] == ["50", "ms"]  # 5700 - 5650: the LLM calls without the pauses
    assert cells["model"] == ["18", "ms"]
    assert cells["tool"] == ["10", "ms"]
    assert rows["tool"].endswith("wall time; 40 ms summed over parallel calls")
    assert cells["other"] == ["290", "ms"]  # 6000 - 5700 - 10
    assert not any(line.startswith("  paused") for line in console.export_text().splitlines())


async def test_edit_tool_call_reaches_the_agent() -> None:
    """An edited tool call replaces the model's reply: the agent runs it and is rewarded."""
    inner = ScriptedBackend([add_call(1, 1), {"content": "42"}])
    edit = 'edit {"name": "add", "arguments": {"a": 40, "b": 2}}\n'
    repl = await session(edit + "c\nq\n", inner=inner, start_row=1)
    (record,) = repl.backend.all
    call = record.replies[0].message.tool_calls
    assert call is not None
    assert json.loads(call[0].function.arguments) == {"a": 40, "b": 2}
    assert "(edited by you)" in repl.text
    assert record.result is not None
    tool_results = [m for m in record.result.final_messages if m.get("role") == "tool"]
    assert tool_results[0]["content"] == "42.0"
    assert record.result.reward == 1.0


async def test_edit_text_typed_at_the_reply_prompt() -> None:
    """`edit` alone asks for the reply; typed text becomes the agent's final answer."""
    repl = await session("edit\nIt is 41\nn\nq\n", start_row=1)
    (record,) = repl.backend.all
    assert record.result is not None
    assert record.result.final_messages[-1]["content"] == "It is 41"
    assert record.result.reward == 0.0
    assert len(record.replies) == 1  # a text reply ends the calculator's loop


async def test_edit_rejects_malformed_json_and_keeps_the_reply() -> None:
    """A malformed tool call is explained and the model's own reply is still sent."""
    repl = await session('edit {"name": add}\nedit [1]\nc\nq\n', start_row=1)
    (record,) = repl.backend.all
    assert "Cannot use this reply: the reply is not valid JSON" in repl.text
    assert "must be a JSON object like" in repl.text
    call = record.replies[0].message.tool_calls
    assert call is not None
    assert json.loads(call[0].function.arguments) == {"a": 12, "b": 30}


async def test_row_starts_a_second_rollout() -> None:
    """`row 2` at the idle prompt starts another rollout on row 2; a missing row is explained."""
    inner = ScriptedBackend([{"content": "42"}])
    repl = await session("c\nrow 2\nc\nrow 9\nq\n", inner=inner, start_row=1)
    first, second = repl.backend.all
    assert first.chats[0].messages[-1]["content"] == "What is 12 + 30?"
    assert second.chats[0].messages[-1]["content"] == "What is 7 * 6?"
    assert repl.text.count("rollout COMPLETED") == 2
    assert "There is no row 9: the dataset has rows 1-2." in repl.text


async def test_enter_at_the_idle_prompt_runs_the_next_row() -> None:
    """Enter between rollouts runs the next dataset row, until the last one."""
    inner = ScriptedBackend([{"content": "42"}])
    repl = await session("c\n\nc\n\nq\n", inner=inner, start_row=1)
    assert [r.chats[0].messages[-1]["content"] for r in repl.backend.all] == [
        "What is 12 + 30?",
        "What is 7 * 6?",
    ]
    assert "That was the last row" in repl.text


async def test_row_during_a_paused_turn_cancels_it_and_starts_the_row() -> None:
    """`row 2` at a paused turn cancels the current rollout, then runs row 2."""
    repl = await session("row 2\nc\nq\n", start_row=1)
    first, second = repl.backend.all
    assert first.result is not None
    assert first.result.finish_reason == "cancelled"
    assert second.result is not None
    assert second.result.status == RolloutStatus.COMPLETED
    assert second.chats[0].messages[-1]["content"] == "What is 7 * 6?"


async def test_row_picked_at_the_prompt_without_start_row() -> None:
    """With a dataset and no --row, the rows are listed and `row N` starts one."""
    inner = ScriptedBackend([{"content": "42"}])
    repl = await session("row 2\nc\nq\n", inner=inner)
    assert "Dataset: 2 row(s)" in repl.text
    (record,) = repl.backend.all
    assert record.chats[0].messages[-1]["content"] == "What is 7 * 6?"


async def test_without_dataset_the_user_types_the_message() -> None:
    """No dataset: the first line is the user message; `new` asks for another."""
    inner = ScriptedBackend([{"content": "4"}])
    repl = await session("What is 2 + 2?\nc\nnew\nAnd 3 + 3?\nc\nq\n", inner=inner, rows=[])
    first, second = repl.backend.all
    assert first.chats[0].messages == [{"role": "user", "content": "What is 2 + 2?"}]
    assert second.chats[0].messages == [{"role": "user", "content": "And 3 + 3?"}]


async def test_quit_while_paused_cancels_the_rollout() -> None:
    """`q` at a paused turn cancels that rollout cleanly (one ERROR callback) and leaves."""
    repl = await session("q\n", start_row=1)
    (record,) = repl.backend.all
    assert record.result is not None
    assert record.result.finish_reason == "cancelled"
    assert len(record.completions) == 1
    assert "bye" in repl.text


async def test_ctrl_c_at_a_paused_turn_cancels_and_returns_to_the_prompt() -> None:
    """Ctrl-C while paused ends the rollout ERROR/cancelled; the REPL keeps answering."""
    async with live_repl(start_row=1) as repl:
        await repl.screen.shows("turn 1 | row 1")
        repl.pipe.send_text("\x03")
        await repl.screen.shows("end of rollout")
        repl.pipe.send_text("help\nq\n")
    (record,) = repl.backend.all
    assert record.result is not None
    assert record.result.status == RolloutStatus.ERROR
    assert record.result.finish_reason == "cancelled"
    assert "Cancelling rollout" in repl.text
    assert "rollout ERROR  finish cancelled" in repl.text
    assert record.result.error_message == "rollout cancelled (Ctrl-C at the REPL)"
    assert "Commands" in repl.text  # `help` ran after the cancel


async def test_ctrl_c_during_a_running_turn_cancels_it() -> None:
    """Ctrl-C while the LLM turn is still running (not paused) cancels the rollout."""
    blocking = Blocking()
    async with live_repl(blocking, start_row=1) as repl:
        await repl.screen.shows("turn 1 | row 1")
        repl.pipe.send_text("c\n")
        await blocking.entered.wait()
        repl.pipe.send_text("\x03")
        await repl.screen.shows("end of rollout")
        repl.pipe.send_text("q\n")
    (record,) = repl.backend.all
    assert record.result is not None
    assert record.result.finish_reason == "cancelled"
    assert len(record.completions) == 1
    assert repl.code == [0]


async def test_unknown_command_shows_help() -> None:
    """An unknown word is named and the command list follows, at both prompts."""
    repl = await session("frobnicate\nc\nwhat\nq\n", start_row=1)
    assert "Unknown command 'frobnicate'" in repl.text
    assert "Unknown command 'what'" in repl.text
    assert repl.text.count("Commands") == 2


async def test_eof_ends_the_session() -> None:
    """A closed input (Ctrl-D) at a paused turn cancels the rollout and exits 0."""
    repl = await session("", start_row=1)
    (record,) = repl.backend.all
    assert record.result is not None
    assert record.result.finish_reason == "cancelled"
    assert "bye" in repl.text


async def test_eof_at_the_edit_prompt_leaves_promptly() -> None:
    """Ctrl-D while typing an edited reply cancels the paused rollout and ends the session."""
    repl = await session("edit\n", start_row=1)
    (record,) = repl.backend.all
    assert record.result is not None
    assert record.result.finish_reason == "cancelled"
    assert "Gave up waiting" not in repl.text


async def test_eof_at_the_first_prompt_without_dataset() -> None:
    """With no dataset and nothing typed, the session ends at once without a rollout."""
    repl = await session("", rows=[])
    assert repl.backend.all == []
    assert "bye" in repl.text


async def test_mock_llm_backend_session() -> None:
    """The default offline backend calls every tool once; the REPL shows each call."""
    repl = await session("c\nq\n", inner=MockLLMBackend(), start_row=1)
    for name in ("add(", "subtract(", "multiply(", "divide("):
        assert name in repl.text
    assert "rollout COMPLETED" in repl.text


async def test_the_repl_says_it_is_waiting_for_a_slow_model() -> None:
    """A reply that takes a while shows "waiting for the model" with the seconds so far."""
    stub = OpenAIStub([slow(1.6, tool_call("add", {"a": 12, "b": 30})), text("42")])
    async with stub_backend(stub) as backend:
        repl = await session("c\nq\n", inner=backend, start_row=1)
    assert re.search(r"waiting for the model \(turn 1\), 1 s", repl.text)
    assert repl.text.index("waiting for the model") < repl.text.index("turn 1 | row 1")
    assert "waiting for the model (turn 2)" not in repl.text  # a fast turn says nothing


async def test_an_edited_reply_keeps_the_real_prompt_token_counts() -> None:
    """`edit` estimates only the completion: the prompt's real count and ids are kept."""
    real = tool_call(
        "add",
        {"a": 1, "b": 1},
        usage={"prompt_tokens": 321, "completion_tokens": 9, "total_tokens": 330},
        extra={"prompt_token_ids": list(range(321))},
    )
    stub = OpenAIStub([real, text("42")])
    edit = 'edit {"name": "add", "arguments": {"a": 40, "b": 2}}\n'
    async with stub_backend(stub) as backend:
        repl = await session(edit + "c\nq\n", inner=backend, start_row=1)
    (record,) = repl.backend.all
    edited = record.replies[0]
    assert edited.usage.prompt_tokens == 321
    assert edited.prompt_token_ids == list(range(321))
    assert "321 in /" in repl.text
    assert "(out estimated: edited)" in repl.text


# --------------------------------------------------------------------------------------------
# the pieces
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "name", "arg"),
    [
        ("", "next", ""),
        ("n", "next", ""),
        ("C", "continue", ""),
        ("m", "messages", ""),
        ("t", "tools", ""),
        ("row 3", "row", "3"),
        ("edit  hello there ", "edit", "hello there"),
        ("exit", "quit", ""),
        ("?", "help", ""),
        ("zap", None, ""),
    ],
)
def test_parse_command(line: str, name: str | None, arg: str) -> None:
    """Short and long forms map to one command; the rest of the line is its argument."""
    cmd = parse_command(line)
    assert (cmd.name, cmd.arg) == (name, arg)


ADD_TOOL = OpenAIFunctionToolSchema.model_validate(
    {
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            },
        }
    }
)


def test_parse_reply_forms() -> None:
    """Text, one call, a list, and the OpenAI tool-call shape all become assistant messages."""
    assert parse_reply("hi {x}", [ADD_TOOL], turn=1).message["content"] == "hi {x}"
    one = parse_reply('{"name": "add", "arguments": {"a": 1, "b": 2}}', [ADD_TOOL], turn=2)
    assert one.warnings == ()
    (call,) = one.message["tool_calls"]
    assert call["id"] == "call_edit_2_1"
    assert json.loads(call["function"]["arguments"]) == {"a": 1, "b": 2}
    many = parse_reply(
        '[{"function": {"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}},'
        ' {"name": "add", "arguments": {"a": 3, "b": 4}}]',
        [ADD_TOOL],
        turn=1,
    )
    assert [c["id"] for c in many.message["tool_calls"]] == ["call_edit_1_1", "call_edit_1_2"]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('{"name": add}', "not valid JSON"),
        ("[]", "list of tool calls is empty"),
        ('{"arguments": {}}', 'needs a "name"'),
        ('{"name": "add", "arguments": [1]}', "must be a JSON object"),
        ("[3]", "must be a JSON object like"),
    ],
)
def test_parse_reply_errors(text: str, error: str) -> None:
    """A malformed tool call raises ToolError saying what to write instead."""
    with pytest.raises(ToolError, match=error):
        parse_reply(text, [ADD_TOOL], turn=1)


def test_parse_reply_warns_on_unknown_tool_and_bad_arguments() -> None:
    """Unknown tools and schema-breaking arguments are sent, with a warning each."""
    edited = parse_reply(
        '[{"name": "pow"}, {"name": "add", "arguments": {"a": 1}}]', [ADD_TOOL], turn=1
    )
    assert len(edited.message["tool_calls"]) == 2
    assert "'pow' is not declared" in edited.warnings[0]
    assert "'b' is a required property" in edited.warnings[1]


@pytest.mark.usefixtures("no_inherited_settings")
def test_a_rejected_edit_shows_an_example_with_the_agents_own_tool() -> None:
    from osmosis_rollout.errors import ToolError
    from osmosis_rollout.protocol import OpenAIFunctionToolSchema
    from osmosis_rollout.repl.commands import parse_reply

    search = OpenAIFunctionToolSchema.model_validate(
        {
            "type": "function",
            "function": {
                "name": "search",
                "description": "Search the catalogue.",
                "parameters": {
                    "type": "object",
                    "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                    "required": ["query"],
                },
            },
        }
    )
    with pytest.raises(ToolError) as info:
        parse_reply('{"arguments": {}}', [search], turn=1)
    message = str(info.value)
    assert '{"name": "search", "arguments": {"query": "text"}}' in message
    assert '"add"' not in message
    example = message.partition("e.g. ")[2]
    assert parse_reply(example, [search], turn=1).warnings == ()  # the example itself is valid


async def test_abandon_fails_the_pending_turn() -> None:
    """Abandoning a rollout (remote servers) fails its paused turn and refuses later ones."""
    turns: list[Turn] = []
    shown = anyio.Event()

    def listener(turn: Turn) -> None:
        turns.append(turn)
        shown.set()

    stepper = SteppingBackend(ScriptedBackend([{"content": "x"}]), listener)
    stepper.active = "r-1"
    record = RolloutRecord(rollout_id="r-1")
    request = CompletionsRequest(rollout_id="r-1", messages=[{"role": "user", "content": "hi"}])
    record.chats.append(request)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tasks:

            async def ask() -> None:
                with pytest.raises(LLMBackendError, match="cancelled at the REPL"):
                    await stepper.complete(request, record)

            tasks.start_soon(ask)
            await shown.wait()
            assert turns[0].waiting
            stepper.abandon("r-1")
    with pytest.raises(LLMBackendError):
        await stepper.complete(request, record)


async def served_session(
    typed: str, *, api_key: str | None = None, protocol: str = "v1"
) -> tuple[int, str]:
    """``typed`` at the REPL stepping the calculator served by ``osmosis serve``'s app in a
    thread (a server in another process, as far as the REPL can tell): its exit code and
    screen. The model calls ``add(12, 30)``, then answers 42."""
    from osmosis_rollout.server import create_app

    from .support import serve_in_thread

    app = create_app(calculator(), api_key=api_key, shutdown_grace_s=0)
    screen = Screen()
    with serve_in_thread(app, lifespan="on") as url, create_pipe_input() as pipe:
        session: PromptSession[str] = PromptSession(input=pipe, output=DummyOutput())
        pipe.send_text(typed)
        pipe.close()
        with anyio.fail_after(30):
            code = await run_repl(
                None,
                backend=ScriptedBackend([add_call(12, 30), {"content": "42"}]),
                rows=ROWS,
                start_row=1,
                server_url=url,
                server_key=api_key,
                protocol=protocol,
                session=session,
                console=Console(file=screen, width=120),
            )
    return code, screen.getvalue()


async def test_interactive_against_a_keyed_running_server() -> None:
    """With --server and a server key, the REPL authenticates its inits and steps the rollout."""
    code, text = await served_session("c\nq\n", api_key="repl-server-key")
    assert code == 0
    assert "rollout COMPLETED" in text


@pytest.mark.parametrize("protocol", ["v2", "polling"])
async def test_interactive_steps_a_server_over_v2_and_polling(protocol: str) -> None:
    """Every wire steps: a reply edited at the prompt is the one the server's agent gets (its
    tool call runs, then the edited answer is graded), over the callback and polling wires."""
    code, text = await served_session("n\nedit\n41\nn\nq\n", protocol=protocol)
    assert code == 0
    assert "turn 2" in text
    assert "rollout COMPLETED" in text
    assert re.search(r"reward 0\b", text), text  # the edited 41, not the scripted 42


@pytest.mark.parametrize("protocol", ["v1", "v2", "polling"])
async def test_leaving_a_paused_turn_of_a_server_cancels_it_there(protocol: str) -> None:
    """`q` at a paused turn of a server in another process asks that server to cancel the
    rollout (each wire's cancel route): it ends cancelled there, not as a refused LLM call."""
    _, text = await served_session("q\n", protocol=protocol)
    assert "The server cancelled it; its cancelled result follows." in text
    assert "finish cancelled" in text, text


# --------------------------------------------------------------------------------------------
# long messages, and the metrics of a cancelled rollout
# --------------------------------------------------------------------------------------------

LONG_NOTE = " ".join(f"word{i}" for i in range(60))


def long_call() -> dict[str, Any]:
    """An ``add`` call with an argument far wider than the console."""
    arguments = json.dumps({"a": 12, "b": 30, "note": LONG_NOTE})
    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": arguments}}
    return {"content": None, "tool_calls": [call]}


async def test_long_tool_arguments_end_in_an_ellipsis_and_show_prints_them_whole() -> None:
    """A tool argument wider than the console is cut with a visible ellipsis (in the turn and
    in `m`); `show N` and `m N` print that message with every argument whole."""
    inner = ScriptedBackend([long_call(), {"content": "42"}])
    repl = await session("m\nshow 2\nm 2\nshow 7\nshow x\nq\n", inner=inner, start_row=1)
    cut = [line for line in repl.text.splitlines() if '"note": "word0 word1' in line]
    assert len(cut) == 4  # the turn, `m`, then the first line of each of `show 2` and `m 2`
    assert cut[0].rstrip().endswith("…")
    assert cut[1].rstrip().endswith("…")
    assert not cut[2].rstrip().endswith("…")  # `show 2`: folded onto the next lines instead
    assert not cut[3].rstrip().endswith("…")
    assert "A line ending in … is cut: show N prints message N whole." in repl.text
    assert repl.text.count("message 2 of 3 (pending: not yet sent to the agent)") == 2
    whole = "".join(repl.text.split())  # the folded lines, joined up again
    assert "".join(LONG_NOTE.split()) in whole
    assert "There is no message 7: the conversation has 0-2." in repl.text
    assert "show needs a message number" in repl.text


async def test_the_cut_note_is_shown_only_when_a_line_can_be_cut() -> None:
    """A cold trial: `m` always ended with "A line ending in … is cut", also when every call
    was short. Only an indented arguments block can be cut (its lines do not wrap)."""
    short = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}
    inner = ScriptedBackend([{"content": None, "tool_calls": [short]}, {"content": "42"}])
    repl = await session("m\nq\n", inner=inner, start_row=1)
    assert "conversation:" in repl.text  # `m` ran
    assert "is cut" not in repl.text


async def test_show_between_rollouts_and_in_help() -> None:
    """Between rollouts `show N` prints a message of the last one; help lists the command."""
    repl = await session("show 1\nc\nshow 1\nhelp\nq\n", start_row=1)
    assert "show N, m N" in repl.text
    assert "message 1 of 5" in repl.text
    assert "user: What is 12 + 30?" in repl.text
    assert "No rollout has run yet; show N shows its messages once it ends." not in repl.text


async def test_show_before_any_rollout() -> None:
    repl = await session("show 1\nq\n")
    assert "No rollout has run yet; show N shows its messages once it ends." in repl.text


async def test_metrics_after_ctrl_c_at_a_paused_turn_say_the_cancelled_call_has_no_tokens() -> None:
    """The agent counts the cancelled call but got no tokens for it: the table says so."""
    async with live_repl(start_row=1) as repl:
        await repl.screen.shows("turn 1 | row 1")
        repl.pipe.send_text("\x03")
        await repl.screen.shows("end of rollout")
        repl.pipe.send_text("metrics\nq\n")
    lines = [line.strip() for line in repl.text.splitlines()]
    calls = [line for line in lines if line.startswith("llm calls")]
    tokens = [line for line in lines if line.startswith("tokens")]
    assert len(calls) == len(tokens) == 2  # end of rollout, then `metrics`
    for line in calls:
        assert re.fullmatch(r"llm calls +1 +0 answered, 1 cancelled or failed", line)
    for line in tokens:
        assert re.fullmatch(
            r"tokens +0 / 0 +in / out, of the 0 answered; the cancelled call's: unknown", line
        )


async def test_metrics_after_ctrl_c_in_a_running_turn_count_the_answered_turns() -> None:
    """Turn 1 answered, turn 2 cancelled while with the model: turn 1's tokens are counted."""
    blocking = Blocking()
    async with live_repl(blocking, start_row=1) as repl:
        await repl.screen.shows("turn 1 | row 1")
        repl.pipe.send_text("c\n")
        await blocking.entered.wait()
        repl.pipe.send_text("\x03")
        await repl.screen.shows("end of rollout")
        repl.pipe.send_text("q\n")
    (record,) = repl.backend.all
    usage = record.replies[0].usage
    assert re.search(r"llm calls +2 +1 answered, 1 cancelled or failed", repl.text)
    assert usage.prompt_tokens > 0
    expected = (
        rf"tokens +{usage.prompt_tokens} / {usage.completion_tokens} +in / out, of the 1 "
        r"answered; the cancelled call's: unknown"
    )
    assert re.search(expected, repl.text)


async def test_metrics_of_a_completed_rollout_have_no_cancelled_note() -> None:
    repl = await session("c\nq\n", start_row=1)
    assert re.search(r"tokens +\d+ / \d+ +in / out *$", repl.text, re.MULTILINE)
    assert "cancelled or failed" not in repl.text


async def test_a_judged_rollout_ends_with_the_judges_verdict_last() -> None:
    """`-i` on an agent graded by a judge: after the outcome and its metrics, the verdict, each
    criterion's score and reason, and the judge's cost apart from the policy's."""
    from .assets.judged_agents import FailingJudged, SoundJudged

    rows = [
        RowInput(1, [{"role": "user", "content": "Capital of France?"}], {"ground_truth": "Paris"})
    ]
    texts = []
    for agent in (SoundJudged(), FailingJudged()):
        screen = Screen()
        with create_pipe_input() as pipe:
            session: PromptSession[str] = PromptSession(input=pipe, output=DummyOutput())
            pipe.send_text("c\nq\n")
            pipe.close()
            with anyio.fail_after(10):
                code = await run_repl(
                    agent,
                    backend=ScriptedBackend([{"content": "Paris"}]),
                    rows=rows,
                    start_row=1,
                    session=session,
                    console=Console(file=screen, width=120),
                )
        assert code == 0
        texts.append(screen.getvalue())
    sound, failing = texts
    end, metrics, verdict = (
        sound.index(s) for s in ("end of rollout", "llm calls", "judge verdict")
    )
    assert end < metrics < verdict
    assert re.search(r"correct +1 +1 of 1 reference words present", sound)
    assert "judge 1 call(s)" in sound
    assert "none: the judge failed" in failing
    assert failing.index("judge verdict") > failing.index("end of rollout")


def test_items_without_a_role_are_shown_by_their_type() -> None:
    """A foreign server's conversation may hold Responses API items (osmosis-ai's
    openai-agents sample keeps ``function_call`` and ``function_call_output``): `m` shows
    each by its type with its call or output, not as an empty ``?:`` message."""
    from osmosis_rollout.repl.views import messages_view

    items = [
        {"role": "user", "content": "What is 6*7?"},
        {"type": "function_call", "name": "multiply", "arguments": '{"a": 6, "b": 7}',
         "call_id": "c1"},
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
        {"type": "reasoning", "summary": []},
    ]  # fmt: skip
    screen = io.StringIO()
    Console(file=screen, width=120).print(messages_view(items))
    text = screen.getvalue()
    assert 'function_call: multiply({"a": 6, "b": 7})' in text
    assert "function_call_output: 42" in text
    assert 'reasoning: {"type": "reasoning", "summary": []}' in text
    assert "?:" not in text


def test_commands_piped_in_read_as_a_transcript_whatever_the_terminal_type() -> None:
    """``printf 'n\\nc\\nq\\n' | osmosis test -i`` from a shell whose ``TERM`` names a terminal
    (a script, a coding agent's tool call): each command appears once, after its prompt, with
    no terminal control codes. prompt_toolkit used to redraw every prompt with them
    (``turn 1> n         turn 1> n``, blank lines after ``osmosis>``)."""
    import subprocess

    from .processes import clean_env
    from .support import CALCULATOR

    done = subprocess.run(
        [str(Path(sys.executable).parent / "osmosis"), "test", CALCULATOR, "-i",
         "-d", str(EXAMPLES / "calculator" / "dataset.jsonl")],
        input="n\nc\nq\n", capture_output=True, text=True, timeout=60,
        env=clean_env(TERM="xterm-256color", NO_COLOR="1"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    prompts = [line for line in lines if re.match(r"(osmosis|turn \d+)> ", line)]
    assert prompts == ["osmosis> n", "turn 1> c", "osmosis> q"], done.stdout
    assert "\x1b" not in done.stdout
    assert "\r" not in done.stdout
    assert lines[-1] == "bye"
