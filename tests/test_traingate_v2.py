"""The mock TrainGate as a protocol v2 controller (testing/wire/v2.py), driven against a
small v2 server that follows the spec (tests/v2_stub.py) on 127.0.0.1; each v2 finding is
provoked on purpose by bending one rule, and never fires on the well-behaved stub."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from osmosis_rollout import RolloutAgentLoop, RolloutContext, RolloutRequest, RolloutResult
from osmosis_rollout.errors import ConfigError
from osmosis_rollout.evaluation.runner import RowInput, RunOptions, run_batch
from osmosis_rollout.protocol import CompletionsRequest, GraderCallback, Sample
from osmosis_rollout.testing import Harness, MockLLMBackend, MockTrainGate
from osmosis_rollout.testing.records import completion_from_message
from osmosis_rollout.testing.wire.v2 import retry_after, sse_reply, v2_result, v2_route

from .support import load_asset, serve_in_thread, wait_until
from .v2_stub import ADD_TOOL, Behaviour, V2Stub

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "What is 3 + 4?"}]


@pytest.fixture
def stub(request: pytest.FixtureRequest) -> Iterator[tuple[V2Stub, str]]:
    behaviour = getattr(request, "param", None) or Behaviour()
    server = V2Stub(behaviour)
    with serve_in_thread(server.app) as url:
        yield server, url


async def run_one(url: str, *, timeout_s: float = 5.0, **run: Any) -> Any:
    async with Harness(
        server_url=url, backend=MockLLMBackend(seed=1), protocol="v2", v2_slack_s=0.3
    ) as harness:
        return await harness.run(
            MESSAGES,
            rollout_id="r/1 x",  # a slash and a space: the id must travel as one path segment
            metadata={"ground_truth": "7"},
            timeout_s=timeout_s,
            **run,
        )


def codes(outcome: Any) -> set[str]:
    return {f.code for f in outcome.findings}


@pytest.mark.parametrize("stub", [Behaviour(), Behaviour(stream=True)], indirect=True)
async def test_a_spec_following_server_gives_a_clean_row(stub: tuple[V2Stub, str]) -> None:
    """Both callbacks, the status agreeing, tools on every call, JSON or SSE replies: no
    finding, and the row reads as a v1 row would (COMPLETED, the reward, the messages)."""
    server, url = stub
    outcome = await run_one(url)
    assert outcome.findings == []
    result = outcome.result
    assert result is not None
    assert result.status.value == "COMPLETED"
    assert result.reward == 1.0
    assert result.finish_reason == "stop"
    assert [m["role"] for m in result.final_messages] == ["user", "assistant", "tool", "assistant"]
    assert outcome.record.v2.status == (
        200,
        {"rollout_id": "r/1 x", "status": "success", "reward": 1.0, "err_message": None},
    )
    body = server.rollouts["r/1 x"].body
    assert body["label"] == "7"
    assert body["metadata"] == {"ground_truth": "7"}
    assert body["llm_api_key"] != body["controller_api_key"]
    assert body["chat_completions_url"].endswith("/v1/rollouts/r%2F1%20x")
    assert body["grader_callback_url"].endswith("/v1/rollouts/r%2F1%20x/grader")
    assert next(sorted(c) for c in server.chat_bodies) == sorted(
        ["model", "messages", "tools", *(["stream"] if server.behaviour.stream else [])]
    )


@pytest.mark.parametrize(
    ("stub", "finding"),
    [
        (Behaviour(send_tools=False, tools_in_202=True), "tools_not_sent"),
        (Behaviour(body_id="someone-else"), "body_id_mismatch"),
        (Behaviour(chat_with_callback_key=True), "callback_key_in_chat"),
        (Behaviour(grader_first=True), "grader_before_completion"),
        (Behaviour(duplicate_grader=True), "duplicate_grader"),
        (Behaviour(agent_fails=True, reward_on_failure=True), "reward_on_failure"),
        (Behaviour(status_says="running"), "non_terminal_status"),
        (Behaviour(status_says="failure"), "status_wrong"),
        (Behaviour(status_says="unknown"), "status_wrong"),
    ],
    indirect=["stub"],
)
async def test_each_broken_rule_is_its_finding(stub: tuple[V2Stub, str], finding: str) -> None:
    _server, url = stub
    outcome = await run_one(url, timeout_s=0.5, grader_timeout_s=0.5)
    record = outcome.record  # a duplicate may come after the row was reported: still recorded
    await wait_until(lambda: finding in {f.code for f in record.findings}, 5.0)


async def test_tools_not_sent_is_known_from_an_earlier_call_on_a_remote_server() -> None:
    """With --server the agent's get_tools is out of reach; a call without tools after one
    with them is still caught (here: the first call sends them, the second does not)."""

    class SecondCallBare(V2Stub):
        async def _chat(self, http: Any, body: Any, key: str, messages: list[Any]) -> Any:
            self.behaviour.send_tools = not self.chat_bodies
            return await super()._chat(http, body, key, messages)

    server = SecondCallBare()
    with serve_in_thread(server.app) as url:
        outcome = await run_one(url)
    assert [f.code for f in outcome.findings] == ["tools_not_sent"]
    assert outcome.findings[0].turn == 2
    assert [("tools" in c) for c in server.chat_bodies] == [True, False]


@pytest.mark.parametrize("stub", [Behaviour(send_grader=False)], indirect=True)
async def test_a_missing_grader_is_a_finding_then_a_cancel(stub: tuple[V2Stub, str]) -> None:
    """Past agent + grader + slack the controller reports the missing grader callback and
    cancels; the stub ended the rollout already, so not_found is right (no cancel_wrong)."""
    _server, url = stub
    outcome = await run_one(url, timeout_s=0.2, grader_timeout_s=0.1)
    assert codes(outcome) == {"missing_grader_callback"}
    assert outcome.record.v2.cancel == (200, {"dispositions": {"r/1 x": "not_found"}})
    assert outcome.result is not None
    assert outcome.result.status.value == "ERROR"
    assert outcome.result.error_message == "no grader callback"


@pytest.mark.parametrize(
    "stub",
    [Behaviour(send_completion=False, send_grader=False, agent_sleep_s=30.0)],
    indirect=True,
)
async def test_a_silent_rollout_is_cancelled_while_running(stub: tuple[V2Stub, str]) -> None:
    server, url = stub
    outcome = await run_one(url, timeout_s=0.2, grader_timeout_s=0.1)
    assert codes(outcome) == {"no_completion", "missing_grader_callback"}
    assert outcome.record.v2.cancel == (200, {"dispositions": {"r/1 x": "cancelled_running"}})
    assert outcome.result is None
    assert server.rollouts["r/1 x"].status == "cancelled"


@pytest.mark.parametrize(
    "stub",
    [Behaviour(send_completion=False, send_grader=False, cancel_says="not_found")],
    indirect=True,
)
async def test_a_cancel_that_forgot_the_rollout_is_cancel_wrong(stub: tuple[V2Stub, str]) -> None:
    _server, url = stub
    outcome = await run_one(url, timeout_s=0.2, grader_timeout_s=0.1)
    assert "cancel_wrong" in codes(outcome)


@pytest.mark.parametrize("stub", [Behaviour(max_in_flight=0, retry_after="0.05")], indirect=True)
async def test_429_is_retried_after_retry_after_then_given_up(stub: tuple[V2Stub, str]) -> None:
    """A full server: the same body is resent after each Retry-After, until the rollout's
    own deadline; the row is then refused with the 429's detail."""
    server, url = stub
    outcome = await run_one(url, timeout_s=0.2, grader_timeout_s=0.1)
    assert outcome.init_status == 429
    assert not outcome.accepted
    assert "rollout queue is full" in (outcome.init_error or "")
    assert server.inits >= 5
    assert outcome.record.v2.throttled == server.inits - 1


