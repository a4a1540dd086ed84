"""The in-process OpenAI-compatible endpoint (`ctx.openai_client()`): an agent written only with
the `openai` client runs through ctx.chat, with the same turns, trace and findings, and what
such agents do that ctx.chat never did is reported."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from osmosis_rollout.endpoint.translate import BadRequest, parse_call, sse_events
from osmosis_rollout.evaluation import TestOptions, run_test
from osmosis_rollout.results import CompletionsResult
from osmosis_rollout.testing import Harness, ScriptedBackend

from .commands import run_cli_text
from .processes import osmosis_serve
from .support import DATASET, ROOT, load_asset

pytest.importorskip("openai")
pytestmark = pytest.mark.anyio

AGENTS = f"{ROOT}/tests/assets/byo_agents.py"


def _target(name: str) -> str:
    return f"{AGENTS}:{name}"


async def _report(name: str, **options: Any) -> Any:
    return await run_test(TestOptions(target=_target(name), dataset=DATASET, **options))


def _trace_events(folder: Path) -> list[dict[str, Any]]:
    """Every event of the debug traces under ``folder``."""
    return [
        json.loads(line) for p in folder.rglob("*.jsonl") for line in p.read_text().splitlines()
    ]


def _shape(report: Any) -> list[Any]:
    """Each row's conversation as roles and tool names (the mock's arguments vary by rollout id),
    its turns, tool calls and findings."""
    return [
        (
            [
                (m["role"], [c["function"]["name"] for c in m.get("tool_calls") or []])
                for m in row.final_messages
            ],
            row.turns,
            row.tool_calls,
            row.status,
            row.findings,
        )
        for row in report.rows
    ]


async def test_an_openai_client_agent_passes_offline_like_its_ctx_chat_twin() -> None:
    """Same rows, same mock LLM: the same turns reach TrainGate, the same results come back."""
    sdk = await _report("OpenAISdkAgent", limit=4)
    twin = await _report("ChatTwin", limit=4)
    assert sdk.summary["passed"] == 4, [r.findings for r in sdk.rows]
    assert _shape(sdk) == _shape(twin)


async def test_streaming_replies_are_the_same_turns() -> None:
    """`stream: true` (the SDK's stream helper) gives the same history; no finding."""
    streamed = await _report("StreamingAgent", limit=3)
    twin = await _report("ChatTwin", limit=3)
    assert streamed.summary["passed"] == 3, [r.findings for r in streamed.rows]
    assert _shape(streamed) == _shape(twin)


async def test_the_trace_is_a_ctx_chat_agents_trace(tmp_path: Path) -> None:
    """--debug-dir: each call is a `turn` event with the messages it added and the reply."""
    # "all": the mock calls every tool in turn 1, then answers: two turns.
    report = await _report("OpenAISdkAgent", limit=1, debug_dir=tmp_path, mock_policy="all")
    assert report.summary["passed"] == 1
    events = _trace_events(tmp_path)
    turns = [e for e in events if e["event"] == "turn"]
    assert [t["turn"] for t in turns] == [1, 2]
    assert turns[0]["reply"]["tool_calls"]
    assert "tools" not in turns[0]["params"]
    assert "model" not in turns[0]["params"]


async def test_record_then_replay_an_openai_client_agent(tmp_path: Path) -> None:
    cassette = tmp_path / "run.jsonl"
    recorded = await _report("OpenAISdkAgent", limit=3, record=cassette)
    assert recorded.summary["passed"] == 3
    replayed = await run_test(TestOptions(target=_target("OpenAISdkAgent"), replay=cassette))
    assert replayed.summary["passed"] == 3, [r.findings for r in replayed.rows]


@pytest.mark.parametrize(
    ("agent", "code", "message"),
    [
        ("ToolDroppingAgent", "tools_changed", "dropped ['multiply']"),
        ("ToolDroppingAgent", "tool_choice_dropped", "tool_choice 'required'"),
        ("ManyChoicesAgent", "n_greater_than_one", "asked for n=2 choices"),
        ("ParallelAgent", "parallel_calls", "sent alongside another call"),
        ("LateCallAgent", "call_after_completion", "after the rollout had completed"),
    ],
)
async def test_what_ctx_chat_never_did_is_a_finding(agent: str, code: str, message: str) -> None:
    report = await _report(agent, limit=1)
    found = [f for f in report.rows[0].findings if f.code == code]
    assert found, report.rows[0].findings
    assert message in found[0].message
    assert found[0].turn is not None


async def test_a_late_call_is_refused_and_never_reaches_traingate() -> None:
    report = await _report("LateCallAgent", limit=1)
    row = report.rows[0]
    assert row.turns == 1  # the mock saw one chat call, not two
    assert row.status == "COMPLETED"


async def test_n_above_one_is_a_clear_400() -> None:
    report = await _report("ManyChoicesAgent", limit=1)
    assert "n=2 is not supported" in (report.rows[0].error_message or "")


def _trimming_script(turns: int) -> ScriptedBackend:
    calls = [
        {"tool_calls": [{"id": f"c{i}", "function": {"name": "add", "arguments": '{"a":1,"b":2}'}}]}
        for i in range(turns)
    ]
    return ScriptedBackend([*calls, {"content": "3"}])


@pytest.mark.parametrize(
    ("agent", "rewritten"), [("TrimmingAgent", True), ("OpenAISdkAgent", False)]
)
async def test_a_history_trimmed_after_three_turns_is_reported(agent: str, rewritten: bool) -> None:
    """Trimmed at turn 4: `history_rewritten` names the turn and the position; untrimmed: clean."""
    module = load_asset("byo_agents")
    messages = [{"role": "system", "content": "add"}, {"role": "user", "content": "1+2, 5 times"}]
    async with Harness(getattr(module, agent)(), backend=_trimming_script(5)) as harness:
        outcome = await harness.run(messages)
    assert outcome.result is not None
    assert outcome.result.status.value == "COMPLETED"
    codes = [(f.code, f.turn) for f in outcome.findings]
    if rewritten:
        assert ("history_rewritten", 4) in codes
        finding = next(f for f in outcome.findings if f.code == "history_rewritten")
        assert "turn 4 rewrote the history at message 1" in finding.message
    else:
        assert codes == []


async def test_the_summary_says_whether_trajectories_are_trainable() -> None:
    clean = await _report("OpenAISdkAgent", limit=2)
    assert clean.summary["trainable"] is True
    trimmed = await _report("ParallelAgent", limit=2)
    assert trimmed.summary["trainable"] is False


def test_cli_prints_the_trainable_verdict() -> None:
    code, out, _ = run_cli_text("test", _target("OpenAISdkAgent"), "-d", DATASET, "--limit", "2")
    assert code == 0
    assert "trainable   yes" in out
    code, out, _ = run_cli_text("test", _target("ToolDroppingAgent"), "-d", DATASET, "--limit", "1")
    assert code == 1
    assert "trainable   no: tools_changed" in out


@pytest.mark.slow
def test_served_and_tested_with_server(tmp_path: Path) -> None:
    """`osmosis serve` + `osmosis test --server`: the endpoint works in a real server process."""
    with osmosis_serve(
        tmp_path / "serve.log", _target("OpenAISdkAgent"), "--port", "0", "--no-validate"
    ) as served:
        code, out, err = run_cli_text("test", "--server", served.url, "-d", DATASET, "--limit", "3")
    assert code == 0, out + err
    assert "3/3" in out


# -- translation ------------------------------------------------------------------------------


def test_a_body_that_is_not_a_chat_request_says_what_to_send() -> None:
    with pytest.raises(BadRequest, match="not JSON"):
        parse_call(b"{")
    with pytest.raises(BadRequest, match="`messages` must be a non-empty list"):
        parse_call(b'{"model": "x"}')
    with pytest.raises(BadRequest, match="`n` must be a positive integer"):
        parse_call(b'{"messages": [{"role": "user", "content": "hi"}], "n": 0}')


def test_sampling_parameters_pass_and_what_traingate_owns_does_not() -> None:
    body = {
        "model": "gpt-x",
        "messages": [{"role": "user", "content": "hi", "name": None}],
        "temperature": 0.3,
        "max_tokens": 9,
        "tools": [],
        "tool_choice": "auto",
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    call = parse_call(json.dumps(body).encode())
    assert call.params == {"temperature": 0.3, "max_tokens": 9}
    assert call.messages == [{"role": "user", "content": "hi"}]
    assert call.stream
    assert call.include_usage
    assert call.model == "gpt-x"


def test_sse_carries_the_tool_calls_the_finish_reason_and_the_usage() -> None:
    result = CompletionsResult(
        message={
            "role": "assistant",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}
            ],
        },
        usage={"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
        finish_reason="tool_calls",
    )
    raw = sse_events(result, "1", "m", include_usage=True).decode()
    events = [line[6:] for line in raw.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[1]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"] == "add"
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}


async def test_a_parameter_of_the_wrong_type_is_a_400_naming_it() -> None:
    report = await _report("BadParameterAgent", limit=1)
    message = report.rows[0].error_message or ""
    assert "Error code: 400 - this request cannot be sent: temperature:" in message, message
    assert report.rows[0].turns == 0


def test_the_in_process_client_is_made_once_per_rollout() -> None:
    from osmosis_rollout.agent import RolloutContext
    from osmosis_rollout.protocol import RolloutRequest

    request = RolloutRequest(
        rollout_id="r", server_url="http://gate.test", messages=[], completion_params={}
    )
    ctx = RolloutContext(request, [], backend=None)  # type: ignore[arg-type]
    assert ctx.openai_client() is ctx.openai_client()
    assert ctx.openai_client(timeout=5) is not ctx.openai_client()


async def test_on_v2_each_call_carries_its_own_tools_and_the_finding_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Protocol v2 carries tools with every chat call: a call through the endpoint sends the
    tools and ``tool_choice`` it was given (not the declared ones), ``tools_changed`` says
    what that means on v2, and ``tool_choice_dropped`` (nothing is dropped) is not raised."""
    from osmosis_rollout.testing import MockTrainGate

    from .support import recording_bodies

    gate = MockTrainGate(ScriptedBackend([{"content": "3"}]))
    bodies: list[tuple[str, bytes]] = []
    gate.app = recording_bodies(gate.app, bodies)
    agent = load_asset("byo_agents").ToolDroppingAgent()
    async with Harness(agent, gate=gate, protocol="v2") as harness:
        outcome = await harness.run([{"role": "user", "content": "1 + 2?"}])
    assert outcome.result is not None
    [chat] = [json.loads(raw) for path, raw in bodies if path.endswith("/chat/completions")]
    assert [tool["function"]["name"] for tool in chat["tools"]] == ["add"]
    assert chat["tool_choice"] == "required"
    said = [r.getMessage() for r in caplog.records if r.name == "osmosis_rollout.endpoint"]
    [changed] = said  # tools_changed only: no tool_choice_dropped, v2 carries it
    assert "dropped ['multiply']" in changed
    assert "protocol v2" in changed
