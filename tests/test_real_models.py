"""What real OpenAI-compatible servers send, through the OpenAI stub: no false findings."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from osmosis_rollout import RolloutAgentLoop, RolloutContext, RolloutResult
from osmosis_rollout.append_only import same_message
from osmosis_rollout.client import RetryPolicy, TrainGateClient
from osmosis_rollout.errors import LLMBackendError
from osmosis_rollout.evaluation.runner import RowInput, RunOptions, run_batch
from osmosis_rollout.protocol import CompletionsRequest, RolloutRequest
from osmosis_rollout.server import create_app
from osmosis_rollout.testing import (
    Harness,
    MockTrainGate,
    OpenAICompatibleBackend,
    RolloutRecord,
)
from osmosis_rollout.testing.openai_backend import DEFAULT_MAX_TOKENS
from osmosis_rollout.testing.text_tool_calls import find_text_tool_call

from .openai_stub import OpenAIStub, slow, stub_backend, text, text_tool_call, tool_call, truncated
from .support import load_asset

pytestmark = pytest.mark.anyio

QUESTION = [{"role": "user", "content": "What is 1 + 2?"}]
HISTORY = load_asset("fnd_history")


def chat_request(**params: Any) -> CompletionsRequest:
    """One turn's request as the mock TrainGate hands it to the backend."""
    return CompletionsRequest(rollout_id="r-1", messages=QUESTION, **params)


def read_trace(folder: Path) -> list[dict[str, Any]]:
    """The events of the one trace file in ``folder``."""
    (trace,) = folder.glob("*.jsonl")
    return [json.loads(line) for line in trace.read_text().splitlines()]


@pytest.fixture
def tool_then_text() -> OpenAIStub:
    """A server that calls `add` with `"content": null` and spaced JSON, then answers."""
    return OpenAIStub([tool_call("add", '{"a": 1, "b": 2}'), text("3")])


# -- 1. the append-only guard compares what TrainGate would tokenise ---------------------------


@pytest.mark.parametrize(
    "agent_name",
    [
        "ToolAppendOnlyAgent",
        "RebuildsToolReplyAgent",
        "CompactsArgumentsAgent",
        "ArgumentsAsObjectAgent",
    ],
)
async def test_a_rebuilt_but_equivalent_reply_is_not_a_rewrite(
    tool_then_text: OpenAIStub, agent_name: str
) -> None:
    """Null vs absent content, key order and re-spaced argument JSON are the same message."""
    agent = getattr(HISTORY, agent_name)()
    backend = stub_backend(tool_then_text)
    async with backend, Harness(agent, backend=backend) as harness:
        outcome = await harness.run(QUESTION, timeout_s=10)
    assert outcome.result is not None
    assert outcome.findings == []
    metrics = outcome.result.metrics
    assert metrics is not None
    assert "append_only_violations" not in metrics.model_dump()
    assert metrics.num_tool_calls == 1
    assert len(tool_then_text.bodies) == 2


@pytest.mark.parametrize(
    "agent_name", ["EditsToolArgumentsAgent", "RetypesArgumentsAgent", "DropsToolCallsAgent"]
)
async def test_a_real_change_to_a_tool_reply_is_still_caught(
    tool_then_text: OpenAIStub, agent_name: str
) -> None:
    """Changed argument values or types, or dropped tool calls, are reported where they are."""
    agent = getattr(HISTORY, agent_name)()
    backend = stub_backend(tool_then_text)
    async with backend, Harness(agent, backend=backend) as harness:
        outcome = await harness.run(QUESTION, timeout_s=10)
    assert [f.code for f in outcome.findings] == ["history_rewritten"]
    assert f"at message {agent.expected_index}" in outcome.findings[0].message
    assert outcome.result is not None
    assert outcome.result.metrics is not None
    assert outcome.result.metrics.model_dump()["append_only_violations"] == 1


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ({"role": "assistant", "content": None}, {"role": "assistant"}, True),
        ({"role": "assistant", "content": ""}, {"role": "assistant"}, False),
        ({"content": "x", "role": "user"}, {"role": "user", "content": "x"}, True),
        ({"role": "user", "content": "x"}, {"role": "user", "content": "x "}, False),
        (
            {"tool_calls": [{"id": "1", "function": {"name": "f", "arguments": '{"a": 1}'}}]},
            {"tool_calls": [{"id": "1", "function": {"name": "f", "arguments": {"a": 1}}}]},
            True,
        ),
        (
            {"tool_calls": [{"id": "1", "function": {"name": "f", "arguments": '{"a": 1}'}}]},
            {"tool_calls": [{"id": "1", "function": {"name": "f", "arguments": '{"a": true}'}}]},
            False,
        ),
        (
            {"tool_calls": [{"id": "1", "function": {"name": "f", "arguments": "not json"}}]},
            {"tool_calls": [{"id": "1", "function": {"name": "f", "arguments": "not json"}}]},
            True,
        ),
        (
            {"tool_calls": [{"id": "1", "function": {"name": "f", "arguments": "not json"}}]},
            {"tool_calls": [{"id": "1", "function": {"name": "f", "arguments": '"not json"'}}]},
            False,
        ),
        (
            {"tool_calls": [{"id": "1", "function": {"name": "f", "arguments": "{}"}}]},
            {"tool_calls": [{"id": "2", "function": {"name": "f", "arguments": "{}"}}]},
            False,
        ),
    ],
)
def test_same_message_ignores_only_what_does_not_render(
    a: dict[str, Any], b: dict[str, Any], same: bool
) -> None:
    """Rendering-neutral differences are equal; text, values, types and ids are not."""
    assert same_message(a, b) is same
    assert same_message(b, a) is same


