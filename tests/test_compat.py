"""The original SDK's public API, written the way a v1 agent project's code reads.

Each test is v1 user code with only ``osmosis_ai.rollout`` changed to
``osmosis_rollout.compat``; the behaviour asserted is v1's (docs/migrating-from-v1.md lists the
few kept differences).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any, ClassVar

import pydantic
import pytest

from osmosis_rollout.client import RetryPolicy, TrainGateClient
from osmosis_rollout.compat import (
    DEFAULT_MAX_METADATA_SIZE_BYTES,
    AgentLoopNotFoundError,
    AgentLoopRegistry,
    CompletionsResult,
    LLMClientProtocol,
    OpenAIFunctionCallSchema,
    OpenAIFunctionParametersSchema,
    OpenAIFunctionParsedSchema,
    OpenAIFunctionPropertySchema,
    OpenAIFunctionSchema,
    OpenAIFunctionToolCall,
    OpenAIFunctionToolSchema,
    OsmosisRolloutError,
    OsmosisServerError,
    OsmosisTimeoutError,
    OsmosisTransportError,
    OsmosisValidationError,
    RolloutAgentLoop,
    RolloutContext,
    RolloutMetrics,
    RolloutRequest,
    RolloutResult,
    RolloutStatus,
    ToolArgumentError,
    ToolExecutionError,
    ToolResponse,
    count_messages_by_role,
    create_tool_error_result,
    create_tool_result,
    execute_tool_calls,
    get_agent_loop,
    get_max_metadata_size_bytes,
    get_message_content,
    get_message_role,
    get_tool_call_info,
    is_assistant_message,
    is_tool_message,
    is_user_message,
    list_agent_loops,
    normalize_stop,
    parse_tool_arguments,
    parse_tool_calls,
    register_agent_loop,
    serialize_tool_result,
    set_max_metadata_size_bytes,
    unregister_agent_loop,
)
from osmosis_rollout.testing import MockTrainGate

pytestmark = pytest.mark.anyio


def make_request(**overrides: Any) -> RolloutRequest:
    fields: dict[str, Any] = {
        "rollout_id": "r-1",
        "server_url": "http://localhost:8080",
        "messages": [{"role": "user", "content": "Hi"}],
        "completion_params": {},
    }
    fields.update(overrides)
    return RolloutRequest(**fields)


class EchoAgent(RolloutAgentLoop):
    name = "echo"

    def get_tools(self, request: RolloutRequest) -> list[OpenAIFunctionToolSchema]:
        return []

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        return ctx.complete(list(ctx.request.messages))


class FakeLLM:
    """A fake LLM client as v1 agents' unit tests write it (v1's LLMClientProtocol)."""

    def __init__(self, replies: list[dict[str, Any]]) -> None:
        self.replies = list(replies)
        self.calls: list[tuple[list[dict[str, Any]], dict[str, Any]]] = []

    async def chat_completions(self, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
        self.calls.append((list(messages), kwargs))
        return CompletionsResult(
            message=self.replies.pop(0),
            token_ids=[1, 2],
            logprobs=[-0.1, -0.2],
            usage={"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
            finish_reason="stop",
        )

    def get_metrics(self) -> RolloutMetrics:
        return RolloutMetrics(llm_latency_ms=12.0, num_llm_calls=len(self.calls), prompt_tokens=5)


# -- RolloutResult, RolloutContext ---------------------------------------------------------------


def test_rollout_result_positional_order_is_v1s() -> None:
    metrics = RolloutMetrics(num_llm_calls=2)
    result = RolloutResult(
        "COMPLETED", [{"role": "user", "content": "x"}], "stop", None, metrics, 0.5
    )
    assert result.status == RolloutStatus.COMPLETED
    assert result.finish_reason == "stop"
    assert result.error_message is None
    assert result.metrics is metrics
    assert result.reward == 0.5


async def test_ctx_complete_and_error_take_v1_keywords() -> None:
    ctx = RolloutContext(request=make_request(), tools=[], llm=FakeLLM([]))
    done = ctx.complete(
        final_messages=[{"role": "user", "content": "Hi"}], finish_reason="max_turns", reward=1.0
    )
    assert (done.status, done.finish_reason, done.reward) == ("COMPLETED", "max_turns", 1.0)
    assert isinstance(done.metrics, RolloutMetrics)

    failed = ctx.error(
        error_message="tool crashed", final_messages=[{"role": "user", "content": "Hi"}]
    )
    assert (failed.status, failed.finish_reason, failed.error_message) == (
        "ERROR",
        "error",
        "tool crashed",
    )
    assert failed.reward is None
    assert failed.final_messages == [{"role": "user", "content": "Hi"}]


async def test_ctx_error_without_messages_keeps_the_conversation_so_far() -> None:
    """Kept fix: v1 sent [] here; the partial conversation is training data."""
    llm = FakeLLM([{"role": "assistant", "content": "hello"}])
    ctx = RolloutContext(request=make_request(), tools=[], llm=llm)
    messages = list(ctx.request.messages)
    messages.append((await ctx.chat(messages)).message)
    failed = ctx.error("gave up")
    assert failed.final_messages == messages


async def test_fake_llm_client_drives_ctx_chat_and_metrics() -> None:
    """v1 unit tests give the context a fake client; ctx.chat calls it and returns its result."""
    llm = FakeLLM([{"role": "assistant", "content": "Hello!"}])
    assert isinstance(llm, LLMClientProtocol)
    request = make_request(completion_params={"temperature": 0.3})
    ctx = RolloutContext(request=request, tools=[], llm=llm, _start_time=time.monotonic() - 1.0)
    assert ctx.llm is llm

    result = await ctx.chat(list(request.messages), max_tokens=64)
    assert result.message == {"role": "assistant", "content": "Hello!"}
    assert result.has_tool_calls is False
    # Kept fix: completion_params are applied; explicit keywords win.
    assert llm.calls == [
        ([{"role": "user", "content": "Hi"}], {"temperature": 0.3, "max_tokens": 64})
    ]

    ctx.record_tool_call(latency_ms=4.0)
    metrics = ctx.complete(list(request.messages)).metrics
    assert metrics is not None
    assert metrics.llm_latency_ms == 12.0  # from llm.get_metrics(), as in v1
    assert metrics.num_llm_calls == 1
    assert metrics.prompt_tokens == 5
    assert (metrics.num_tool_calls, metrics.tool_latency_ms) == (1, 4.0)
    assert metrics.total_latency_ms >= 1000.0


async def test_ctx_llm_offers_v1s_client_contract_over_our_backend(
    mock_client: tuple[MockTrainGate, TrainGateClient],
) -> None:
    """A served agent calling ``ctx.llm.chat_completions(...)`` gets one measured turn."""
    from osmosis_rollout.testing import ScriptedBackend

    gate, client = mock_client
    gate.backend = ScriptedBackend([{"content": "4"}])
    request = make_request(server_url=gate.base_url)
    gate.expect(request.rollout_id)
    ctx = RolloutContext(request, [], client.channel(request))

    result = await ctx.llm.chat_completions(list(request.messages), temperature=0.0)
    assert result.content == "4"
    metrics = ctx.llm.get_metrics()
    assert isinstance(metrics, RolloutMetrics)
    assert metrics.num_llm_calls == 1
    assert ctx.metrics.num_llm_calls == 1


def test_log_event_writes_v1s_jsonl_when_a_debug_dir_is_given(tmp_path: Path) -> None:
    request = make_request(rollout_id="rollout-abc123")
    ctx = RolloutContext(request=request, tools=[], llm=FakeLLM([]), _debug_dir=str(tmp_path))
    assert ctx.debug_enabled is True
    ctx.log_event("pre_llm", turn=0, num_messages=1)
    ctx.log_event(event_type="custom", when=Path("x"))
    lines = (tmp_path / "rollout-abc123.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines]
    assert events[0]["event"] == "pre_llm"
    assert events[0]["rollout_id"] == "rollout-abc123"
    assert (events[0]["turn"], events[0]["num_messages"]) == (0, 1)
    assert events[1]["when"] == "x"  # serialised with default=str

    quiet = RolloutContext(request=request, tools=[], llm=FakeLLM([]))
    assert quiet.debug_enabled is False
    quiet.log_event("ignored")  # a no-op without a debug directory


def test_log_event_to_an_unwritable_directory_only_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    ctx = RolloutContext(
        request=make_request(), tools=[], llm=FakeLLM([]), _debug_dir=blocker / "x"
    )
    ctx.log_event("pre_llm")
    assert "could not write debug event" in caplog.text


# -- the agent base class ------------------------------------------------------------------------


def test_agent_can_also_be_a_pydantic_model() -> None:
    class ConfiguredAgent(RolloutAgentLoop, pydantic.BaseModel):
        name: ClassVar[str] = "configured"
        max_turns: int = 3

        def get_tools(self, request: RolloutRequest) -> list[OpenAIFunctionToolSchema]:
            return []

        async def run(self, ctx: RolloutContext) -> RolloutResult:
            return ctx.complete(list(ctx.request.messages))

    agent = ConfiguredAgent(max_turns=5)
    assert agent.max_turns == 5
    assert agent.name == "configured"
    with pytest.raises(pydantic.ValidationError):
        ConfiguredAgent(max_turns="many")


def test_a_concrete_agent_without_a_name_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="must define a 'name' class attribute"):

        class Nameless(RolloutAgentLoop):
            def get_tools(self, request: RolloutRequest) -> list[OpenAIFunctionToolSchema]:
                return []

            async def run(self, ctx: RolloutContext) -> RolloutResult:
                raise NotImplementedError


def test_an_agent_missing_run_cannot_be_instantiated() -> None:
    class Half(RolloutAgentLoop):
        name = "half"

        def get_tools(self, request: RolloutRequest) -> list[OpenAIFunctionToolSchema]:
            return []

    with pytest.raises(TypeError, match="abstract"):
        Half()  # type: ignore[abstract]


# -- typed tool schemas --------------------------------------------------------------------------


def calculator_tool() -> OpenAIFunctionToolSchema:
    return OpenAIFunctionToolSchema(
        type="function",
        function=OpenAIFunctionSchema(
            name="calculate",
            description="Perform arithmetic calculation",
            parameters=OpenAIFunctionParametersSchema(
                properties={
                    "operation": OpenAIFunctionPropertySchema(
                        type="string",
                        description="The operation to perform",
                        enum=["add", "subtract", "multiply", "divide"],
                    ),
                    "a": OpenAIFunctionPropertySchema(type="number", description="First operand"),
                    "b": OpenAIFunctionPropertySchema(type="number"),
                },
                required=["operation", "a", "b"],
            ),
        ),
    )


def test_typed_tool_classes_build_the_json_schema_tools_are_sent_with() -> None:
    tool = calculator_tool()
    assert tool.model_dump(exclude_none=True) == {
        "type": "function",
        "function": {
            "name": "calculate",
            "description": "Perform arithmetic calculation",
            "parameters": {
                "type": "object",
                "properties": {
                    "operation": {
                        "type": "string",
                        "description": "The operation to perform",
                        "enum": ["add", "subtract", "multiply", "divide"],
                    },
                    "a": {"type": "number", "description": "First operand"},
                    "b": {"type": "number"},
                },
                "required": ["operation", "a", "b"],
            },
        },
    }


def test_typed_tool_classes_validate_what_v1_validated() -> None:
    with pytest.raises(pydantic.ValidationError):
        OpenAIFunctionPropertySchema(description="no type")  # type: ignore[call-arg]
    with pytest.raises(pydantic.ValidationError):
        OpenAIFunctionParametersSchema(properties={})  # type: ignore[call-arg]
    # Dict tools keep full JSON Schema (kept fix: v1 dropped nested keywords).
    nested = {
        "type": "object",
        "properties": {"xs": {"type": "array", "items": {"type": "integer"}}},
    }
    assert OpenAIFunctionSchema(name="f", parameters=nested).parameters == nested


def test_parsed_tool_calls_decode_their_arguments() -> None:
    call, failed = OpenAIFunctionCallSchema.from_openai_function_parsed_schema(
        OpenAIFunctionParsedSchema(name="add", arguments='{"a": 1}')
    )
    assert (call.arguments, failed) == ({"a": 1}, False)
    for bad in ("{not json", "[1, 2]"):
        call, failed = OpenAIFunctionCallSchema.from_openai_function_parsed_schema(
            OpenAIFunctionParsedSchema(name="add", arguments=bad)
        )
        assert (call.name, call.arguments, failed) == ("add", {}, True)
    tool_call = OpenAIFunctionToolCall(id="c1", function=call)
    assert tool_call.type == "function"


def test_tool_response_wants_lists_for_media() -> None:
    assert ToolResponse(text="hi").is_text_only()
    assert ToolResponse().is_empty()
    assert not ToolResponse(text="hi", image=["a.png"]).is_text_only()
    with pytest.raises(pydantic.ValidationError, match=r"wrap a single item"):
        ToolResponse(image="a.png")  # type: ignore[arg-type]


def test_completions_result_is_frozen_with_v1s_positional_order() -> None:
    result = CompletionsResult({"role": "assistant", "content": "x"}, [1], [-0.5], {}, "stop")
    assert (result.token_ids, result.logprobs, result.finish_reason) == ([1], [-0.5], "stop")
    assert result.content == "x"
    assert result.tool_calls == []
    with pytest.raises(AttributeError):
        result.message = {}  # type: ignore[misc]


def test_metadata_size_limit_is_a_process_wide_setting() -> None:
    assert DEFAULT_MAX_METADATA_SIZE_BYTES == 1048576
    assert get_max_metadata_size_bytes() == DEFAULT_MAX_METADATA_SIZE_BYTES
    try:
        set_max_metadata_size_bytes(64)
        with pytest.raises(pydantic.ValidationError, match="limit is 64"):
            make_request(metadata={"blob": "x" * 100})
        with pytest.raises(ValueError, match="must be positive"):
            set_max_metadata_size_bytes(0)
    finally:
        set_max_metadata_size_bytes(DEFAULT_MAX_METADATA_SIZE_BYTES)
    assert make_request(metadata={"blob": "x" * 100}).metadata["blob"]


# -- exceptions ----------------------------------------------------------------------------------


def test_v1_exceptions_keep_their_constructors() -> None:
    server = OsmosisServerError("boom", 502)
    assert (str(server), server.status_code) == ("boom", 502)
    assert OsmosisValidationError("bad", 422).status_code == 422
    missing = AgentLoopNotFoundError("calc", ["echo"])
    assert str(missing) == "Agent loop 'calc' not found. Available: ['echo']"
    assert (missing.name, missing.available) == ("calc", ["echo"])
    tool = ToolExecutionError("failed", tool_call_id="c1", tool_name="add")
    assert (tool.tool_call_id, tool.tool_name) == ("c1", "add")
    assert issubclass(ToolArgumentError, ToolExecutionError)
    for cls in (OsmosisTransportError, OsmosisTimeoutError, ToolExecutionError):
        assert issubclass(cls, OsmosisRolloutError)


@pytest.mark.parametrize(
    ("status", "v1_class"), [(503, OsmosisServerError), (400, OsmosisValidationError)]
)
async def test_traingate_http_errors_are_catchable_by_v1_names(
    mock_client: tuple[MockTrainGate, TrainGateClient], status: int, v1_class: type[Exception]
) -> None:
    """An agent's ``except OsmosisServerError`` around ``ctx.chat`` still catches."""
    import httpx2
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    async def fail(request: Any) -> PlainTextResponse:
        return PlainTextResponse("nope", status_code=status)

    app = Starlette(routes=[Route("/v1/chat/completions", fail, methods=["POST"])])
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app)) as http:
        client = TrainGateClient(http, retry=RetryPolicy(retries=0))
        request = make_request(server_url="http://traingate.test")
        ctx = RolloutContext(request, [], client.channel(request))
        with pytest.raises(v1_class) as caught:
            await ctx.chat(list(request.messages))
    assert caught.value.status_code == status  # type: ignore[attr-defined]
    assert isinstance(caught.value, OsmosisRolloutError)


