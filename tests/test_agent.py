"""The agent API: class checks, ``ctx.chat`` parameters, the append-only guard, resolve_tools
(and its cache of checked tool lists)."""

from __future__ import annotations

import json
import logging
from abc import abstractmethod
from pathlib import Path
from typing import Any

import pytest

from osmosis_rollout.agent import RolloutAgentLoop, RolloutContext
from osmosis_rollout.client import TrainGateClient
from osmosis_rollout.errors import AgentDefinitionError
from osmosis_rollout.protocol import (
    OpenAIFunctionSchema,
    OpenAIFunctionToolSchema,
    RolloutRequest,
    RolloutStatus,
)
from osmosis_rollout.results import RolloutResult
from osmosis_rollout.rollout import run_rollout
from osmosis_rollout.testing import MockTrainGate
from osmosis_rollout.tools.tool_set import resolve_tool_set, resolve_tools
from osmosis_rollout.tracing import Tracer

from .gates import ANSWER
from .serving import init_body, serving
from .support import load_asset

pytestmark = pytest.mark.anyio


def make_request(rollout_id: str = "r-1", **overrides: Any) -> RolloutRequest:
    """A valid request aimed at the MockTrainGate's base URL."""
    data: dict[str, Any] = {
        "rollout_id": rollout_id,
        "server_url": "http://traingate.test",
        "messages": [{"role": "user", "content": "What is 3 + 4?"}],
        "completion_params": {"temperature": 0.7, "max_tokens": 128},
        "api_key": "tg-secret-key",
    }
    data.update(overrides)
    return RolloutRequest.model_validate(data)


def tool(name: str) -> dict[str, Any]:
    """An OpenAI function tool dict with a one-number schema."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name} tool",
            "parameters": {"type": "object", "properties": {"x": {"type": "number"}}},
        },
    }


# -- the class-level contract -------------------------------------------------------------------


def test_concrete_agent_without_name_is_a_type_error() -> None:
    """Forgetting ``name`` fails when the class is created, with a fix in the message."""
    with pytest.raises(TypeError) as exc:

        class Nameless(RolloutAgentLoop):
            def get_tools(self, request: RolloutRequest) -> list[Any]:
                return []

            async def run(self, ctx: RolloutContext) -> RolloutResult:
                return ctx.complete([])

    message = str(exc.value)
    assert "Nameless" in message
    assert "`name`" in message
    assert 'name = "nameless"' in message


@pytest.mark.parametrize("bad", ["", "   ", 123, None, b"bytes", ["a"]])
def test_concrete_agent_with_blank_or_non_str_name_is_a_type_error(bad: object) -> None:
    """``name`` must be a non-empty, non-blank str."""
    with pytest.raises(TypeError, match="non-empty string"):
        type(
            "BadName",
            (RolloutAgentLoop,),
            {
                "name": bad,
                "get_tools": lambda self, request: [],
                "run": lambda self, ctx: None,
            },
        )


def test_abstract_intermediate_without_name_is_allowed() -> None:
    """A base class that is still abstract needs no name; its concrete children do."""

    class Base(RolloutAgentLoop):
        def get_tools(self, request: RolloutRequest) -> list[Any]:
            return []

        @abstractmethod
        def system_prompt(self) -> str:
            """What subclasses provide."""

        async def run(self, ctx: RolloutContext) -> RolloutResult:
            return ctx.complete([{"role": "system", "content": self.system_prompt()}])

    class Named(Base):
        name = "named"

        def system_prompt(self) -> str:
            return "hi"

    class Inherits(Named):
        """Takes its parent's name."""

    assert Inherits.name == "named"
    with pytest.raises(TypeError, match="Unnamed"):

        class Unnamed(Base):
            def system_prompt(self) -> str:
                return "hi"


def test_agent_missing_run_cannot_be_instantiated() -> None:
    """A subclass that forgets ``run`` stays abstract and cannot be instantiated."""

    class NoRun(RolloutAgentLoop):
        def get_tools(self, request: RolloutRequest) -> list[Any]:
            return []

    with pytest.raises(TypeError, match="run"):
        NoRun()  # type: ignore[abstract]