# -- 5. the tools are known before the first turn ------------------------------------------------


async def test_the_first_turn_waits_until_the_init_answer_declared_the_tools() -> None:
    """A server whose 202 arrives after the agent's first turn still gets the tools to the LLM.

    The server below holds its init answer until the first chat call has reached the mock
    TrainGate: the order that made `--server` runs send turn 1 without `tools`.
    """
    stub = OpenAIStub([tool_call("add", {"a": 1, "b": 2}), text("3")])
    gate = MockTrainGate(stub_backend(stub))
    chat_arrived = anyio.Event()
    gate_app = gate.app

    async def watched_gate(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/v1/chat/completions":
            chat_arrived.set()
        await gate_app(scope, receive, send)

    gate_http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=watched_gate))
    server = create_app(
        HISTORY.ToolAppendOnlyAgent(),
        client=TrainGateClient(gate_http, retry=RetryPolicy(retries=0)),
        shutdown_grace_s=0.0,
    )

    async def late_init(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/rollout/init":
            await server(scope, receive, send)
            return
        held: list[Any] = []

        async def hold(message: Any) -> None:
            held.append(message)

        await server(scope, receive, hold)
        with anyio.fail_after(10):
            await chat_arrived.wait()
        for message in held:
            await send(message)

    request = RolloutRequest(
        rollout_id="r-late",
        server_url="http://traingate.test",
        messages=QUESTION,
        completion_params={},
    )
    transport = httpx2.ASGITransport(app=late_init)
    async with (
        gate_http,
        server.router.lifespan_context(server),
        httpx2.AsyncClient(transport=transport, base_url="http://server.test") as http,
    ):
        with anyio.fail_after(20):
            record, response = await gate.init_rollout(http, request)
            await gate.wait_completed("r-late", 10)

    assert response.status_code == 202
    first_turn = stub.bodies[0]
    assert [t["function"]["name"] for t in first_turn.get("tools", [])] == ["add"]
    assert record.result is not None
    assert record.result.metrics is not None
    assert record.result.metrics.num_tool_calls == 1
    assert gate.findings == []


# -- 2. a reply cut by max_tokens is visible ------------------------------------------------------


async def test_a_cut_last_reply_is_reported_and_ends_the_rollout_with_length(
    tmp_path: Path,
) -> None:
    """Row: finish `length`, each turn's finish_reason, a `truncated_reply` finding, a trace."""
    stub = OpenAIStub([truncated("The answer is 4, because first we")])
    agent = load_asset("bad_agents").GoodAgent()  # completes with the default finish_reason
    backend = stub_backend(stub)
    async with backend, Harness(agent, backend=backend, debug_dir=tmp_path) as harness:
        report = await run_batch(harness, [RowInput(1, QUESTION)], RunOptions(timeout_s=10))
    (row,) = report.rows
    assert row.status == "COMPLETED"
    assert row.finish_reason == "length"
    assert row.turn_finish_reasons == ["length"]
    assert [f.code for f in row.findings] == ["truncated_reply"]
    assert "max_tokens" in row.findings[0].message
    assert not row.passed
    assert row.as_dict()["turn_finish_reasons"] == ["length"]
    events = read_trace(tmp_path)
    turns = [e for e in events if e["event"] == "turn"]
    assert [(e["turn"], e["finish_reason"]) for e in turns] == [(1, "length")]


async def test_a_cut_turn_the_agent_recovered_from_is_not_a_finding() -> None:
    """Only the last reply matters: a cut tool turn followed by a full answer passes."""
    stub = OpenAIStub([truncated("Let me add 1 and"), text("3")])
    backend = stub_backend(stub)
    async with backend, Harness(HISTORY.ToolAppendOnlyAgent(), backend=backend) as harness:
        report = await run_batch(harness, [RowInput(1, QUESTION)], RunOptions(timeout_s=10))
    (row,) = report.rows
    assert row.turn_finish_reasons == ["length", "stop"]
    assert row.finish_reason == "stop"
    assert row.passed


# -- 3. a tool call written as text ---------------------------------------------------------------


@pytest.mark.parametrize("style", ["json", "fenced", "tags"])
async def test_a_tool_call_written_as_text_is_a_finding(style: str) -> None:
    """The server parsed no tool call, but the text calls a declared tool: reported."""
    stub = OpenAIStub([text_tool_call("add", {"a": 1, "b": 2}, style=style), text("3")])
    backend = stub_backend(stub)
    async with backend, Harness(HISTORY.ToolAppendOnlyAgent(), backend=backend) as harness:
        outcome = await harness.run(QUESTION, timeout_s=10)
    assert [f.code for f in outcome.findings] == ["tool_call_in_text"]
    message = outcome.findings[0].message
    assert "turn 1" in message
    assert "'add'" in message
    assert outcome.result is not None
    assert outcome.result.metrics is not None
    assert outcome.result.metrics.num_tool_calls == 0


@pytest.mark.parametrize(
    ("content", "found"),
    [
        ('{"name": "add", "arguments": {"a": 1}}', ("add", "a JSON object")),
        ('[{"name": "add", "parameters": {"a": 1}}]', ("add", "a JSON object")),
        ('Sure: {"name": "add", "arguments": {"a": 1}} done', ("add", "a JSON object in the text")),
        (
            '```\n{"function": {"name": "add", "arguments": "{}"}}\n```',
            ("add", "a fenced JSON block"),
        ),
        ('<tool_call>\n{"name": "add", "arguments": {}}', ("add", "<tool_call> tags")),
        ("I would use add with a=1 and b=2.", None),
        ('{"name": "multiply", "arguments": {"a": 1}}', None),
        ('{"name": "add"}', None),
        ("{not json", None),
        (None, None),
    ],
)
def test_find_text_tool_call(content: str | None, found: tuple[str, str] | None) -> None:
    """Calls to declared tools are found in each usual form; mentions and other tools are not."""
    result = find_text_tool_call(content, {"add"})
    assert (None if result is None else (result.name, result.style)) == found


class RunsTextCallsAgent(RolloutAgentLoop):
    """Parses a tool call written as JSON text and answers it with a tool message."""

    name = "runs-text-calls"

    def get_tools(self, request: RolloutRequest) -> list[Any]:
        return [HISTORY.ADD]

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = list(ctx.request.messages)
        first = await ctx.chat(messages)
        messages.append(first.message)
        call = json.loads(first.content or "{}")
        total = call["arguments"]["a"] + call["arguments"]["b"]
        messages.append({"role": "tool", "tool_call_id": "text-1", "content": str(total)})
        ctx.record_tool_call()
        second = await ctx.chat(messages)
        messages.append(second.message)
        return ctx.complete(messages, reward=1.0)


async def test_a_text_call_the_agent_ran_itself_is_no_finding() -> None:
    """An agent that parses text tool calls and answers them with a tool message passes."""
    stub = OpenAIStub([text_tool_call("add", {"a": 1, "b": 2}), text("3")])
    backend = stub_backend(stub)
    async with backend, Harness(RunsTextCallsAgent(), backend=backend) as harness:
        outcome = await harness.run(QUESTION, timeout_s=10)
    assert outcome.findings == []
    assert stub.bodies[1]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "text-1",
        "content": "3",
    }