async def test_unreachable_traingate_is_an_osmosis_transport_error() -> None:
    import httpx2

    async def refuse(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ConnectError("refused")

    async def timeout(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ReadTimeout("slow")

    for handler, v1_class in ((refuse, OsmosisTransportError), (timeout, OsmosisTimeoutError)):
        async with httpx2.AsyncClient(transport=httpx2.MockTransport(handler)) as http:
            client = TrainGateClient(http, retry=RetryPolicy(retries=0))
            request = make_request()
            ctx = RolloutContext(request, [], client.channel(request))
            with pytest.raises(v1_class):
                await ctx.chat(list(request.messages))


# -- registry --------------------------------------------------------------------------------------


def test_the_registry_finds_agents_by_name() -> None:
    agent = EchoAgent()
    register_agent_loop(agent)
    try:
        assert "echo" in list_agent_loops()
        assert get_agent_loop("echo") is agent
        with pytest.raises(ValueError, match="already registered"):
            register_agent_loop(EchoAgent())
    finally:
        assert unregister_agent_loop("echo") is True
    assert unregister_agent_loop("echo") is False
    with pytest.raises(AgentLoopNotFoundError, match="Agent loop 'echo' not found"):
        get_agent_loop("echo")
    local = AgentLoopRegistry()
    local.register(agent)
    assert (local.get("echo"), local.get("nope"), local.list_names()) == (agent, None, ["echo"])
    local.clear()
    assert local.list_names() == []


# -- tool and message helpers (v1's "Tool Utilities" and "Message Utilities" examples) ------------


async def test_tool_utilities_example() -> None:
    result_msg = create_tool_result("call_123", "42")
    assert result_msg == {"role": "tool", "content": "42", "tool_call_id": "call_123"}

    assert serialize_tool_result(42) == "42"
    assert serialize_tool_result(3.14) == "3.14"
    assert serialize_tool_result({"a": 1}) == '{"a": 1}'
    assert serialize_tool_result(True) == "true"
    assert serialize_tool_result(None) == "null"
    assert serialize_tool_result([1, 2, 3]) == "[1, 2, 3]"

    assert parse_tool_arguments('{"a": 5, "b": 3}') == {"a": 5, "b": 3}
    assert parse_tool_arguments({"a": 5, "b": 3}) == {"a": 5, "b": 3}

    tool_call = {
        "id": "call_123",
        "type": "function",
        "function": {"name": "add", "arguments": '{"a": 5, "b": 3}'},
    }
    call_id, name, args = get_tool_call_info(tool_call)
    assert (call_id, name, args) == ("call_123", "add", {"a": 5, "b": 3})

    async def add(a: int, b: int) -> int:
        await asyncio.sleep(0)
        return a + b

    my_tools = {"add": add}

    async def my_executor(tool_call: dict[str, Any]) -> dict[str, Any]:
        call_id, name, args = get_tool_call_info(tool_call)
        try:
            result = await my_tools[name](**args)
            return create_tool_result(call_id, serialize_tool_result(result))
        except Exception as e:
            return create_tool_error_result(call_id, str(e))

    tool_calls = [
        tool_call,
        {**tool_call, "id": "call_124", "function": {"name": "add", "arguments": "{}"}},
    ]
    messages: list[dict[str, Any]] = []
    results = await execute_tool_calls(tool_calls, my_executor)
    messages.extend(results)
    assert messages[0] == {"role": "tool", "content": "8", "tool_call_id": "call_123"}
    assert messages[1]["tool_call_id"] == "call_124"
    assert messages[1]["content"].startswith("Error: ")
    assert await execute_tool_calls([], my_executor) == []


def test_bad_tool_arguments_raise_tool_argument_error() -> None:
    with pytest.raises(ToolArgumentError, match="Invalid JSON arguments"):
        parse_tool_arguments("{oops")
    with pytest.raises(ToolArgumentError, match="Expected dict from JSON, got list"):
        parse_tool_arguments("[1]")
    with pytest.raises(ToolArgumentError, match="Expected str or dict arguments, got int"):
        parse_tool_arguments(7)
    with pytest.raises(ToolArgumentError) as caught:
        get_tool_call_info({"id": "c9", "function": {"name": "add", "arguments": "{oops"}})
    assert (caught.value.tool_call_id, caught.value.tool_name) == ("c9", "add")


def test_message_utilities_example() -> None:
    assistant_message = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]}
    assert parse_tool_calls(assistant_message) == [{"id": "c1"}]
    assert parse_tool_calls({"role": "assistant", "tool_calls": None}) == []
    assert normalize_stop(None) is None
    assert normalize_stop("</s>") == ["</s>"]
    assert normalize_stop(["a", 1]) == ["a", "1"]
    assert normalize_stop(3) is None
    assert get_message_content(assistant_message) == ""
    assert get_message_role({}) == "unknown"
    assert is_assistant_message(assistant_message)
    assert is_tool_message({"role": "tool"})
    assert is_user_message({"role": "user"})
    messages = [{"role": "user"}, {"role": "assistant"}, {"role": "user"}, {"content": "x"}]
    assert count_messages_by_role(messages) == {"user": 2, "assistant": 1, "unknown": 1}