async def test_429_then_accepted_runs_the_rollout() -> None:
    server = V2Stub(Behaviour(max_in_flight=0))
    original = server.start

    async def start(request: Any) -> Any:
        if server.inits >= 2:
            server.behaviour.max_in_flight = 100
        return await original(request)

    server.app.router.routes[1].endpoint = start  # type: ignore[attr-defined]
    server.app.router.routes[1].app = _endpoint_app(start)  # type: ignore[attr-defined]
    with serve_in_thread(server.app) as url:
        outcome = await run_one(url)
    assert outcome.accepted
    assert outcome.findings == []
    assert outcome.record.v2.throttled == 2
    assert server.inits == 3


def _endpoint_app(endpoint: Any) -> Any:
    from starlette.routing import request_response

    return request_response(endpoint)


async def test_callbacks_are_checked_as_a_v2_controller_does() -> None:
    """§11.3: the callback key (else 401 + bad_api_key), a known id (404), the body id (422),
    the status enum (422); each acknowledged with {"ok": true} when right."""
    gate = MockTrainGate(MockLLMBackend())
    gate.v2.expect("r-1", api_key="llm", callback_key="cb")
    auth = {"authorization": "Bearer cb"}
    done = json.dumps({"status": "success", "rollout_id": "r-1"}).encode()
    handle = gate.v2.handle
    assert (await handle("completion", "r-1", {}, done)).status_code == 401
    assert (await handle("completion", "nope", auth, done)).status_code == 404
    assert (await handle("completion", "r-1", auth, b'{"status": "pending"}')).status_code == 422
    other = json.dumps({"status": "success", "rollout_id": "r-2"}).encode()
    assert (await handle("completion", "r-1", auth, other)).status_code == 422
    reply = await handle("completion", "r-1", auth, done)
    assert (reply.status_code, reply.json()) == (200, {"ok": True})
    record = gate.records["r-1"]
    assert [f.code for f in record.findings] == [
        "bad_api_key",
        "malformed_request",
        "body_id_mismatch",
    ]
    assert [f.code for f in gate.stray_findings] == ["unknown_rollout"]
    # the chat route: the llm key only, and never the callback key
    chat = json.dumps({"model": "m", "messages": MESSAGES}).encode()
    assert (await handle("chat/completions", "r-1", auth, chat)).status_code == 401
    assert record.findings[-1].code == "callback_key_in_chat"
    llm = {"authorization": "bearer llm"}  # the scheme is case-insensitive
    assert (await handle("chat/completions", "r-1", llm, chat)).status_code == 200


