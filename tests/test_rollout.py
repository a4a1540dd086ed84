"""run_rollout end to end against the MockTrainGate over real HTTP (ASGI transport)."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from osmosis_rollout.agent import RolloutAgentLoop
from osmosis_rollout.client import TrainGateClient
from osmosis_rollout.errors import ToolError
from osmosis_rollout.protocol import RolloutRequest, RolloutResponse, RolloutStatus
from osmosis_rollout.rollout import RolloutControl, run_rollout
from osmosis_rollout.testing import MockTrainGate, ScriptedBackend
from osmosis_rollout.tracing import Tracer

from .support import load_asset

pytestmark = pytest.mark.anyio

ADD_CALL = {
    "content": None,
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "add", "arguments": json.dumps({"a": 3, "b": 4})},
        }
    ],
}


def make_request(rollout_id: str = "r-1", **overrides: object) -> RolloutRequest:
    data: dict[str, object] = {
        "rollout_id": rollout_id,
        "server_url": "http://traingate.test",
        "messages": [{"role": "user", "content": "What is 3 + 4?"}],
        "completion_params": {"temperature": 0.7, "max_tokens": 128},
        "api_key": "tg-secret-key",
    }
    data.update(overrides)
    return RolloutRequest.model_validate(data)


async def test_seed_calculator_runs_multi_turn_with_metrics(
    mock_client: tuple[MockTrainGate, TrainGateClient],
) -> None:
    """The seed CalculatorAgent, imports changed only, completes a two-turn tool rollout."""
    gate, client = mock_client
    gate.backend = ScriptedBackend([ADD_CALL, {"content": "3 + 4 = 7"}])
    agent = load_asset("seed_calculator").CalculatorAgent()
    request = make_request()
    gate.expect(request.rollout_id, api_key="tg-secret-key")

    response = await run_rollout(agent, request, client.channel(request))

    assert response.status is RolloutStatus.COMPLETED
    assert response.finish_reason == "stop"
    assert [m["role"] for m in response.final_messages] == ["user", "assistant", "assistant"]
    assert response.final_messages[-1]["content"] == "3 + 4 = 7"
    metrics = response.metrics
    assert metrics is not None
    assert metrics.num_llm_calls == 2
    assert metrics.num_tool_calls == 1
    assert metrics.tool_latency_ms == pytest.approx(10.5)
    assert metrics.llm_latency_ms > 0
    assert metrics.total_latency_ms >= metrics.llm_latency_ms
    assert metrics.prompt_tokens > 0
    assert metrics.response_tokens > 0
    assert metrics.max_context_tokens == max(
        r.usage.prompt_tokens for r in gate.records["r-1"].replies
    )
    record = gate.records["r-1"]
    assert record.findings == []
    assert record.request_ids == ["r-1:1", "r-1:2"]
    assert record.chats[0].temperature == 0.7
    assert record.chats[0].max_tokens == 128


# -- failures become one ERROR response -----------------------------------------------------


def faulty(name: str, *args: object) -> RolloutAgentLoop:
    """An agent from tests/assets/fnd_faulty.py."""
    agent: RolloutAgentLoop = getattr(load_asset("fnd_faulty"), name)(*args)
    return agent


async def run_with_gate(
    mock_client: tuple[MockTrainGate, TrainGateClient],
    agent: RolloutAgentLoop,
    **kwargs: Any,
) -> RolloutResponse:
    """Run ``agent`` on the default request against the mock TrainGate."""
    gate, client = mock_client
    request = make_request()
    gate.expect(request.rollout_id, api_key="tg-secret-key")
    return await run_rollout(agent, request, client.channel(request), **kwargs)


def assert_partial_conversation(response: RolloutResponse) -> None:
    """The ERROR response keeps the question and the one reply the agent got."""
    assert response.final_messages == [
        {"role": "user", "content": "What is 3 + 4?"},
        {"role": "assistant", "content": "done"},
    ]


async def test_agent_exception_becomes_error_with_partial_conversation(
    mock_client: tuple[MockTrainGate, TrainGateClient], caplog: pytest.LogCaptureFixture
) -> None:
    """A raising agent yields ERROR/error, its conversation so far, and the exception named."""
    response = await run_with_gate(mock_client, faulty("RaisesAfterReplyAgent"))
    assert response.status is RolloutStatus.ERROR
    assert response.finish_reason == "error"
    assert_partial_conversation(response)
    assert response.error_message == "agent raised RuntimeError: tool backend exploded"
    assert response.metrics is not None
    assert response.metrics.num_llm_calls == 1
    assert response.reward is None
    assert "tool backend exploded" in caplog.text


async def test_hanging_agent_times_out(
    mock_client: tuple[MockTrainGate, TrainGateClient],
) -> None:
    """An agent that never returns is stopped at its deadline: ERROR/timeout, partial kept."""
    started = anyio.current_time()
    response = await run_with_gate(mock_client, faulty("HangingAgent"), deadline_s=0.2)
    assert anyio.current_time() - started < 5
    assert response.status is RolloutStatus.ERROR
    assert response.finish_reason == "timeout"
    assert response.error_message == "rollout exceeded its deadline of 0.2 s"
    assert_partial_conversation(response)


def tool_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A reply that calls one tool."""
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {"content": None, "tool_calls": [{"id": "c1", "type": "function", "function": function}]}


