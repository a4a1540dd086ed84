"""LLM backends: the offline MockLLMBackend, and OpenAICompatibleBackend against a local stub."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx2
import jsonschema
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from osmosis_rollout import RolloutAgentLoop, RolloutContext, RolloutResult
from osmosis_rollout.client import RetryPolicy, TrainGateClient
from osmosis_rollout.errors import ConfigError, LLMBackendError
from osmosis_rollout.protocol import (
    CompletionsRequest,
    CompletionsResponse,
    OpenAIFunctionToolSchema,
    RolloutRequest,
    RolloutStatus,
    wire,
)
from osmosis_rollout.rollout import run_rollout
from osmosis_rollout.testing import (
    MockLLMBackend,
    MockTrainGate,
    OpenAICompatibleBackend,
    RolloutRecord,
)

pytestmark = pytest.mark.anyio

SECRET = "sk-test-very-secret-key"

ADD = OpenAIFunctionToolSchema.model_validate(
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            },
        },
    }
)
SEARCH = OpenAIFunctionToolSchema.model_validate(
    {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "minLength": 3, "maxLength": 30},
                    "filters": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "field": {"enum": ["year", "author", None]},
                                "value": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
                            },
                            "required": ["field", "value"],
                        },
                        "maxItems": 3,
                    },
                    "limit": {"type": "integer", "exclusiveMinimum": 0, "maximum": 50},
                },
                "required": ["query", "filters"],
            },
        },
    }
)


def chat(
    rollout_id: str = "r-1", messages: list[dict[str, Any]] | None = None, **params: Any
) -> CompletionsRequest:
    """A chat request as an agent would send it."""
    return CompletionsRequest.model_validate(
        {
            "rollout_id": rollout_id,
            "messages": messages or [{"role": "user", "content": "What is 3 + 4?"}],
            **params,
        }
    )


def assert_consistent(reply: CompletionsResponse) -> None:
    """Usage numbers and token lists agree."""
    usage = reply.usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert len(reply.token_ids or []) == usage.completion_tokens
    assert len(reply.logprobs or []) == usage.completion_tokens
    assert len(reply.prompt_token_ids or []) == usage.prompt_tokens


# -- MockLLMBackend ---------------------------------------------------------------------------


async def test_mock_calls_every_tool_then_answers_with_the_results() -> None:
    """``all``: one turn calls each declared tool with schema-valid arguments; the next
    answers."""
    backend = MockLLMBackend(seed=3, policy="all")
    record = RolloutRecord("r-1", tools=[ADD, SEARCH])
    first = await backend.complete(chat(), record)
    record.replies.append(first)

    assert first.choices[0].finish_reason == "tool_calls"
    calls = first.message.tool_calls or []
    assert [c.function.name for c in calls] == ["add", "search"]
    assert len({c.id for c in calls}) == 2
    for call, tool in zip(calls, (ADD, SEARCH), strict=True):
        jsonschema.validate(json.loads(call.function.arguments), tool.function.parameters)
    assert_consistent(first)

    history = [
        {"role": "user", "content": "What is 3 + 4?"},
        first.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": calls[0].id, "content": "7"},
        {"role": "tool", "tool_call_id": calls[1].id, "content": "no results"},
    ]
    second = await backend.complete(chat(messages=history), record)
    assert second.choices[0].finish_reason == "stop"
    assert second.message.tool_calls is None
    assert second.message.content == "Done. add returned 7; search returned no results."
    assert_consistent(second)


@pytest.mark.parametrize("tool_turns", [0, 1, 3])
async def test_mock_makes_tool_turns_tool_call_turns(tool_turns: int) -> None:
    """``all``: `tool_turns` tool-call turns come first, then only text answers."""
    backend = MockLLMBackend(tool_turns=tool_turns, policy="all")
    record = RolloutRecord("r-1", tools=[ADD])
    reasons = []
    for _ in range(tool_turns + 2):
        reply = await backend.complete(chat(), record)
        record.replies.append(reply)
        reasons.append(reply.choices[0].finish_reason)
    assert reasons == ["tool_calls"] * tool_turns + ["stop", "stop"]


async def test_mock_without_tools_echoes_the_user() -> None:
    """With no declared tools the first reply is a final answer quoting the user."""
    reply = await MockLLMBackend().complete(chat(), RolloutRecord("r-1"))
    assert reply.choices[0].finish_reason == "stop"
    assert reply.message.content == "Answer to: What is 3 + 4?"


async def test_mock_arguments_are_deterministic_and_varied() -> None:
    """Same seed and rollout give the same arguments; other seeds or rollouts vary them."""

    async def arguments(seed: int, rollout_id: str) -> list[str]:
        reply = await MockLLMBackend(seed=seed).complete(
            chat(rollout_id), RolloutRecord(rollout_id, tools=[ADD, SEARCH])
        )
        return [c.function.arguments for c in reply.message.tool_calls or []]

    assert await arguments(0, "r-1") == await arguments(0, "r-1")
    assert len({tuple(await arguments(seed, "r-1")) for seed in range(5)}) == 5
    assert len({tuple(await arguments(0, f"r-{i}")) for i in range(5)}) == 5


@pytest.mark.parametrize("tools", [[], [ADD, SEARCH]], ids=["text", "tool_calls"])
async def test_mock_respects_max_tokens(tools: list[OpenAIFunctionToolSchema]) -> None:
    """A reply longer than max_tokens is cut to it, says `length`, and stays consistent."""
    reply = await MockLLMBackend().complete(chat(max_tokens=4), RolloutRecord("r-1", tools=tools))
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 4
    assert reply.message.tool_calls is None
    assert len(reply.message.content or "") <= 16
    assert_consistent(reply)


async def test_mock_reports_a_tool_schema_it_cannot_satisfy() -> None:
    """An impossible tool schema is a clear, non-systemic backend error naming the tool."""
    broken = OpenAIFunctionToolSchema.model_validate(
        {
            "type": "function",
            "function": {
                "name": "broken",
                "parameters": {
                    "type": "object",
                    "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 1}},
                    "required": ["n"],
                },
            },
        }
    )
    with pytest.raises(LLMBackendError, match="cannot call tool 'broken'") as info:
        await MockLLMBackend().complete(chat(), RolloutRecord("r-1", tools=[broken]))
    assert info.value.kind == "tool_schema"
    assert info.value.systemic is False


@pytest.mark.parametrize(("parameters", "ok"), [({}, True), ({"type": "string"}, False)])
async def test_mock_tool_arguments_are_always_an_object(
    parameters: dict[str, Any], ok: bool
) -> None:
    """A schema without a type still gets `{}`-style object arguments; a non-object is refused."""
    tool = OpenAIFunctionToolSchema.model_validate(
        {"type": "function", "function": {"name": "ping", "parameters": parameters}}
    )
    record = RolloutRecord("r-1", tools=[tool])
    if ok:
        reply = await MockLLMBackend().complete(chat(), record)
        calls = reply.message.tool_calls or []
        assert isinstance(json.loads(calls[0].function.arguments), dict)
    else:
        with pytest.raises(LLMBackendError, match="must describe an object"):
            await MockLLMBackend().complete(chat(), record)


class Adder(RolloutAgentLoop):
    """Executes `add` calls, so the final answer can quote the sum."""

    name = "adder"

    def get_tools(self, request: RolloutRequest) -> list[OpenAIFunctionToolSchema]:
        return [ADD]

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = list(ctx.request.messages)
        for _ in range(ctx.request.max_turns):
            result = await ctx.chat(messages)
            messages.append(result.message)
            if not result.has_tool_calls:
                break
            for call in result.tool_calls:
                args = json.loads(call["function"]["arguments"])
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": call["id"],
                        "content": str(args["a"] + args["b"]),
                    }
                )
                ctx.record_tool_call(latency_ms=1.0)
        return ctx.complete(messages, reward=1.0)


async def test_mock_drives_an_agent_through_the_mock_traingate() -> None:
    """Through MockTrainGate and the real client, a tool agent completes with no findings."""
    gate = MockTrainGate(MockLLMBackend(seed=1))
    request = RolloutRequest.model_validate(
        {
            "rollout_id": "r-e2e",
            "server_url": "http://traingate.test",
            "messages": [{"role": "user", "content": "Add two numbers"}],
            "completion_params": {"max_tokens": 256},
            "api_key": "tg-key",
        }
    )
    gate.expect("r-e2e", api_key="tg-key", tools=[ADD])
    async with httpx2.AsyncClient(transport=gate.transport()) as http:
        client = TrainGateClient(http, retry=RetryPolicy(retries=0))
        response = await run_rollout(Adder(), request, client.channel(request))

    assert response.status is RolloutStatus.COMPLETED
    assert response.finish_reason == "stop"
    assert gate.findings == []
    roles = [m["role"] for m in response.final_messages]
    assert roles == ["user", "assistant", "tool", "assistant"]
    args = json.loads(response.final_messages[1]["tool_calls"][0]["function"]["arguments"])
    total = str(args["a"] + args["b"])
    assert response.final_messages[-1]["content"] == f"Done. add returned {total}."


class FlakyOnce(MockLLMBackend):
    """Fails the second turn once with a transient backend error, then behaves."""

    failed = False

    async def complete(
        self, request: CompletionsRequest, record: RolloutRecord
    ) -> CompletionsResponse:
        if len(record.replies) == 1 and not self.failed:
            self.failed = True
            raise LLMBackendError("blip", kind="http")
        return await super().complete(request, record)


async def test_a_retried_backend_error_is_not_a_history_rewrite() -> None:
    """After a transient backend error the client's retry is not mistaken for a rewrite."""
    gate = MockTrainGate(FlakyOnce())
    request = RolloutRequest.model_validate(
        {
            "rollout_id": "r-flaky",
            "server_url": "http://traingate.test",
            "messages": [{"role": "user", "content": "Add"}],
            "completion_params": {},
        }
    )
    gate.expect("r-flaky", tools=[ADD])
    async with httpx2.AsyncClient(transport=gate.transport()) as http:
        client = TrainGateClient(http, retry=RetryPolicy(retries=1), sleep=Sleeps())
        response = await run_rollout(Adder(), request, client.channel(request))
    assert response.status is RolloutStatus.COMPLETED
    assert gate.findings == []
    assert len(gate.records["r-flaky"].chats) == 2