async def test_the_in_process_carrier_routes_v2_paths() -> None:
    gate = MockTrainGate(MockLLMBackend())
    gate.v2.expect("a/b", api_key="k", callback_key="c")
    carrier = gate.post_transport()
    chat = json.dumps({"model": "m", "messages": MESSAGES, "stream": True}).encode()
    reply = await carrier.post(
        "http://traingate.test/v1/rollouts/a%2Fb/chat/completions",
        chat,
        {"Authorization": "Bearer k"},
    )
    assert reply.status_code == 200
    assert reply.headers["content-type"] == "text/event-stream"
    assert reply.content.endswith(b"data: [DONE]\n\n")
    missing = await carrier.post("http://traingate.test/v1/rollouts/a%2Fb/elsewhere", b"{}", {})
    assert missing.status_code == 404


def test_route_parsing_and_retry_after() -> None:
    assert v2_route("/v1/rollouts/a%2Fb/grader") == ("grader", "a/b")
    assert v2_route("/v1/rollouts/x/chat/completions") == ("chat/completions", "x")
    assert v2_route("/v1/rollouts//completion") is None
    assert v2_route("/v1/rollouts/a/b/completion") is None
    assert [retry_after(v) for v in (None, "2", "0", "999", "soon", "nan")] == [
        1.0,
        2.0,
        0.05,
        60.0,
        1.0,
        1.0,
    ]


def test_sse_reply_is_one_chunk_then_done() -> None:
    request = CompletionsRequest(rollout_id="r", messages=MESSAGES)
    reply = completion_from_message(
        request,
        {"tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add"}}]},
    )
    events = sse_reply(reply).decode().split("\n\n")
    assert events[1:] == ["data: [DONE]", ""]
    chunk = json.loads(events[0].removeprefix("data: "))
    assert chunk["object"] == "chat.completion.chunk"
    assert chunk["choices"][0]["delta"]["tool_calls"][0]["index"] == 0
    assert chunk["choices"][0]["finish_reason"] == "tool_calls"
    assert chunk["usage"]["total_tokens"] == reply.usage.total_tokens


def test_the_two_callbacks_make_one_neutral_result() -> None:
    grader = GraderCallback(
        status="failure",
        sample=Sample(messages=MESSAGES, extra_fields={"finish_reason": "max_turns"}),
        err_message="workflow exceeded its 1s deadline",
        err_category="timeout",
    )
    result = v2_result("r", None, grader)
    assert result.status.value == "ERROR"
    assert result.finish_reason == "max_turns"
    assert result.error_message == "timeout: workflow exceeded its 1s deadline"
    assert result.final_messages == MESSAGES
    assert result.reward is None


# -- in process: our server over v2, the kept checks and tools_not_sent --------------------

ROWS = [RowInput(index=i, messages=[{"role": "user", "content": f"question {i}"}]) for i in (1, 2)]


async def run_in_process(agent: Any) -> list[set[str]]:
    async with Harness(agent, backend=MockLLMBackend(seed=1), protocol="v2") as harness:
        report = await run_batch(harness, ROWS, RunOptions(timeout_s=10, concurrency=2))
    return [{f.code for f in row.findings} for row in report.rows]


