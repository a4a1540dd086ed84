"""``OpenAICompatibleBackend``'s carrier: the lean one by default, as the server's TrainGate
client picks it; replies bounded and streamed replies folded by the shared reader."""

from __future__ import annotations

import json

import httpx2
import pytest

from osmosis_rollout.errors import LLMBackendError
from osmosis_rollout.protocol import CompletionsRequest
from osmosis_rollout.testing import OpenAICompatibleBackend, RolloutRecord
from osmosis_rollout.transport import Http1Transport, Httpx2Transport
from osmosis_rollout.transport.sse import DONE_EVENT, encode_event

pytestmark = pytest.mark.anyio

QUESTION = CompletionsRequest(rollout_id="r", messages=[{"role": "user", "content": "hi"}])


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _answering(response: httpx2.Response) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(transport=httpx2.MockTransport(lambda request: response))


async def test_the_default_carrier_is_the_server_clients() -> None:
    """On asyncio without a proxy the turns go through ``Http1Transport``."""
    async with OpenAICompatibleBackend("http://127.0.0.1:9/v1", "m") as backend:
        assert isinstance(backend.carrier, Http1Transport)


async def test_osmosis_http_client_httpx2_forces_httpx2(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same switch as the server's: ``OSMOSIS_HTTP_CLIENT=httpx2``."""
    monkeypatch.setenv("OSMOSIS_HTTP_CLIENT", "httpx2")
    async with OpenAICompatibleBackend("http://127.0.0.1:9/v1", "m") as backend:
        assert isinstance(backend.carrier, Httpx2Transport)


async def test_a_streamed_reply_is_one_completion() -> None:
    """A server that streams (``"stream": true`` in ``extra_body``) is read as its chunks."""
    chunks = [
        {"id": "s1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "4"}}]},
        {"choices": [{"index": 0, "delta": {"content": "2"}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
    ]
    body = b"".join(encode_event(chunk) for chunk in chunks) + DONE_EVENT
    stream = httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body)
    async with (
        _answering(stream) as http,
        OpenAICompatibleBackend("http://llm.test/v1", "m", http=http) as backend,
    ):
        reply = await backend.complete(QUESTION, RolloutRecord("r"))
    assert reply.message.content == "42"
    assert reply.choices[0].finish_reason == "stop"
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (3, 2)


async def test_a_reply_past_the_bound_is_a_clear_error() -> None:
    """A reply larger than ``max_reply_bytes`` is refused, not held in memory."""
    huge = json.dumps({"choices": [], "pad": "x" * 5000}).encode()
    response = httpx2.Response(200, headers={"content-type": "application/json"}, content=huge)
    async with (
        _answering(response) as http,
        OpenAICompatibleBackend(
            "http://llm.test/v1", "m", http=http, max_reply_bytes=1000
        ) as backend,
    ):
        with pytest.raises(LLMBackendError, match="larger than 1000 bytes") as info:
            await backend.complete(QUESTION, RolloutRecord("r"))
    assert info.value.kind == "bad_response"