@pytest.mark.parametrize(
    ("attr", "call"),
    [
        ("SlowSqlAgent", tool_call("run_sql", {"query": "SELECT 1"})),  # sync: a worker thread
        ("SlowFetchAgent", tool_call("fetch", {"url": "http://x.test"})),  # async
    ],
)
async def test_deadline_names_the_tool_call_it_cut(
    mock_client: tuple[MockTrainGate, TrainGateClient], attr: str, call: dict[str, Any]
) -> None:
    """A tool still running at the deadline is named in the timeout, with how long it ran."""
    gate, _client = mock_client
    gate.backend = ScriptedBackend([call])
    agent = getattr(load_asset("val_dry_run_tool_hangs"), attr)()
    started = anyio.current_time()
    response = await run_with_gate(mock_client, agent, deadline_s=0.4)
    assert anyio.current_time() - started < 1.2  # not held by the sleeping sync tool
    assert response.finish_reason == "timeout"
    name = call["tool_calls"][0]["function"]["name"]
    message = response.error_message or ""
    found = re.fullmatch(
        rf"rollout exceeded its deadline of 0\.4 s; tool '{name}' had been running for "
        r"(\d\.\d) s of it",
        message,
    )
    assert found, message
    assert 0.1 <= float(found.group(1)) <= 0.4


async def test_deadline_does_not_name_a_tool_cut_earlier(
    mock_client: tuple[MockTrainGate, TrainGateClient],
) -> None:
    """A tool call the agent itself gave up on long before the deadline is not blamed for it."""
    gate, _client = mock_client
    gate.backend = ScriptedBackend([tool_call("fetch", {"url": "http://x.test"})])
    toolbox = load_asset("val_dry_run_tool_hangs").SlowFetchAgent().toolbox

    class GivesUpAgent(RolloutAgentLoop):
        name = "gives-up"

        def get_tools(self, request: RolloutRequest) -> list:
            return toolbox.schemas

        async def run(self, ctx: Any) -> Any:
            result = await ctx.chat(list(ctx.request.messages))
            with anyio.move_on_after(0.05):
                await toolbox.execute(ctx, result.tool_calls)
            await anyio.sleep_forever()

    response = await run_with_gate(mock_client, GivesUpAgent(), deadline_s=0.4)
    assert response.error_message == "rollout exceeded its deadline of 0.4 s"


async def test_control_cancel_ends_the_rollout_as_cancelled(
    mock_client: tuple[MockTrainGate, TrainGateClient],
) -> None:
    """RolloutControl.cancel() stops a running agent: ERROR/cancelled with the partial history."""
    started = anyio.Event()
    control = RolloutControl()
    responses: list[RolloutResponse] = []

    async def run() -> None:
        agent = faulty("HangingAgent", started)
        responses.append(await run_with_gate(mock_client, agent, control=control))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await started.wait()
            control.cancel()

    (response,) = responses
    assert response.status is RolloutStatus.ERROR
    assert response.finish_reason == "cancelled"
    assert response.error_message is not None
    assert "cancelled" in response.error_message
    assert_partial_conversation(response)