def test_the_request_api_key_compares_with_a_plain_string_but_never_prints() -> None:
    request = make_request(api_key="sk-rollout-123")
    assert request.api_key == "sk-rollout-123"
    assert request.api_key != "something-else"
    assert "sk-rollout-123" not in repr(request)
    assert "sk-rollout-123" not in str(request.model_dump())
    assert request.api_key is not None
    assert request.api_key.get_secret_value() == "sk-rollout-123"


def test_tool_counters_and_build_metrics_keep_v1s_private_names() -> None:
    """v1 tests read and set ``ctx._num_tool_calls`` / ``ctx._tool_latency_ms`` directly."""
    ctx = RolloutContext(request=make_request(), tools=[], llm=FakeLLM([]), _start_time=0)
    assert (ctx._num_tool_calls, ctx._tool_latency_ms) == (0, 0.0)
    ctx.record_tool_call(latency_ms=100.0)
    ctx.record_tool_call(latency_ms=50.0)
    assert (ctx._num_tool_calls, ctx._tool_latency_ms) == (2, 150.0)
    ctx._tool_latency_ms = 200.0
    ctx._num_tool_calls = 3
    metrics = ctx._build_metrics()
    assert (metrics.tool_latency_ms, metrics.num_tool_calls) == (200.0, 3)
    assert metrics.total_latency_ms == 0  # _start_time=0: not measured, as in v1
    assert (metrics.llm_latency_ms, metrics.prompt_tokens) == (12.0, 5)  # llm.get_metrics()