async def test_text_that_calls_no_declared_tool_is_no_finding() -> None:
    """JSON about an undeclared tool, or no tools at all, is just text."""
    stub = OpenAIStub([text_tool_call("multiply", {"a": 1}), text("3")])
    backend = stub_backend(stub)
    async with backend, Harness(HISTORY.ToolAppendOnlyAgent(), backend=backend) as harness:
        outcome = await harness.run(QUESTION, timeout_s=10)
    assert outcome.findings == []


# -- 4. runaway and slow generations -----------------------------------------------------------


async def test_a_turn_without_max_tokens_gets_the_default() -> None:
    """A real backend caps turns that set no max_tokens; a turn's own value wins."""
    stub = OpenAIStub()
    async with stub_backend(stub) as backend:
        await backend.complete(chat_request(), RolloutRecord("r-1"))
        await backend.complete(chat_request(max_tokens=64), RolloutRecord("r-1"))
    assert [body["max_tokens"] for body in stub.bodies] == [DEFAULT_MAX_TOKENS, 64]


@pytest.mark.slow
async def test_a_timed_out_generation_is_not_retried() -> None:
    """A read timeout fails the turn at once, saying why it was not retried."""
    stub = OpenAIStub([slow(2.0)])
    with stub.serve() as url:
        backend = OpenAICompatibleBackend(
            url, "stub-model", timeout_s=0.5, retry=RetryPolicy(retries=3, base_delay_s=0.01)
        )
        async with backend:
            with pytest.raises(LLMBackendError) as info:
                await backend.complete(chat_request(), RolloutRecord("r-1"))
    assert info.value.kind == "timeout"
    assert "not retried" in str(info.value)
    assert "--llm-timeout" in str(info.value)
    assert len(stub.bodies) == 1