# -- ctx.chat parameters ------------------------------------------------------------------------


async def test_chat_merges_completion_params_with_per_call_overrides(
    mock_client: tuple[MockTrainGate, TrainGateClient],
) -> None:
    """completion_params are defaults; per-call keywords win; nothing else leaks into the body."""
    gate, client = mock_client
    params = {"temperature": 0.7, "max_tokens": 128, "top_p": 0.9, "stop": "</s>", "seed": 1}
    request = make_request(completion_params=params)
    record = gate.expect("r-1", api_key="tg-secret-key")
    ctx = RolloutContext(request, [], client.channel(request))

    await ctx.chat(request.messages, temperature=0.1, stop=["A", "B"], presence_penalty=0.5)

    (sent,) = record.chats
    assert sent.temperature == 0.1
    assert sent.stop == ["A", "B"]
    assert sent.max_tokens == 128
    assert sent.top_p == 0.9
    assert sent.model_extra == {"seed": 1, "presence_penalty": 0.5}
    assert sent.logprobs is True
    assert request.completion_params == params  # overrides do not leak into the next turn
    assert record.findings == []


async def test_chat_never_sends_tools_or_spoofed_fields(
    mock_client: tuple[MockTrainGate, TrainGateClient],
) -> None:
    """``tools``/``tool_choice`` from params or per call are dropped; rollout_id is the ctx's."""
    gate, client = mock_client
    request = make_request(
        completion_params={"temperature": 0.7, "tools": [tool("add")], "tool_choice": "auto"}
    )
    record = gate.expect("r-1", api_key="tg-secret-key")
    ctx = RolloutContext(request, [], client.channel(request))

    await ctx.chat(request.messages, tools=[tool("sub")], tool_choice="none", rollout_id="evil")

    (sent,) = record.chats
    assert sent.rollout_id == "r-1"
    assert sent.model_extra == {}
    assert record.findings == []


async def test_chat_returns_the_reply_and_counts_it(
    mock_client: tuple[MockTrainGate, TrainGateClient],
) -> None:
    """A turn returns the assistant message, usage and token extensions, and updates metrics."""
    gate, client = mock_client
    request = make_request()
    gate.expect("r-1", api_key="tg-secret-key")
    ctx = RolloutContext(request, [], client.channel(request))

    result = await ctx.chat(request.messages)

    assert result.message == {"role": "assistant", "content": "done"}
    assert result.content == "done"
    assert not result.has_tool_calls
    assert result.token_ids
    assert result.logprobs
    assert len(result.logprobs) == len(result.token_ids)
    assert ctx.turns == 1
    metrics = ctx.metrics
    assert metrics.num_llm_calls == 1
    assert metrics.prompt_tokens == result.usage["prompt_tokens"] > 0
    assert metrics.response_tokens == result.usage["completion_tokens"] > 0
    assert ctx.partial_messages == [*request.messages, result.message]


@pytest.mark.usefixtures("no_inherited_settings")
@pytest.mark.anyio
async def test_parallel_tool_calls_count_their_wall_time_not_their_sum() -> None:
    """Four 50 ms tools called at once: the rollout spent ~50 ms in tools, not 200."""
    import anyio

    from osmosis_rollout import RolloutAgentLoop
    from osmosis_rollout.evaluation.runner import tool_wall_ms
    from osmosis_rollout.testing import Harness, ScriptedBackend
    from osmosis_rollout.tools import Toolbox

    async def slow(x: int) -> int:
        """Wait 50 ms.

        Args:
            x: Echoed back.
        """
        await anyio.sleep(0.05)
        return x

    class Parallel(RolloutAgentLoop):
        name = "parallel"
        toolbox = Toolbox([slow])

        def get_tools(self, request: Any) -> list[Any]:
            return self.toolbox.schemas

        async def run(self, ctx: Any) -> Any:
            messages = list(ctx.request.messages)
            reply = await ctx.chat(messages)
            messages.append(reply.message)
            messages.extend(await self.toolbox.execute(ctx, reply.tool_calls))
            return ctx.complete(messages)

    calls = [
        {"id": f"c{i}", "type": "function", "function": {"name": "slow", "arguments": '{"x": 1}'}}
        for i in range(4)
    ]
    async with Harness(Parallel(), backend=ScriptedBackend([{"tool_calls": calls}])) as harness:
        outcome = await harness.run([{"role": "user", "content": "go"}])
    assert outcome.result is not None
    metrics = outcome.result.metrics
    assert metrics is not None
    assert metrics.num_tool_calls == 4
    assert metrics.tool_latency_ms >= 200  # the sum, kept for TrainGate as v1 sent it
    wall = tool_wall_ms(metrics)
    assert 50 <= wall <= metrics.total_latency_ms  # never more than the rollout's own time
    assert wall < metrics.tool_latency_ms


