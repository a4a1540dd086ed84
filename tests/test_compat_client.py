"""v1's ``OsmosisLLMClient``: its constructor, two calls, metrics and errors, on a real socket."""

from __future__ import annotations

import pytest

from osmosis_rollout.compat import (
    CompletionsResult,
    OsmosisLLMClient,
    OsmosisValidationError,
    RolloutMetrics,
)
from osmosis_rollout.testing import MockTrainGate, ScriptedBackend

from .support import free_port, serve_in_thread

pytestmark = pytest.mark.anyio


def test_constructor_defaults_are_v1s() -> None:
    client = OsmosisLLMClient("http://traingate:8080///", "r-1")
    assert client.server_url == "http://traingate:8080"
    assert (client.rollout_id, client.api_key) == ("r-1", None)
    assert client.timeout_seconds == 300.0
    assert (client.max_retries, client.complete_rollout_retries) == (3, 2)
    tuned = OsmosisLLMClient("http://t", "r", "key", 0, 0, 5)
    assert (tuned.timeout_seconds, tuned.max_retries, tuned.complete_rollout_retries) == (
        300.0,
        0,
        5,
    )


async def test_close_is_safe_before_any_call_and_twice() -> None:
    client = OsmosisLLMClient("http://t", "r")
    await client.close()
    await client.close()


async def test_a_rollout_driven_by_hand_through_the_v1_client() -> None:
    gate = MockTrainGate(ScriptedBackend([{"content": "4"}]))
    gate.expect("r-1", api_key="sk-1", tools=[])
    with serve_in_thread(gate.app) as url:
        async with OsmosisLLMClient(url, "r-1", api_key="sk-1") as client:
            messages = [{"role": "user", "content": "2 + 2?"}]
            result = await client.chat_completions(messages, temperature=0.3, stop="</s>")
            assert isinstance(result, CompletionsResult)
            assert result.message == {"role": "assistant", "content": "4"}
            assert (result.content, result.has_tool_calls) == ("4", False)
            metrics = client.get_metrics()
            assert isinstance(metrics, RolloutMetrics)
            assert metrics.num_llm_calls == 1
            assert metrics.prompt_tokens > 0
            await client.complete_rollout("COMPLETED", [*messages, result.message], reward=1.0)
    record = gate.records["r-1"]
    [chat] = record.chats
    assert (chat.temperature, chat.top_p, chat.max_tokens, chat.stop) == (0.3, 1.0, 512, ["</s>"])
    [completion] = record.completions
    assert (completion.status, completion.reward) == ("COMPLETED", 1.0)
    assert completion.metrics is not None
    assert completion.metrics.num_llm_calls == 1  # the client's own counters, as in v1
    assert gate.findings == []


async def test_a_wrong_key_is_an_osmosis_validation_error() -> None:
    gate = MockTrainGate(ScriptedBackend([{"content": "4"}]))
    gate.expect("r-2", api_key="right", tools=[])
    with serve_in_thread(gate.app) as url:
        client = OsmosisLLMClient(url, "r-2", api_key="wrong", max_retries=0)
        try:
            with pytest.raises(OsmosisValidationError) as caught:
                await client.chat_completions([{"role": "user", "content": "hi"}])
        finally:
            await client.close()
    assert caught.value.status_code == 401
    assert "wrong" not in str(caught.value)
    assert client.get_metrics().num_llm_calls == 0  # only successful turns count


async def test_an_unreachable_traingate_is_a_transport_error() -> None:
    from osmosis_rollout.compat import OsmosisTransportError

    client = OsmosisLLMClient(f"http://127.0.0.1:{free_port()}", "r-3", max_retries=0)
    try:
        with pytest.raises(OsmosisTransportError):
            await client.chat_completions([{"role": "user", "content": "hi"}])
    finally:
        await client.close()