def test_typed_parameters_still_read_as_attributes() -> None:
    """v1 code reads ``tool.function.parameters.properties[...].enum``; dict access works too."""
    parameters = calculator_tool().function.parameters
    assert "operation" in parameters.properties
    assert parameters.properties["operation"].enum == ["add", "subtract", "multiply", "divide"]
    assert parameters["required"] == ["operation", "a", "b"]
    assert parameters.required == ["operation", "a", "b"]
    with pytest.raises(AttributeError):
        parameters.no_such_keyword  # noqa: B018


def test_a_v1_contexts_tools_read_as_attributes_too() -> None:
    """The tools a v1 context holds are v1's models (copies), whatever the server checked."""
    from osmosis_rollout import protocol

    checked = protocol.OpenAIFunctionToolSchema.model_validate(calculator_tool().model_dump())
    ctx = RolloutContext(request=make_request(), tools=[checked], llm=FakeLLM([]))
    parameters = ctx.tools[0].function.parameters
    assert parameters.properties["operation"].enum == ["add", "subtract", "multiply", "divide"]
    assert isinstance(ctx.tools[0], protocol.OpenAIFunctionToolSchema)
    assert ctx.tools[0] is not checked


def test_request_validation_messages_read_as_v1s() -> None:
    base: dict[str, Any] = {"server_url": "http://localhost:8080", "messages": []}
    with pytest.raises(pydantic.ValidationError, match="cannot be empty or whitespace"):
        RolloutRequest(rollout_id="   ", completion_params={}, **base)
    assert len(RolloutRequest(rollout_id="a" * 256, completion_params={}, **base).rollout_id) == 256
    with pytest.raises(pydantic.ValidationError, match="string_too_long"):
        RolloutRequest(rollout_id="a" * 257, completion_params={}, **base)
    with pytest.raises(pydantic.ValidationError, match="exceeds maximum"):
        RolloutRequest(
            rollout_id="r", completion_params={}, metadata={"data": "x" * (1 << 20)}, **base
        )
    from osmosis_rollout.compat import CompletionsRequest

    with pytest.raises(pydantic.ValidationError, match="cannot be empty or whitespace"):
        CompletionsRequest(rollout_id="   ", messages=[])