@pytest.mark.parametrize(
    ("agent_name", "finding"),
    [
        ("RewritesHistoryAgent", "history_rewritten"),
        ("UnknownToolAgent", "unknown_tool"),
    ],
)
async def test_the_kept_checks_fire_on_v2_too(agent_name: str, finding: str) -> None:
    agent = getattr(load_asset("bad_agents"), agent_name)()
    assert await run_in_process(agent) == [{finding}, {finding}]


async def test_good_agents_are_clean_on_v2_in_process() -> None:
    good = load_asset("bad_agents").GoodAgent()
    calculator = load_asset("../../examples/calculator/agent").CalculatorAgent()
    for agent in (good, calculator):
        assert await run_in_process(agent) == [set(), set()]


class _BareChatAgent(RolloutAgentLoop):
    """Declares a tool, then calls its chat channel itself, without the tools."""

    name = "bare-chat"

    def get_tools(self, request: RolloutRequest) -> list[dict[str, Any]]:
        return [ADD_TOOL]

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = list(ctx.request.messages)
        request = CompletionsRequest(rollout_id=ctx.request.rollout_id, messages=messages)
        reply = await ctx.llm.chat_completions(request, request_id="bare-1")  # type: ignore[attr-defined]
        return ctx.complete([*messages, reply.message.model_dump(exclude_none=True)], reward=1.0)


async def test_a_chat_call_without_the_declared_tools_is_tools_not_sent() -> None:
    assert await run_in_process(_BareChatAgent()) == [{"tools_not_sent"}, {"tools_not_sent"}]


async def test_a_server_without_v2_is_one_clear_error_before_any_row() -> None:
    """--server URL --protocol v2 against a v1-only server: a ConfigError at start, not a
    404 for every row."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def health(request: Any) -> JSONResponse:
        return JSONResponse({"status": "healthy"})

    v1_only = Starlette(routes=[Route("/health", health)])
    with serve_in_thread(v1_only) as url:
        harness = Harness(server_url=url, protocol="v2")
        with pytest.raises(ConfigError, match=r"does not speak protocol v2 \(POST /rollout"):
            async with harness:
                pass


def test_v2_urls_in_error_messages_are_named_for_what_they_are() -> None:
    from osmosis_rollout.testing.traingate import name_gate_urls

    base = "http://traingate.test"
    text = (
        f"POST {base}/v1/rollouts/row-1%2Fa/chat/completions: HTTP 503; {base}/v1/rollouts/x/grader"
    )
    assert name_gate_urls(text, base) == (
        "POST the mock TrainGate's chat endpoint: HTTP 503; the mock TrainGate's grader endpoint"
    )


async def test_the_runs_sampling_reaches_each_v2_call_through_the_mock() -> None:
    """v2's init has no sampling parameters: the controller applies --temperature and
    --max-tokens to each call (the agent's own values, where it gives them, win)."""
    calculator = load_asset("../../examples/calculator/agent").CalculatorAgent()
    backend = MockLLMBackend(seed=1, policy="all")  # every tool in turn 1, then the answer
    async with Harness(calculator, backend=backend, protocol="v2") as harness:
        outcome = await harness.run(
            MESSAGES, completion_params={"temperature": 0.25, "max_tokens": 400}
        )
    assert outcome.findings == []
    assert [(c.temperature, c.max_tokens) for c in outcome.record.chats] == [(0.25, 400)] * 2


@pytest.mark.parametrize(
    ("truth", "label"), [("7", "7"), (7, "7"), ({"a": [1, 2]}, '{"a":[1,2]}'), (None, None)]
)
def test_the_label_is_the_rows_ground_truth_as_a_string(truth: Any, label: str | None) -> None:
    """v2's label is a string: a number or a structure is sent as its JSON."""
    from osmosis_rollout.protocol import RolloutRequest
    from osmosis_rollout.testing.wire.v2 import start_body

    metadata = {} if truth is None else {"ground_truth": truth}
    request = RolloutRequest(
        rollout_id="r", server_url="http://x.test", messages=MESSAGES, completion_params={},
        metadata=metadata,
    )  # fmt: skip
    body = start_body(
        request, base_url="http://gate.test", llm_key="a", callback_key="b",
        agent_timeout_s=1, grader_timeout_s=2,
    )  # fmt: skip
    assert body["label"] == label
    assert body["metadata"] == metadata


def test_a_cancelled_rollout_reads_as_cancelled() -> None:
    from osmosis_rollout.protocol import CompletionCallback

    completion = CompletionCallback(status="cancelled", err_message="rollout cancelled")
    grader = GraderCallback(status="failure", err_message="rollout cancelled")
    result = v2_result("r", completion, grader)
    assert result.status.value == "ERROR"
    assert result.finish_reason == "cancelled"
    assert result.error_message == "rollout cancelled"