async def test_cancel_before_start_still_answers_cancelled(
    mock_client: tuple[MockTrainGate, TrainGateClient],
) -> None:
    """A rollout cancelled before it runs still returns its ERROR/cancelled response."""
    control = RolloutControl()
    control.cancel()
    with anyio.fail_after(5):
        response = await run_with_gate(mock_client, faulty("HangingAgent"), control=control)
    assert response.finish_reason == "cancelled"
    assert response.final_messages == [{"role": "user", "content": "What is 3 + 4?"}]
    assert mock_client[0].records["r-1"].chats == []  # no LLM turn after the cancel


@pytest.mark.parametrize(
    ("agent_name", "returned"), [("ReturnsNoneAgent", "None"), ("ReturnsDictAgent", "dict")]
)
async def test_run_returning_a_non_result_is_an_error(
    mock_client: tuple[MockTrainGate, TrainGateClient], agent_name: str, returned: str
) -> None:
    """run() returning None or a non-RolloutResult is ERROR, telling the user what to return."""
    response = await run_with_gate(mock_client, faulty(agent_name))
    assert response.status is RolloutStatus.ERROR
    assert response.finish_reason == "error"
    assert response.error_message is not None
    assert response.error_message.startswith(f"run() returned {returned}; it must return")
    assert "ctx.complete(" in response.error_message
    assert_partial_conversation(response)


async def test_nan_reward_is_an_error(
    mock_client: tuple[MockTrainGate, TrainGateClient],
) -> None:
    """A NaN reward cannot be trained on: ERROR, saying the reward must be finite."""
    response = await run_with_gate(mock_client, faulty("NaNRewardAgent"))
    assert response.status is RolloutStatus.ERROR
    assert response.reward is None
    assert response.error_message == "reward must be a finite number or None, got nan"
    assert_partial_conversation(response)


async def test_well_behaved_agent_completes_with_its_reward(
    mock_client: tuple[MockTrainGate, TrainGateClient],
) -> None:
    """The control case for the faults above: the same first turn, then COMPLETED."""
    response = await run_with_gate(mock_client, faulty("ChatOnceAgent"))
    assert response.status is RolloutStatus.COMPLETED
    assert response.reward == 1.0
    assert response.error_message is None
    assert_partial_conversation(response)


async def test_traingate_401_is_an_error_without_the_api_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A 401 on a chat turn ends the rollout ERROR; the key TrainGate echoed is not in it."""
    caplog.set_level(logging.DEBUG)
    calls: list[httpx2.Request] = []

    def reject(request: httpx2.Request) -> httpx2.Response:
        calls.append(request)
        auth = request.headers.get("authorization", "")
        return httpx2.Response(401, json={"detail": f"invalid credentials: {auth}"})

    request = make_request()
    async with httpx2.AsyncClient(transport=httpx2.MockTransport(reject)) as http:
        client = TrainGateClient(http)
        response = await run_rollout(faulty("ChatOnceAgent"), request, client.channel(request))

    assert len(calls) == 1  # a 401 is not retried
    assert response.status is RolloutStatus.ERROR
    assert response.finish_reason == "error"
    assert response.error_message is not None
    assert "HTTP 401" in response.error_message
    assert "invalid credentials" in response.error_message
    assert "tg-secret-key" not in response.model_dump_json()
    assert "tg-secret-key" not in caplog.text
    assert response.final_messages == [{"role": "user", "content": "What is 3 + 4?"}]


@pytest.mark.parametrize("error_class", [RuntimeError, ToolError])
async def test_agent_exception_holding_the_api_key_is_scrubbed(
    mock_client: tuple[MockTrainGate, TrainGateClient],
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
    error_class: type[Exception],
) -> None:
    """An exception whose text holds the api_key leaks it to no message, log line or trace."""
    caplog.set_level(logging.DEBUG)
    tracer = Tracer(tmp_path)
    response = await run_with_gate(
        mock_client, faulty("RaisesWithKeyAgent", error_class), tracer=tracer
    )
    tracer.close()
    assert response.status is RolloutStatus.ERROR
    assert response.error_message is not None
    assert "upstream rejected Bearer **********" in response.error_message
    assert error_class.__name__ in response.error_message
    assert "tg-secret-key" not in response.model_dump_json()
    assert "upstream rejected" in caplog.text
    assert "tg-secret-key" not in caplog.text
    assert "tg-secret-key" not in tracer.path_for("r-1").read_text()