async def test_a_streamed_turn_is_counted_and_a_cut_reply_is_seen() -> None:
    """A turn through a streaming v1 client is a turn like ``ctx.chat``'s: counted, its reply
    kept, and its ``finish_reason`` read, so a reply cut by max_tokens ends as "length"."""

    class CutStream(FakeLLM):
        async def chat_completions_stream(self, messages: list[Any], **kwargs: Any) -> Any:
            return CompletionsResult(
                message={"role": "assistant", "content": "The answer is"}, finish_reason="length"
            )

    ctx = RolloutContext(request=make_request(), tools=[], llm=CutStream([]))
    messages = list(ctx.request.messages)
    messages.append((await ctx.chat_stream(messages)).message)
    assert ctx.turns == 1
    assert ctx.finish_reasons == ["length"]
    assert ctx.partial_messages == messages
    assert ctx.complete(messages).finish_reason == "length"


async def test_chat_stream_prefers_a_streaming_client_and_falls_back_to_chat() -> None:
    class Streaming(FakeLLM):
        def __init__(self) -> None:
            super().__init__([{"role": "assistant", "content": "unused"}])
            self.streamed = 0

        async def chat_completions_stream(self, messages: list[Any], **kwargs: Any) -> str:
            self.streamed += 1
            return "streamed"

    streaming = Streaming()
    ctx = RolloutContext(request=make_request(), tools=[], llm=streaming)
    assert await ctx.chat_stream(messages=[{"role": "user", "content": "hi"}]) == "streamed"
    assert (streaming.streamed, streaming.calls) == (1, [])

    plain = FakeLLM([{"role": "assistant", "content": "ok"}])
    ctx = RolloutContext(request=make_request(), tools=[], llm=plain)
    result = await ctx.chat_stream([{"role": "user", "content": "hi"}], temperature=0.5)
    assert result.content == "ok"
    assert len(plain.calls) == 1
