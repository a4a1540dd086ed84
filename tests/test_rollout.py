"""run_rollout end to end against the MockTrainGate over real HTTP (ASGI transport)."""

from __future__ import annotations

import json

import pytest

from osmosis_rollout.client import TrainGateClient
from osmosis_rollout.protocol import RolloutRequest, RolloutStatus
from osmosis_rollout.rollout import run_rollout
from osmosis_rollout.testing import MockTrainGate, ScriptedBackend

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