# -- the append-only guard ----------------------------------------------------------------------

REWRITERS = [
    "EditsEarlierMessageAgent",
    "DropsMessageAgent",
    "ForgetsReplyAgent",
    "MutatesInPlaceAgent",
    "MutatesReplyAgent",
]


@pytest.mark.parametrize("agent_name", ["AppendOnlyAgent", "RebuildsReplyAgent"])
async def test_append_only_agent_has_no_violation(
    mock_client: tuple[MockTrainGate, TrainGateClient],
    agent_name: str,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    """An agent that only appends (key order aside) completes with no violation anywhere."""
    gate, client = mock_client
    agent = getattr(load_asset("fnd_history"), agent_name)()
    request = make_request()
    gate.expect("r-1", api_key="tg-secret-key")
    tracer = Tracer(tmp_path)
    caplog.set_level(logging.WARNING, logger="osmosis_rollout")

    response = await run_rollout(agent, request, client.channel(request), tracer=tracer)
    tracer.close()

    assert response.status is RolloutStatus.COMPLETED
    assert response.metrics is not None
    assert response.metrics.num_llm_calls == 2
    assert "append_only_violations" not in response.metrics.model_dump()
    assert caplog.records == []
    assert "append_only_violation" not in tracer.path_for("r-1").read_text()
    assert gate.findings == []


@pytest.mark.parametrize("agent_name", REWRITERS)
async def test_history_rewrite_is_caught_with_its_index(
    mock_client: tuple[MockTrainGate, TrainGateClient],
    agent_name: str,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    """A rewrite is logged, counted in metrics and traced, naming the first differing index."""
    gate, client = mock_client
    agent = getattr(load_asset("fnd_history"), agent_name)()
    index = agent.expected_index
    request = make_request()
    gate.expect("r-1", api_key="tg-secret-key")
    tracer = Tracer(tmp_path)
    caplog.set_level(logging.WARNING, logger="osmosis_rollout")

    response = await run_rollout(agent, request, client.channel(request), tracer=tracer)
    tracer.close()

    # the rollout itself still completes: the guard reports, it does not raise
    assert response.status is RolloutStatus.COMPLETED
    assert response.metrics is not None
    assert response.metrics.model_dump()["append_only_violations"] == 1

    (log,) = caplog.records
    assert log.levelno == logging.WARNING
    assert log.name == "osmosis_rollout.agent"
    assert f"turn 2 rewrote the history at message {index}" in log.getMessage()
    assert "r-1" in log.getMessage()

    events = [json.loads(line) for line in tracer.path_for("r-1").read_text().splitlines()]
    violations = [e for e in events if e["event"] == "append_only_violation"]
    assert violations == [
        {
            "v": 2,
            "ts": violations[0]["ts"],
            "event": "append_only_violation",
            "rollout_id": "r-1",
            "turn": 2,
            "index": index,
        }
    ]
    end = next(e for e in events if e["event"] == "rollout_end")
    assert end["metrics"]["append_only_violations"] == 1

    # the mock TrainGate, which checks independently, agrees on the index
    (finding,) = gate.findings
    assert finding.code == "history_rewritten"
    assert f"at message {index}" in finding.message


class _Canned:
    """A ChatBackend that answers every turn with the same reply (no HTTP involved)."""

    async def chat_completions(self, request: Any, *, request_id: str) -> Any:
        from osmosis_rollout.testing import completion_from_message

        return completion_from_message(request, {"content": "ok"})


async def test_every_violation_is_counted_in_the_context() -> None:
    """Each offending turn adds one violation with its turn and index."""
    ctx = RolloutContext(make_request(), [], _Canned())
    history: list[dict[str, Any]] = [{"role": "user", "content": "a"}]
    reply = (await ctx.chat(history)).message
    await ctx.chat([{"role": "user", "content": "b"}, reply])  # edits message 0
    await ctx.chat([{"role": "user", "content": "b"}])  # drops the reply of turn 2
    assert ctx.append_only_violations == [{"turn": 2, "index": 0}, {"turn": 3, "index": 1}]
    assert ctx.metrics.model_dump()["append_only_violations"] == 2


@pytest.mark.parametrize("end", ["complete", "error"])
async def test_ended_says_whether_the_agent_ended_the_rollout(end: str) -> None:
    """``ctx.ended`` turns true at ``complete`` or ``error``: the endpoint refuses a chat call
    after it (``call_after_completion``) by it, not by the context's private state."""
    ctx = RolloutContext(make_request(), [], _Canned())
    await ctx.chat([{"role": "user", "content": "a"}])
    assert ctx.ended is False
    if end == "complete":
        ctx.complete([])
    else:
        ctx.error("stopped")
    assert ctx.ended is True


async def test_first_turn_may_send_any_history() -> None:
    """The first call is not compared with anything, even if it differs from request.messages."""
    ctx = RolloutContext(make_request(), [], _Canned())
    await ctx.chat([{"role": "system", "content": "x"}, {"role": "user", "content": "other"}])
    assert ctx.append_only_violations == []


async def test_the_append_only_warning_escapes_the_rollout_id(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The SDK's history-rewrite warning names the rollout too: its id is escaped there as well."""
    caplog.set_level(logging.WARNING)
    fnd = load_asset("fnd_history")
    rid = "evil\nCRITICAL forged line"
    async with serving(fnd.EditsEarlierMessageAgent(), tmp_path, replies=[ANSWER, ANSWER]) as s:
        await s.init(init_body(rid))
        await s.settle()

    about = [r.getMessage() for r in caplog.records if "rewrote the history" in r.getMessage()]
    assert about
    for message in about:
        assert "\nCRITICAL forged" not in message
        assert "evil\\nCRITICAL forged line" in message


# -- resolve_tools ------------------------------------------------------------------------------


class ToolsAgent(RolloutAgentLoop):
    """Returns whatever it was given from ``get_tools`` (sync)."""

    name = "tools-agent"

    def __init__(self, tools: Any) -> None:
        self.tools = tools

    def get_tools(self, request: RolloutRequest) -> Any:
        return self.tools

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        return ctx.complete([])


class AsyncToolsAgent(ToolsAgent):
    """Returns whatever it was given from an async ``get_tools``."""

    name = "async-tools-agent"

    async def get_tools(self, request: RolloutRequest) -> Any:
        return self.tools


@pytest.mark.parametrize("agent_class", [ToolsAgent, AsyncToolsAgent])
async def test_resolve_tools_accepts_dicts_and_models(agent_class: type[ToolsAgent]) -> None:
    """Dicts and pydantic tool models, from sync or async get_tools, become tool models."""
    model = OpenAIFunctionToolSchema(
        function=OpenAIFunctionSchema(
            name="mul", parameters={"type": "object", "properties": {"a": {"type": "integer"}}}
        )
    )
    tools = await resolve_tools(agent_class([tool("add"), model]), make_request())
    assert [t.name for t in tools] == ["add", "mul"]
    assert all(isinstance(t, OpenAIFunctionToolSchema) for t in tools)
    assert tools[0].function.parameters == tool("add")["function"]["parameters"]
    assert tools[1].function.description is None


@pytest.mark.parametrize("returned", [None, [], ()])
async def test_resolve_tools_accepts_no_tools(returned: Any) -> None:
    """None, an empty list and an empty tuple all mean "no tools"."""
    assert await resolve_tools(ToolsAgent(returned), make_request()) == []


async def test_resolve_tools_passes_the_request() -> None:
    """get_tools receives the rollout request, so tools can depend on metadata."""

    class PerRequest(RolloutAgentLoop):
        name = "per-request"

        def get_tools(self, request: RolloutRequest) -> list[dict[str, Any]]:
            return [tool(name) for name in request.metadata["tools"]]

        async def run(self, ctx: RolloutContext) -> RolloutResult:
            return ctx.complete([])

    tools = await resolve_tools(PerRequest(), make_request(metadata={"tools": ["a", "b"]}))
    assert [t.name for t in tools] == ["a", "b"]


@pytest.mark.parametrize(
    "name", ["has space", "", "a" * 65, "naïve", "dot.ted", "slash/ed", "semi;colon"]
)
async def test_resolve_tools_rejects_bad_names(name: str) -> None:
    """A function name outside ``^[a-zA-Z0-9_-]{1,64}$`` is named with its index."""
    with pytest.raises(AgentDefinitionError, match=r"^tools\[1\]\.function\.name "):
        await resolve_tools(ToolsAgent([tool("ok"), tool(name)]), make_request())


async def test_resolve_tools_accepts_the_longest_name() -> None:
    """A 64-character name with ``_`` and ``-`` is fine."""
    name = "a_-" + "b" * 61
    assert [t.name for t in await resolve_tools(ToolsAgent([tool(name)]), make_request())] == [name]


async def test_resolve_tools_rejects_duplicates() -> None:
    """Two tools with the same name fail, naming the second one."""
    with pytest.raises(AgentDefinitionError) as exc:
        await resolve_tools(ToolsAgent([tool("add"), tool("sub"), tool("add")]), make_request())
    assert str(exc.value) == "tools[2].function.name 'add' is duplicated"


@pytest.mark.parametrize(
    ("returned", "kind"),
    [(tool("add"), "dict"), ("add", "str"), (iter([tool("add")]), "list_iterator"), (3, "int")],
)
async def test_resolve_tools_rejects_non_lists(returned: Any, kind: str) -> None:
    """get_tools must return a list; the message names what it returned instead."""
    with pytest.raises(AgentDefinitionError) as exc:
        await resolve_tools(ToolsAgent(returned), make_request())
    assert str(exc.value) == f"get_tools() must return a list of tools, got {kind}"


@pytest.mark.parametrize(
    ("item", "detail"),
    [
        ("add", "valid dictionary"),
        ({"type": "function"}, "function: Field required"),
        ({"type": "retrieval", "function": {"name": "f"}}, "type: Input should be 'function'"),
        ({"type": "function", "function": {"description": "no name"}}, "function.name"),
        (
            {"type": "function", "function": {"name": "f", "parameters": {"x": object()}}},
            "not JSON serializable",
        ),
        (
            {"type": "function", "function": {"name": "f", "parameters": {"default": 1e999}}},
            "JSON",
        ),
    ],
    ids=["str", "no-function", "wrong-type", "no-name", "object", "infinity"],
)
async def test_resolve_tools_rejects_invalid_entries(item: Any, detail: str) -> None:
    """An entry that is not a JSON-clean OpenAI function tool is named as ``tools[i]``."""
    with pytest.raises(AgentDefinitionError) as exc:
        await resolve_tools(ToolsAgent([tool("ok"), item]), make_request())
    message = str(exc.value)
    assert message.startswith("tools[1] is not a valid OpenAI function tool: ")
    assert detail in message


# -- checked tool lists are cached, never served stale -----------------------------------------


async def test_the_same_tools_are_checked_once() -> None:
    """An agent returning the same tools every rollout gets the one checked set back."""
    agent = ToolsAgent([tool("add"), tool("sub")])
    first = await resolve_tool_set(agent, make_request("r-1"))
    second = await resolve_tool_set(agent, make_request("r-2"))
    assert second is first
    assert [t.name for t in second.tools] == ["add", "sub"]
    assert json.loads(second.json) == [tool("add"), tool("sub")]


async def test_a_new_list_each_rollout_gets_its_own_tools() -> None:
    """get_tools building a different list per rollout gets each list's own tools and JSON."""

    class PerRollout(RolloutAgentLoop):
        name = "per-rollout"

        def get_tools(self, request: RolloutRequest) -> list[dict[str, Any]]:
            return [tool(f"t_{request.rollout_id}")]

        async def run(self, ctx: RolloutContext) -> RolloutResult:
            return ctx.complete([])

    for rollout_id in ("a", "b", "a", "c"):
        tool_set = await resolve_tool_set(PerRollout(), make_request(rollout_id))
        assert [t.name for t in tool_set.tools] == [f"t_{rollout_id}"]
        assert json.loads(tool_set.json) == [tool(f"t_{rollout_id}")]


async def test_a_list_mutated_in_place_is_not_served_stale() -> None:
    """The same list object, changed between rollouts (appended, a nested schema or a
    description edited), is checked again and served as it is now."""
    tools = [tool("add")]
    agent = ToolsAgent(tools)
    assert [t.name for t in await resolve_tools(agent, make_request())] == ["add"]
    tools.append(tool("mul"))
    assert [t.name for t in await resolve_tools(agent, make_request())] == ["add", "mul"]
    tools[0]["function"]["parameters"]["properties"]["x"]["type"] = "integer"
    tools[1]["function"]["description"] = "Multiplies"
    again = await resolve_tool_set(agent, make_request())
    assert again.tools[0].function.parameters["properties"]["x"]["type"] == "integer"
    assert again.tools[1].function.description == "Multiplies"
    assert json.loads(again.json)[0]["function"]["parameters"]["properties"]["x"] == {
        "type": "integer"
    }
    tools[1]["function"]["name"] = "add"  # now invalid: the error comes back, nothing cached
    with pytest.raises(AgentDefinitionError, match="duplicated"):
        await resolve_tools(agent, make_request())


async def test_tool_models_mutated_in_place_are_not_served_stale() -> None:
    """Tool models returned again (as a Toolbox does) but edited are checked again."""
    model = OpenAIFunctionToolSchema(function=OpenAIFunctionSchema(name="add"))
    agent = ToolsAgent([model])
    first = await resolve_tool_set(agent, make_request())
    assert first.tools[0].function.description is None
    assert await resolve_tool_set(agent, make_request()) is first  # unchanged: checked once
    model.function.description = "Adds two numbers"
    model.function.parameters["properties"]["a"] = {"type": "number"}
    tool_set = await resolve_tool_set(agent, make_request())
    assert tool_set.tools[0].function.description == "Adds two numbers"
    assert tool_set.tools[0].function.parameters["properties"] == {"a": {"type": "number"}}


async def test_one_rollout_editing_its_tools_changes_no_other_rollouts() -> None:
    """The checked tool models are shared by every rollout whose get_tools returned the same
    list; each context and each ``resolve_tools`` caller gets copies, so edits stay local."""
    agent = ToolsAgent([tool("add")])
    first = await resolve_tool_set(agent, make_request("r-1"))
    second = await resolve_tool_set(agent, make_request("r-2"))
    one = RolloutContext(make_request("r-1"), first.tools, _Canned())
    one.tools[0].function.description = "edited by r-1"
    one.tools[0].function.parameters["properties"]["x"]["type"] = "integer"
    other = RolloutContext(make_request("r-2"), second.tools, _Canned())
    assert other.tools[0].function.description == "The add tool"
    assert other.tools[0].function.parameters["properties"]["x"] == {"type": "number"}
    mine = await resolve_tools(agent, make_request("r-3"))
    mine[0].function.name = "renamed"
    assert [t.name for t in await resolve_tools(agent, make_request("r-4"))] == ["add"]
    assert json.loads(second.json) == [tool("add")]


@pytest.mark.parametrize(
    ("first", "second"),
    [(1, 1.0), (1, True), (0.0, -0.0), ("1", 1)],
    ids=["int-float", "int-bool", "zero-sign", "str-int"],
)
async def test_equal_values_that_are_different_json_are_not_mixed_up(
    first: Any, second: Any
) -> None:
    """Python calls ``1 == 1.0 == True``; the tools' JSON does not: each keeps its own."""
    for value in (first, second, first):
        item = tool("f")
        item["function"]["parameters"]["properties"]["x"]["default"] = value
        [checked] = json.loads((await resolve_tool_set(ToolsAgent([item]), make_request())).json)
        default = checked["function"]["parameters"]["properties"]["x"]["default"]
        assert (type(default), json.dumps(default)) == (type(value), json.dumps(value))


async def test_non_json_values_are_checked_every_time() -> None:
    """A key that is not a string, or a tuple, is never taken for its JSON look-alike."""
    as_text = tool("f")
    as_text["function"]["parameters"]["properties"] = {"1": {"enum": ["a", "b"]}}
    as_int = tool("f")
    as_int["function"]["parameters"]["properties"] = {1: {"enum": ("a", "b")}}
    for item, key, enum in (
        (as_text, "1", ["a", "b"]),
        (as_int, 1, ("a", "b")),
        (as_text, "1", ["a", "b"]),
    ):
        [checked] = (await resolve_tool_set(ToolsAgent([item]), make_request())).tools
        assert checked.function.parameters["properties"] == {key: {"enum": enum}}
        assert type(checked.function.parameters["properties"][key]["enum"]) is type(enum)


async def test_extra_body_is_sent_as_top_level_fields_that_never_override(
    mock_client: tuple[MockTrainGate, TrainGateClient],
) -> None:
    """``completion_params.extra_body`` is the one way to send a field the server does not
    know (as the OpenAI SDK's ``extra_body``); a named field wins over it."""
    gate, client = mock_client
    params = {"temperature": 0.7, "extra_body": {"chat_template_kwargs": {"x": 1}, "min_p2": 3}}
    request = make_request(completion_params=params)
    record = gate.expect("r-1", api_key="tg-secret-key")
    ctx = RolloutContext(request, [], client.channel(request))

    await ctx.chat(request.messages, extra_body={"top_k": 5, "min_p2": 9})

    (sent,) = record.chats
    assert sent.temperature == 0.7
    assert sent.model_extra == {"top_k": 5, "min_p2": 9}


class _SendsTools(_Canned):
    """A v2-style backend: the context puts the tools (and tool_choice) in each body."""

    sends_tools = True

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def chat_completions(self, request: Any, *, request_id: str) -> Any:
        self.bodies.append(request.model_dump(exclude_none=True))
        return await super().chat_completions(request, request_id=request_id)


async def test_a_backend_that_sends_tools_gets_them_on_every_call() -> None:
    """Protocol v2: every call carries the tools and the agent's tool_choice; a v1 backend
    never gets either; once the agent replaced ctx.tools, its own list is sent."""
    tools = resolve_tools_now([ADD_TOOL])
    v2, v1 = _SendsTools(), _CannedRecording()
    ctx = RolloutContext(make_request(), tools, v2)
    history: list[dict[str, Any]] = [{"role": "user", "content": "a"}]
    history.append((await ctx.chat(history, tool_choice="auto")).message)
    ctx.tools = []
    await ctx.chat(history)
    plain = RolloutContext(make_request(), tools, v1)
    await plain.chat([{"role": "user", "content": "a"}], tool_choice="auto")

    assert [t["function"]["name"] for t in v2.bodies[0]["tools"]] == ["add"]
    assert v2.bodies[0]["tool_choice"] == "auto"
    assert "tools" not in v2.bodies[1]  # the agent's own (empty) list: no tools key
    assert "tools" not in v1.bodies[0]
    assert "tool_choice" not in v1.bodies[0]


class _CannedRecording(_Canned):
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def chat_completions(self, request: Any, *, request_id: str) -> Any:
        self.bodies.append(request.model_dump(exclude_none=True))
        return await super().chat_completions(request, request_id=request_id)


ADD_TOOL = {
    "type": "function",
    "function": {"name": "add", "parameters": {"type": "object", "properties": {}}},
}


def resolve_tools_now(tools: list[dict[str, Any]]) -> list[Any]:
    from osmosis_rollout.protocol import OpenAIFunctionToolSchema

    return [OpenAIFunctionToolSchema.model_validate(t) for t in tools]