# -- OpenAICompatibleBackend against a real uvicorn stub ---------------------------------------


@dataclass
class StubLLM:
    """An OpenAI-style server: replies are scripted as (status, body, headers) per request."""

    script: list[tuple[int, Any, dict[str, str]]] = field(default_factory=list)
    seen: list[tuple[dict[str, str], Any]] = field(default_factory=list)

    async def completions(self, request: Request) -> Response:
        raw = await request.body()
        self.seen.append((dict(request.headers), json.loads(raw)))
        status, body, headers = self.script.pop(0) if self.script else (200, REPLY, {})
        if isinstance(body, str):
            return Response(body, status_code=status, headers=headers)
        return JSONResponse(body, status_code=status, headers=headers)


REPLY = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1760000000,
    "model": "stub-model",
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'},
                    }
                ],
            },
            "logprobs": {"content": [{"token": "x", "logprob": -0.5}]},
        }
    ],
    "usage": {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25},
}


@pytest.fixture(scope="module")
def llm_server() -> Iterator[tuple[StubLLM, str]]:
    """A StubLLM behind a real uvicorn on 127.0.0.1 (ephemeral port), stopped afterwards."""
    stub = StubLLM()
    app = Starlette(routes=[Route("/v1/chat/completions", stub.completions, methods=["POST"])])
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)  # listening before uvicorn starts: early connections wait in the backlog
    server = uvicorn.Server(uvicorn.Config(app, lifespan="off", log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield stub, f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@pytest.fixture
def stub(llm_server: tuple[StubLLM, str]) -> tuple[StubLLM, str]:
    """The module's stub server with an empty script and history for this test."""
    llm, url = llm_server
    llm.script.clear()
    llm.seen.clear()
    return llm, url


class Sleeps:
    """An injectable sleep that records the delays instead of waiting."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


def backend(url: str, *, sleeps: Sleeps | None = None, **options: Any) -> OpenAICompatibleBackend:
    """A backend with a fast retry policy and recorded sleeps."""
    return OpenAICompatibleBackend(
        url,
        "stub-model",
        options.pop("api_key", SECRET),
        retry=RetryPolicy(retries=2, base_delay_s=0.5, max_delay_s=1.0),
        sleep=sleeps or Sleeps(),
        **options,
    )


@pytest.mark.slow
async def test_openai_forwards_messages_params_and_tools(stub: tuple[StubLLM, str]) -> None:
    """The request carries model, messages, sampling params, extras and the declared tools."""
    llm, url = stub
    request = chat(temperature=0.3, top_p=0.9, max_tokens=64, stop="END", seed=7)
    async with backend(url, extra_headers={"X-Org": "lab"}) as llm_backend:
        reply = await llm_backend.complete(request, RolloutRecord("r-1", tools=[ADD, SEARCH]))

    headers, body = llm.seen[0]
    assert headers["authorization"] == f"Bearer {SECRET}"
    assert headers["x-org"] == "lab"
    assert body == {
        "model": "stub-model",
        "messages": [{"role": "user", "content": "What is 3 + 4?"}],
        "temperature": 0.3,
        "top_p": 0.9,
        "max_tokens": 64,
        "stop": ["END"],
        "seed": 7,
        "tools": [wire(ADD), wire(SEARCH)],
    }
    assert reply.message.tool_calls is not None
    assert reply.message.tool_calls[0].function.arguments == '{"a": 1, "b": 2}'
    assert reply.usage.total_tokens == 25
    assert reply.logprobs == [-0.5]


@pytest.mark.slow
async def test_openai_sends_extensions_only_when_asked(stub: tuple[StubLLM, str]) -> None:
    """rollout_id and logprobs go out with forward_extensions=True, and tools only if declared."""
    llm, url = stub
    async with backend(url, forward_extensions=True, api_key=None) as llm_backend:
        await llm_backend.complete(chat("r-9"), RolloutRecord("r-9"))
    headers, body = llm.seen[0]
    assert body["rollout_id"] == "r-9"
    assert body["logprobs"] is True
    assert "tools" not in body
    assert "authorization" not in headers


@pytest.mark.slow
@pytest.mark.parametrize("status", [401, 403])
async def test_openai_auth_failure_is_systemic_and_keeps_the_key_secret(
    stub: tuple[StubLLM, str], status: int
) -> None:
    """401/403 fail at once as a systemic `auth` error whose text never holds the key."""
    llm, url = stub
    echo = {"error": {"message": f"Incorrect API key provided: {SECRET}"}}
    llm.script = [(status, echo, {})]
    async with backend(url) as llm_backend:
        with pytest.raises(LLMBackendError) as info:
            await llm_backend.complete(chat(), RolloutRecord("r-1"))
        assert SECRET not in repr(llm_backend)
    error = info.value
    assert (error.kind, error.systemic, error.status_code) == ("auth", True, status)
    assert "OPENAI_API_KEY" in str(error)
    assert SECRET not in str(error)
    assert SECRET not in repr(error)
    assert len(llm.seen) == 1


@pytest.mark.slow
@pytest.mark.parametrize(
    ("status", "headers", "delay"),
    [(429, {"Retry-After": "3"}, 3.0), (503, {}, None)],
    ids=["429", "503"],
)
async def test_openai_retries_then_succeeds(
    stub: tuple[StubLLM, str], status: int, headers: dict[str, str], delay: float | None
) -> None:
    """429 (honouring Retry-After) and 5xx are retried with backoff, then the 200 is used."""
    llm, url = stub
    llm.script = [(status, {"error": {"message": "busy"}}, headers)]
    sleeps = Sleeps()
    async with backend(url, sleeps=sleeps) as llm_backend:
        reply = await llm_backend.complete(chat(), RolloutRecord("r-1"))
    assert reply.usage.total_tokens == 25
    assert len(llm.seen) == 2
    assert len(sleeps.delays) == 1
    if delay is not None:
        assert sleeps.delays == [delay]
    else:
        assert 0.25 <= sleeps.delays[0] <= 0.5


@pytest.mark.slow
async def test_openai_rate_limit_after_every_retry(stub: tuple[StubLLM, str]) -> None:
    """A server that keeps answering 429 ends in a non-systemic `rate_limit` error."""
    llm, url = stub
    llm.script = [(429, {"error": {"message": "slow down"}}, {})] * 3
    async with backend(url) as llm_backend:
        with pytest.raises(LLMBackendError, match="rate limited") as info:
            await llm_backend.complete(chat(), RolloutRecord("r-1"))
    assert (info.value.kind, info.value.systemic) == ("rate_limit", False)
    assert len(llm.seen) == 3


@pytest.mark.slow
async def test_openai_context_length_error(stub: tuple[StubLLM, str]) -> None:
    """A 400 about the context length maps to `context_length`, is not retried, is scrubbed."""
    llm, url = stub
    message = (
        "This model's maximum context length is 4096 tokens. However, you requested 5000 "
        f"tokens (key {SECRET})."
    )
    llm.script = [(400, {"error": {"message": message, "code": "context_length_exceeded"}}, {})]
    async with backend(url) as llm_backend:
        with pytest.raises(LLMBackendError, match="context window") as info:
            await llm_backend.complete(chat(), RolloutRecord("r-1"))
    error = info.value
    assert (error.kind, error.systemic, error.status_code) == ("context_length", False, 400)
    assert "maximum context length is 4096" in str(error)
    assert SECRET not in str(error)
    assert len(llm.seen) == 1


@pytest.mark.slow
@pytest.mark.parametrize(
    ("status", "body", "kind", "systemic"),
    [
        (404, {"error": {"message": "The model `nope` does not exist"}}, "not_found", True),
        (400, {"error": {"message": "temperature must be <= 2"}}, "http", False),
        (200, "<html>proxy error</html>", "bad_response", False),
        (200, {"choices": []}, "bad_response", False),
    ],
    ids=["404", "400", "not_json", "no_choices"],
)
async def test_openai_other_failures(
    stub: tuple[StubLLM, str], status: int, body: Any, kind: str, systemic: bool
) -> None:
    """Wrong URL/model, other 4xx and malformed replies each map to their own kind."""
    llm, url = stub
    llm.script = [(status, body, {})]
    async with backend(url) as llm_backend:
        with pytest.raises(LLMBackendError) as info:
            await llm_backend.complete(chat(), RolloutRecord("r-1"))
    assert (info.value.kind, info.value.systemic) == (kind, systemic)
    assert url in str(info.value)


@pytest.mark.slow
async def test_openai_fills_missing_usage(stub: tuple[StubLLM, str]) -> None:
    """A reply without usage (some local servers) gets an estimate instead of failing."""
    llm, url = stub
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "7"}}]}
    llm.script = [(200, body, {})]
    async with backend(url) as llm_backend:
        reply = await llm_backend.complete(chat(), RolloutRecord("r-1"))
    assert reply.message.content == "7"
    assert reply.usage.prompt_tokens > 0
    assert reply.usage.completion_tokens > 0


async def test_openai_connection_refused_is_unreachable() -> None:
    """Nothing listening: after the retries, a systemic `unreachable` error without the key."""
    with socket.socket() as sock:  # bound but not listening: connections are refused
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        sleeps = Sleeps()
        async with backend(url, sleeps=sleeps) as llm_backend:
            with pytest.raises(LLMBackendError, match="cannot connect") as info:
                await llm_backend.complete(chat(), RolloutRecord("r-1"))
    assert (info.value.kind, info.value.systemic) == ("unreachable", True)
    assert url.removesuffix("/v1") in str(info.value)
    assert SECRET not in str(info.value)
    assert len(sleeps.delays) == 2


async def test_openai_timeout_is_not_systemic() -> None:
    """A read timeout is reported as `timeout` and does not stop a batch."""

    def hang(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ReadTimeout("timed out", request=request)

    http = httpx2.AsyncClient(transport=httpx2.MockTransport(hang))
    async with http, backend("http://llm.test/v1", http=http, timeout_s=5) as llm_backend:
        with pytest.raises(LLMBackendError, match="within 5 s") as info:
            await llm_backend.complete(chat(), RolloutRecord("r-1"))
    assert (info.value.kind, info.value.systemic) == ("timeout", False)


def test_from_env_reads_openai_variables() -> None:
    """OPENAI_BASE_URL and OPENAI_API_KEY are read from the given mapping; flags win."""
    environ = {"OPENAI_BASE_URL": "http://localhost:8000/v1/", "OPENAI_API_KEY": SECRET}
    from_env = OpenAICompatibleBackend.from_env(environ, model="m")
    assert from_env.url == "http://localhost:8000/v1/chat/completions"
    assert SECRET not in repr(from_env)
    flagged = OpenAICompatibleBackend.from_env(environ, base_url="http://127.0.0.1:9/v1", model="m")
    assert flagged.base_url == "http://127.0.0.1:9/v1"
    default = OpenAICompatibleBackend.from_env({"OPENAI_API_KEY": SECRET}, model="gpt-4o-mini")
    assert default.url == "https://api.openai.com/v1/chat/completions"


def test_openai_itself_without_a_key_fails_at_once() -> None:
    """No URL and no key would only earn a 401 from api.openai.com: say so before any call."""
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        OpenAICompatibleBackend.from_env({}, model="gpt-4o-mini")


@pytest.mark.parametrize(
    ("base_url", "model", "message"),
    [(None, None, "pass --model"), ("localhost:8000", "m", "must be an http")],
)
def test_from_env_rejects_bad_configuration(
    base_url: str | None, model: str | None, message: str
) -> None:
    """A missing model or a URL without a scheme is a ConfigError that says what to pass."""
    with pytest.raises(ConfigError, match=message):
        OpenAICompatibleBackend.from_env({}, base_url=base_url, model=model)