@pytest.mark.slow
def test_cli_against_a_real_socket_shows_the_cut_and_the_text_tool_call(tmp_path: Path) -> None:
    """`osmosis test --llm-url`: each row's turns, finish reasons and findings in --output."""
    from typer.testing import CliRunner

    from osmosis_rollout.cli import app

    dataset = tmp_path / "rows.jsonl"
    dataset.write_text(json.dumps({"messages": QUESTION}) + "\n")
    out = tmp_path / "out.jsonl"
    stub = OpenAIStub([text_tool_call("add", {"a": 1, "b": 2}, style="tags"), truncated("3 is")])
    agent = f"{Path(__file__).parent}/assets/fnd_history.py:ToolAppendOnlyAgent"
    with stub.serve() as url:
        result = CliRunner().invoke(
            app,
            ["test", agent, "-d", str(dataset), "--llm-url", url, "--model", "m", "-o", str(out)],
        )
    assert result.exit_code == 1, result.stdout + result.stderr
    row = json.loads(out.read_text().splitlines()[0])
    assert row["finish_reason"] == "length"
    assert row["turn_finish_reasons"] == ["stop", "length"]
    assert {f["code"] for f in row["findings"]} == {"truncated_reply", "tool_call_in_text"}
    assert [body["max_tokens"] for body in stub.bodies] == [DEFAULT_MAX_TOKENS] * 2
    assert "truncated_reply" in result.stdout


# -- 4 and 6, at the interactive prompt -------------------------------------------------------


class CrashesOnARefusedCall(RolloutAgentLoop):
    """Calls TrainGate with a key of its own and lets the 401 end the rollout."""

    name = "crashes-on-refusal"

    def get_tools(self, request: RolloutRequest) -> list[Any]:
        return []

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        channel: Any = ctx.llm
        request = CompletionsRequest(rollout_id=ctx.request.rollout_id, messages=QUESTION)
        await channel.client.chat_completions(
            channel.server_url, request, api_key="not-the-key", request_id="x"
        )
        return ctx.complete(QUESTION)


async def test_errors_name_the_mock_traingate_not_its_internal_url() -> None:
    """An error quoting the mock's URL names it instead (http://traingate.test is not real)."""
    async with Harness(CrashesOnARefusedCall(), backend=stub_backend(OpenAIStub())) as harness:
        report = await run_batch(harness, [RowInput(1, QUESTION)], RunOptions(timeout_s=10))
    (row,) = report.rows
    assert row.status == "ERROR"
    assert row.error_message is not None
    assert "traingate.test" not in row.error_message
    assert "the mock TrainGate's chat endpoint" in row.error_message


@pytest.mark.slow
@pytest.mark.parametrize(("concurrency", "labelled"), [("3", True), ("1", False)])
def test_llm_time_is_labelled_as_queueing_when_turns_overlapped(
    tmp_path: Path, concurrency: str, labelled: bool
) -> None:
    """With several turns at the model server at once, the report says llm time has queueing."""
    from typer.testing import CliRunner

    from osmosis_rollout.cli import app

    dataset = tmp_path / "rows.jsonl"
    dataset.write_text("".join(json.dumps({"messages": QUESTION}) + "\n" for _ in range(3)))
    stub = OpenAIStub(default=slow(0.4, text("3")))
    agent = f"{Path(__file__).parent}/assets/bad_agents.py:GoodAgent"
    with stub.serve() as url:
        args = ["test", agent, "-d", str(dataset), "--llm-url", url, "--model", "m"]
        result = CliRunner().invoke(app, [*args, "--concurrency", concurrency])
    assert result.exit_code == 0, result.stdout + result.stderr
    assert (
        bool(re.search(r"llm time includes queueing: up to [23] turns", result.stderr)) is labelled
    )
