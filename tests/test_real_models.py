"""What real OpenAI-compatible servers send, through the OpenAI stub: no false findings."""

from __future__ import annotations

from typing import Any

import anyio
import httpx2
import pytest

from osmosis_rollout.client import RetryPolicy, TrainGateClient
from osmosis_rollout.protocol import RolloutRequest, same_message
from osmosis_rollout.server import create_app
from osmosis_rollout.testing import Harness, MockTrainGate, OpenAICompatibleBackend

from .openai_stub import OpenAIStub, text, tool_call
from .support import load_asset

pytestmark = pytest.mark.anyio

STUB_URL = "http://stub.test/v1"
QUESTION = [{"role": "user", "content": "What is 1 + 2?"}]
HISTORY = load_asset("fnd_history")


def stub_backend(stub: OpenAIStub) -> OpenAICompatibleBackend:
    """An OpenAICompatibleBackend that reaches ``stub`` in-process."""
    http = httpx2.AsyncClient(transport=stub.transport())
    return OpenAICompatibleBackend(STUB_URL, "stub-model", http=http)


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
