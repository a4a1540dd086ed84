"""Issue 28: v1 (osmosis-ai 0.2.x) samples, run with only their imports changed.

Each test is written the way a v1 user wrote it; where the issue asks, the completion callback
is compared field by field with what v1 sent (``V1_*`` below, written down from v1's client:
the reply dict as TrainGate sent it, ``content: null`` beside tool calls included).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from starlette.requests import Request
from starlette.testclient import TestClient

from osmosis_rollout.compat import (
    OsmosisLLMClient,
    RolloutAgentLoop,
    RolloutContext,
    RolloutRequest,
    RolloutResult,
    create_app,
)
from osmosis_rollout.errors import ConfigError
from osmosis_rollout.evaluation import TestOptions
from osmosis_rollout.evaluation.assembly import make_backend
from osmosis_rollout.testing import Harness, MockTrainGate, ScriptedBackend

from .commands import assert_one_clear_error, run_cli
from .openai_stub import OpenAIStub, text, tool_call
from .processes import clean_env, osmosis_serve
from .support import ASSETS, ROOT, load_asset, recording_bodies, serve_in_thread

pytestmark = pytest.mark.anyio

CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "add", "arguments": '{"a": 3, "b": 4}'},
}
QUESTION = [{"role": "user", "content": "3 + 4?"}]
CALC_QUESTION = [{"role": "user", "content": "What is 6 * 7?"}]
CALCULATE: dict[str, Any] = {
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {
                "name": "calculate",
                "arguments": '{"operation": "multiply", "a": 6, "b": 7}',
            },
        }
    ]
}


class ContentReader(RolloutAgentLoop):
    """A v1 agent that reads ``msg["content"]`` on every reply, tool calls or not."""

    name = "content_reader"

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    def get_tools(self, request: RolloutRequest) -> list[dict[str, Any]]:
        return [
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
        ]

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = list(ctx.request.messages)
        for _ in range(ctx.request.max_turns):
            result = await ctx.chat(messages, **ctx.request.completion_params)
            msg = result.message
            self.seen.append(dict(msg))
            messages.append(msg)
            if msg["content"] and not result.has_tool_calls:  # v1: the key is always there
                return ctx.complete(messages, reward=1.0)
            for call in result.tool_calls:
                args = json.loads(call["function"]["arguments"])
                ctx.record_tool_call()
                messages.append(
                    {
                        "role": "tool",
                        "content": str(args["a"] + args["b"]),
                        "tool_call_id": call["id"],
                    }
                )
        return ctx.complete(messages, finish_reason="max_turns")


#: What v1 sent as the completion callback of ContentReader's rollout (metrics aside).
V1_TOOL_CALL_CALLBACK = {
    "status": "COMPLETED",
    "finish_reason": "stop",
    "error_message": None,
    "reward": 1.0,
    "final_messages": [
        *QUESTION,
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "content": "7", "tool_call_id": "call_1"},
        {"role": "assistant", "content": "7"},
    ],
}


# -- item 1: result.message keeps "content": None ------------------------------------------------


async def test_a_tool_call_reply_keeps_content_none_as_v1_did() -> None:
    """``msg["content"]`` on a tool-call reply is None, not a KeyError: the agent sees v1's
    message, the rollout completes with v1's callback, and the next chat request carries the
    message as the agent kept it, ``content: None`` included."""
    backend = ScriptedBackend([{"tool_calls": [CALL]}, {"content": "7"}])
    agent = ContentReader()
    async with Harness(agent, backend=backend) as harness:
        outcome = await harness.run(QUESTION, rollout_id="content-1")
    assert agent.seen[0] == {"role": "assistant", "content": None, "tool_calls": [CALL]}
    assert outcome.result is not None
    sent = outcome.result.model_dump(mode="json")
    for key, expected in V1_TOOL_CALL_CALLBACK.items():
        assert sent[key] == expected, key
    second_turn = outcome.record.chats[1].messages
    assert second_turn[1] == agent.seen[0]
    assert outcome.findings == []


#: The sampling parameters of the wire test: all three of v1's, so v1's defaults play no part.
WIRE_PARAMS = {"temperature": 0.7, "top_p": 0.9, "max_tokens": 256}


def v1_chat_body(rollout_id: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """What v1's ``OsmosisLLMClient.chat_completions(messages, **params)`` posted: its
    ``CompletionsRequest`` (``/work/shared/protocol.md`` section 3: ``model`` "default",
    ``rollout_id``, the history, the sampling fields, ``logprobs: true``; nulls left out at the
    top level only) sent with ``post(url, json=payload)`` (v1-api.md 2.6), so each message is
    the dict the agent kept, ``"content": null`` beside tool calls included."""
    return {
        "model": "default",
        "rollout_id": rollout_id,
        "messages": messages,
        **WIRE_PARAMS,
        "logprobs": True,
    }


async def test_the_v1_wire_sends_a_tool_call_turn_as_v1_did() -> None:
    """The bodies on the v1 wire for a tool-call turn, key by key (and in v1's key order) as
    v1 sent them, rebuilt from protocol.md (sections 3 and 4) and v1-api.md (2.2, 2.6) since
    the original SDK is not installed: the second chat request's history and the callback's
    ``final_messages`` carry the assistant turn with ``"content": null``, as TrainGate sent it
    and the agent kept it. Chat templates render null and absent differently (issue 41), so
    the trainer must see what it was built against. Metrics are item 2's test."""
    gate = MockTrainGate(ScriptedBackend([{"tool_calls": [CALL]}, {"content": "7"}]))
    bodies: list[tuple[str, bytes]] = []
    gate.app = recording_bodies(gate.app, bodies)
    async with Harness(ContentReader(), gate=gate) as harness:
        outcome = await harness.run(QUESTION, rollout_id="wire-1", completion_params=WIRE_PARAMS)
    assert outcome.findings == []
    assert [path for path, _ in bodies] == [
        "/v1/chat/completions",
        "/v1/chat/completions",
        "/v1/rollout/completed",
    ]
    turn = {"role": "assistant", "content": None, "tool_calls": [CALL]}
    history = [*QUESTION, turn, {"role": "tool", "content": "7", "tool_call_id": "call_1"}]
    expected = [v1_chat_body("wire-1", QUESTION), v1_chat_body("wire-1", history)]
    for (_, raw), v1 in zip(bodies[:2], expected, strict=True):
        sent = json.loads(raw)
        assert list(sent) == list(v1)
        for key, value in v1.items():
            assert json.dumps(sent[key]) == json.dumps(value), key  # key order inside too
    assert b'{"role":"assistant","content":null,"tool_calls":' in bodies[1][1]
    callback = json.loads(bodies[2][1])
    v1_callback = {  # v1's RolloutResponse, nulls left out (no error_message on COMPLETED)
        "rollout_id": "wire-1",
        "status": "COMPLETED",
        "final_messages": [*history, {"role": "assistant", "content": "7"}],
        "finish_reason": "stop",
        "reward": 1.0,
        "metrics": callback["metrics"],
        "extra_fields": {},
    }
    assert list(callback) == list(v1_callback)
    for key, value in v1_callback.items():
        assert json.dumps(callback[key]) == json.dumps(value), key


#: The eight metrics v1's callback carried (v1-api.md 2.2 ``_build_metrics``).
V1_METRICS = (
    "total_latency_ms",
    "llm_latency_ms",
    "tool_latency_ms",
    "num_llm_calls",
    "num_tool_calls",
    "prompt_tokens",
    "response_tokens",
    "max_context_tokens",
)


def table_rows(path: Path, heading: str) -> list[str]:
    """The body rows of the first table under ``heading`` in the Markdown file at ``path``."""
    lines = path.read_text(encoding="utf-8").split(heading, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start + 2 : end]


async def test_every_v1_callback_metric_that_differs_from_v1_is_in_the_migration_table() -> None:
    """v1 sent eight metrics with ``max_context_tokens`` always 0; the v1 wire sends that one
    measured and adds others (docs/protocol.md, "Metrics"). Each is kept on purpose, so each is
    a row of the migration page's "What differs, on purpose" table, and a tool-calling v1
    rollout's callback carries no metric that neither lists."""
    added = {
        row.split("`")[1]
        for row in table_rows(ROOT / "docs" / "protocol.md", "### Metrics")
        if "| added" in row
    }
    assert {"queue_latency_ms", "tool_wall_ms"} <= added
    differs = table_rows(ROOT / "docs" / "migrating-from-v1.md", "## What differs, on purpose")
    for key in sorted(added | {"max_context_tokens"}):
        assert any(f"{key}`" in " | ".join(row.split(" | ")[:2]) for row in differs), key
    backend = ScriptedBackend([{"tool_calls": [CALL]}, {"content": "7"}])
    async with Harness(load_asset("tool_agent").ToolAgent(), backend=backend) as harness:
        outcome = await harness.run(QUESTION, rollout_id="metrics-1")
    assert outcome.result is not None
    assert outcome.result.metrics is not None
    sent = outcome.result.metrics.model_dump(mode="json")
    assert set(V1_METRICS) <= set(sent)
    assert set(sent) - set(V1_METRICS) <= added
    assert sent["max_context_tokens"] > 0  # measured, where v1 sent 0


# -- item 2: osmosis test keeps v1's meanings ------------------------------------------------------

V1_ROWS = [
    {"system_prompt": "You add.", "user_prompt": f"{a} + {b}?", "ground_truth": str(a + b)}
    for a, b in ((1, 2), (3, 4), (5, 6))
]
AGENT = f"{ASSETS}/v1_calculator.py:agent_loop"
V1_DATA = ASSETS / "datasets" / "arithmetic.jsonl"


def v1_dataset(tmp_path: Path) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in V1_ROWS))
    return path


def no_llm_env(**extra: str) -> dict[str, str | None]:
    env: dict[str, str | None] = {"OPENAI_API_KEY": None, "OPENAI_BASE_URL": None}
    env.update({"OPENAI_MODEL": None, "OSMOSIS_API_KEY": None, "COLUMNS": "200", **extra})
    return env


def test_model_and_api_key_reach_a_real_endpoint_not_the_mock(tmp_path: Path) -> None:
    """v1's ``--model gpt-4o --api-key sk-...``: the endpoint of OPENAI_BASE_URL gets every
    turn with that model and key (v1's ``openai/`` prefix dropped), and answers them."""
    stub = OpenAIStub(default=text("done"))
    with stub.serve() as url:
        result = run_cli(
            "test", "-d", str(v1_dataset(tmp_path)), AGENT, "--model", "openai/gpt-4o",
            "--api-key", "sk-v1-key",
            env=no_llm_env(OPENAI_BASE_URL=url),
        )  # fmt: skip
    assert result.exit_code == 0, result.stdout + result.stderr
    assert len(stub.requests) == 3
    assert {r.body["model"] for r in stub.requests} == {"gpt-4o"}
    assert {r.headers["authorization"] for r in stub.requests} == {"Bearer sk-v1-key"}
    assert "sk-v1-key" not in result.stdout + result.stderr


def test_a_model_without_a_key_is_a_usage_error_never_the_mock(tmp_path: Path) -> None:
    result = run_cli(
        "test", AGENT, "-d", str(v1_dataset(tmp_path)), "--model", "gpt-4o", env=no_llm_env()
    )
    assert_one_clear_error(result, "OPENAI_API_KEY")
    assert "passed" not in result.stdout


def test_another_providers_model_names_the_fix(tmp_path: Path) -> None:
    result = run_cli(
        "test", AGENT, "-d", str(v1_dataset(tmp_path)), "--model", "anthropic/claude-3",
        env=no_llm_env(OPENAI_API_KEY="sk-x"),
    )  # fmt: skip
    assert_one_clear_error(result, "--llm-url")


def test_the_mock_with_a_model_is_refused() -> None:
    """The Python twin: a model with the mock LLM is an error, never ignored."""
    options = TestOptions(target=AGENT, dataset=V1_DATA, model="gpt-4o")
    with pytest.raises(ConfigError, match="--model 'gpt-4o'"):
        make_backend(options)


def test_dash_o_json_writes_v1s_one_object(tmp_path: Path) -> None:
    """``-o results.json`` is v1's shape for ``json.load``; each key with v1's meaning."""
    out = tmp_path / "results.json"
    result = run_cli("test", AGENT, "-d", str(v1_dataset(tmp_path)), "-o", str(out))
    assert result.exit_code == 0, result.stdout + result.stderr
    data = json.loads(out.read_text())
    assert set(data) == {"summary", "results"}
    summary = data["summary"]
    assert (summary["total"], summary["passed"], summary["failed"]) == (3, 3, 0)
    assert summary["total_duration_ms"] > 0
    rows = data["results"]
    assert [r["row_index"] for r in rows] == [0, 1, 2]  # v1 counted from 0
    assert [r["row"] for r in rows] == [1, 2, 3]
    first = rows[0]
    for key in ("success", "error", "duration_ms", "token_usage", "reward", "finish_reason"):
        assert key in first, key
    assert first["success"] is True
    assert first["error"] is None
    usage = first["token_usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0
    assert usage["num_llm_calls"] >= 1
    assert summary["total_tokens"] == sum(r["token_usage"]["total_tokens"] for r in rows)


def test_dash_o_jsonl_stays_json_lines(tmp_path: Path) -> None:
    out = tmp_path / "results.jsonl"
    result = run_cli("test", AGENT, "-d", str(v1_dataset(tmp_path)), "-o", str(out))
    assert result.exit_code == 0, result.stdout + result.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["type"] for line in lines] == ["row", "row", "row", "summary"]


def test_row_counts_from_1_and_says_so(tmp_path: Path) -> None:
    result = run_cli("test", AGENT, "-d", str(v1_dataset(tmp_path)), "-i", "--row", "0")
    assert_one_clear_error(result, "rows count from 1")


# -- item 3: v1's command lines ------------------------------------------------------------------


async def test_the_v1_dockerfile_line_serves_and_names_todays_spellings(tmp_path: Path) -> None:
    """``osmosis serve -m main:agent_loop -p 9000 --skip-register`` (here with ``--local`` and
    ``--log``): it serves, says each spelling's today's name and the container case, and a
    rollout through it ends in v1's callback, its trace in ``--log``'s session folder."""
    calculator = f"{ASSETS}/v1_calculator.py:agent_loop"
    logs = tmp_path / "logs"
    args = ("-m", calculator, "-p", "0", "--skip-register", "--local", "--log", str(logs))
    with osmosis_serve(tmp_path / "serve.log", *args) as served:
        gate = MockTrainGate(ScriptedBackend([CALCULATE, {"content": "42"}]))
        async with Harness(server_url=served.url, gate=gate) as harness:
            outcome = await harness.run(CALC_QUESTION, rollout_id="docker-1")
        output = served.output()
    for note in ("-p is --port", "--skip-register does nothing", "--local is --no-auth"):
        assert note in output, note
    assert "--log DIR is --debug-dir DIR/<timestamp>" in output
    assert "in a container pass --host 0.0.0.0" in output
    assert "auth          off" in output
    assert outcome.result is not None
    sent = outcome.result.model_dump(mode="json")
    assert sent["status"] == "COMPLETED"
    assert sent["finish_reason"] == "stop"
    assert sent["final_messages"] == [
        *CALC_QUESTION,
        {"role": "assistant", "content": None, "tool_calls": CALCULATE["tool_calls"]},
        {"role": "tool", "content": "42", "tool_call_id": "call_1"},
        {"role": "assistant", "content": "42"},
    ]
    [session] = list(logs.iterdir())
    assert session.name.isdigit()  # v1's int(time.time()) folder
    assert (session / "docker-1.jsonl").is_file()


def test_local_with_an_api_key_is_refused_as_v1_did() -> None:
    result = run_cli("serve", "-m", AGENT, "--local", "--api-key", "k", env=no_llm_env())
    assert_one_clear_error(result, "--local disables API key authentication")


def test_v1_validate_command_line_works() -> None:
    result = run_cli("validate", "-m", AGENT, "-v", env=no_llm_env())
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "-m X is the TARGET argument" in result.stderr
    assert "Valid" in result.stdout


def test_v1_test_command_line_works_quietly(tmp_path: Path) -> None:
    """``osmosis test --agent X -d data.jsonl -q --debug``: runs, prints nothing on stdout."""
    result = run_cli(
        "test", "--agent", AGENT, "-d", str(v1_dataset(tmp_path)), "-q", "--debug",
        env=no_llm_env(),
    )  # fmt: skip
    assert result.exit_code == 0, result.stdout + result.stderr
    assert result.stdout == ""
    assert "-m/--agent X is the TARGET argument" in result.stderr
    assert "--debug is --verbose" in result.stderr


def test_v1_base_url_is_llm_url_with_v1s_model_names(tmp_path: Path) -> None:
    stub = OpenAIStub(default=text("done"))
    with stub.serve() as url:
        result = run_cli(
            "test", "-m", AGENT, "-d", str(v1_dataset(tmp_path)), "--model", "openai/served",
            "--base-url", url, env=no_llm_env(),
        )  # fmt: skip
    assert result.exit_code == 0, result.stdout + result.stderr
    assert {r.body["model"] for r in stub.requests} == {"served"}
    assert "--base-url is --llm-url" in result.stderr


@pytest.mark.parametrize(
    ("command", "hidden"),
    [
        ("serve", ("-p", "-H", "--skip-register", "--local", "--log ")),
        ("test", ("--agent", "--base-url", "--quiet", "--debug ")),
        ("validate", ("--module",)),
    ],
)
def test_legacy_spellings_stay_out_of_help(command: str, hidden: tuple[str, ...]) -> None:
    result = run_cli(command, "--help", env={"COLUMNS": "200"})
    for option in hidden:
        assert f" {option}" not in result.stdout, option


def test_a_v1_option_given_twice_is_one_clear_error() -> None:
    result = run_cli("serve", AGENT, "-p", "9000", "--port", "9001", env=no_llm_env())
    assert_one_clear_error(result, "--port is given twice")


# -- item 4: v1's test-mode Python API -----------------------------------------------------------


async def test_the_v1_programmatic_test_mode_sample_prints_passed_3_of_3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """v1's "Programmatic Usage" sample, imports changed, against an OpenAI-compatible stub
    named by OPENAI_BASE_URL: each row is a real rollout, the output is v1's."""
    from osmosis_rollout.compat import DatasetReader, ExternalLLMClient, LocalTestRunner

    calculator = load_asset("v1_calculator")
    args = {"operation": "add", "a": 1, "b": 2}
    stub = OpenAIStub([tool_call("calculate", args), text("3")], default=text("done"))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.chdir(tmp_path)
    with stub.serve() as url:
        monkeypatch.setenv("OPENAI_BASE_URL", url)

        # --- v1's sample, as written ---
        reader = DatasetReader(str(v1_dataset(tmp_path)))
        rows = reader.read(limit=10)
        client = ExternalLLMClient("gpt-4o")
        runner = LocalTestRunner(agent_loop=calculator.CalculatorAgent(), llm_client=client)
        async with client:
            results = await runner.run_batch(
                rows=rows, max_turns=10, completion_params={"temperature": 0.7}
            )
        print(f"Passed: {results.passed}/{results.total}")
        print(f"Total tokens: {results.total_tokens}")
        # --- end of the sample ---

    out = capsys.readouterr().out
    assert "Passed: 3/3" in out
    assert f"Total tokens: {results.total_tokens}" in out
    assert results.total_tokens > 0
    assert {r.body["model"] for r in stub.requests} == {"gpt-4o"}
    assert {r.body["temperature"] for r in stub.requests} == {0.7}
    assert stub.requests[0].body["tools"][0]["function"]["name"] == "calculate"
    first = results.results[0]
    assert (first.row_index, first.success, first.error) == (0, True, None)
    assert first.result is not None
    assert first.result.status == "COMPLETED"
    assert first.result.final_messages[3] == {
        "role": "tool",
        "content": "3",
        "tool_call_id": "call_1",
    }
    assert first.token_usage["num_llm_calls"] == 2
    assert rows[0] == V1_ROWS[0]
    assert len(reader) == 3
    assert os.listdir(tmp_path) == ["data.jsonl"]  # the working directory: nothing written


async def test_run_single_and_on_progress_keep_v1s_signatures(tmp_path: Path) -> None:
    """``run_single(row, row_index=...)``, and ``on_progress(done, total, result)`` in order;
    the client is any LLM backend (here the offline scripted one)."""
    from osmosis_rollout.compat import DatasetReader, LocalTestRunner

    rows = DatasetReader(v1_dataset(tmp_path)).read(offset=1)
    runner = LocalTestRunner(agent_loop=ContentReader(), llm_client=ScriptedBackend([]))
    seen: list[tuple[int, int, int]] = []
    batch = await runner.run_batch(
        rows, on_progress=lambda i, n, r: seen.append((i, n, r.row_index)), start_index=1
    )
    assert seen == [(1, 2, 1), (2, 2, 2)]
    assert (batch.total, batch.passed, batch.failed) == (2, 2, 0)
    single = await runner.run_single(rows[0], row_index=5)
    assert single.row_index == 5
    assert single.success


def test_external_llm_client_without_a_key_says_how_to_give_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from osmosis_rollout.compat import ExternalLLMClient

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        ExternalLLMClient("gpt-4o")


# -- item 5: v1's settings -----------------------------------------------------------------------


class OneAtATime(RolloutAgentLoop):
    """Counts how many of its rollouts run at once."""

    name = "one_at_a_time"
    running = 0
    most = 0

    def get_tools(self, request: RolloutRequest) -> list[Any]:
        return []

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        cls = type(self)
        cls.running += 1
        cls.most = max(cls.most, cls.running)
        try:
            await anyio.sleep(0.1)
        finally:
            cls.running -= 1
        return ctx.complete(list(ctx.request.messages))


async def test_v1s_max_concurrent_rollouts_variable_is_honoured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``OSMOSIS_ROLLOUT_SERVER_MAX_CONCURRENT_ROLLOUTS=1`` and v1's ``create_app(agent)``: three
    rollouts run one after another, as in v1."""
    monkeypatch.setenv("OSMOSIS_ROLLOUT_SERVER_MAX_CONCURRENT_ROLLOUTS", "1")
    app = create_app(OneAtATime())
    gate = MockTrainGate(ScriptedBackend([]))
    outcomes = []

    async def one(harness: Harness, n: int) -> None:
        outcomes.append(await harness.run(QUESTION, rollout_id=f"one-{n}"))

    with serve_in_thread(app, lifespan="on") as url:
        async with Harness(server_url=url, gate=gate) as harness, anyio.create_task_group() as tg:
            for n in range(3):
                tg.start_soon(one, harness, n)
    assert [o.result.status for o in outcomes if o.result] == ["COMPLETED"] * 3
    assert OneAtATime.most == 1


def test_dot_env_is_read_as_v1_read_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``.env`` in the working directory, under the environment (which wins)."""
    (tmp_path / ".env").write_text(
        "OSMOSIS_ROLLOUT_SERVER_RECORD_TTL_SECONDS=120\n"
        "OSMOSIS_ROLLOUT_SERVER_MAX_CONCURRENT_ROLLOUTS=5\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OSMOSIS_ROLLOUT_SERVER_MAX_CONCURRENT_ROLLOUTS", "7")
    settings = create_app(OneAtATime()).state.rollout_server.settings
    assert (settings.record_ttl_s, settings.max_concurrent) == (120.0, 7)


def test_osmosis_serve_honours_v1_variables_and_names_the_ignored(tmp_path: Path) -> None:
    env = clean_env(
        OSMOSIS_ROLLOUT_SERVER_MAX_CONCURRENT_ROLLOUTS="1",
        OSMOSIS_ROLLOUT_SERVER_CLEANUP_INTERVAL_SECONDS="5",
        OSMOSIS_ROLLOUT_CLIENT_MAX_RETRIES="5",
    )
    with osmosis_serve(tmp_path / "serve.log", AGENT, "--port", "0", env=env) as served:
        output = served.output()
    assert "limits        1 concurrent" in output
    assert "OSMOSIS_ROLLOUT_SERVER_MAX_CONCURRENT_ROLLOUTS (legacy) is read as max_concurrent" in (
        output
    )
    for name in ("SERVER_CLEANUP_INTERVAL_SECONDS", "CLIENT_MAX_RETRIES"):
        assert f"OSMOSIS_ROLLOUT_{name}" in output, name
    assert output.count("is set but has no effect") == 2


def test_a_bad_v1_value_names_its_variable() -> None:
    result = run_cli("serve", AGENT, env={"OSMOSIS_ROLLOUT_SERVER_MAX_CONCURRENT_ROLLOUTS": "many"})
    assert_one_clear_error(result, "OSMOSIS_ROLLOUT_SERVER_MAX_CONCURRENT_ROLLOUTS='many'")


def test_osmosis_llm_client_reads_v1s_client_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OSMOSIS_ROLLOUT_CLIENT_TIMEOUT_SECONDS", "12")
    monkeypatch.setenv("OSMOSIS_ROLLOUT_CLIENT_MAX_RETRIES", "5")
    client = OsmosisLLMClient("http://127.0.0.1:1", "r-1")
    assert (client.timeout_seconds, client.max_retries) == (12.0, 5)
    assert OsmosisLLMClient("http://127.0.0.1:1", "r-1", max_retries=1).max_retries == 1


# -- item 6: the app type ------------------------------------------------------------------------


def v1_deployment_app() -> Any:
    """v1's deployment guide: ``create_app`` and its health-check routes, imports changed."""
    calculator = load_asset("v1_calculator")
    agent_loop = calculator.agent_loop
    app = create_app(agent_loop)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "healthy", "agent_loop": agent_loop.name}

    @app.get("/ready")
    async def ready() -> dict[str, Any]:
        # Add any readiness checks here
        return {"ready": True}

    @app.get("/items/{item}")
    def item(item: str, request: Request) -> dict[str, Any]:
        return {"item": item, "q": request.query_params.get("q")}

    return app


def test_v1s_custom_routes_work_on_the_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    app = v1_deployment_app()
    assert app.title == "Osmosis RolloutServer (calculator)"
    with TestClient(app) as client:
        assert client.get("/ready").json() == {"ready": True}
        assert client.get("/items/7?q=x").json() == {"item": "7", "q": "x"}
        health = client.get("/health").json()  # the server's own /health comes first, as in v1
        assert health["status"] == "healthy"
        assert "active_rollouts" in health


def test_v1s_test_client_sample_tears_down_at_once_and_writes_nothing_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """v1's "Example Test Using FastAPI TestClient", with the documented one-line fix
    (``starlette.testclient``): the rollout it starts cannot reach its TrainGate, so shutdown
    cancels it and its one ERROR result goes to the outbox in the user's state directory, not
    into the working directory."""
    work, state = tmp_path / "project", tmp_path / "state"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    app = create_app(load_asset("v1_calculator").CalculatorAgent())
    with TestClient(app) as client:
        response = client.get("/health")
        assert response.status_code == 200
        assert response.json()["status"] == "healthy"
        response = client.post(
            "/v1/rollout/init",
            json={
                "rollout_id": "test-123",
                "server_url": "http://localhost:8080",
                "messages": [{"role": "user", "content": "Hello"}],
                "completion_params": {"temperature": 0.7},
            },
        )
        assert response.status_code == 202
        data = response.json()
        assert "tools" in data
    assert os.listdir(work) == []
    [entry] = list((state / "osmosis-rollout" / "outbox").iterdir())
    kept = json.loads(entry.read_text())
    assert kept["response"]["rollout_id"] == "test-123"
    assert kept["response"]["status"] == "ERROR"


# -- item 7: the smaller differences ---------------------------------------------------------------


class PassesATimeout(RolloutAgentLoop):
    """A v1 agent that passes a keyword TrainGate has no field for, and one it was sent."""

    name = "passes_a_timeout"

    def get_tools(self, request: RolloutRequest) -> list[Any]:
        return []

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = list(ctx.request.messages)
        result = await ctx.chat(messages, request_timeout=30, **ctx.request.completion_params)
        reply = await ctx.llm.chat_completions([*messages, result.message], foo="bar")
        return ctx.complete([*messages, result.message, reply.message])


async def test_unknown_chat_keywords_are_dropped_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with Harness(PassesATimeout(), backend=ScriptedBackend([])) as harness:
        outcome = await harness.run(QUESTION, completion_params={"top_k": 5, "temperature": 0.3})
    assert outcome.result is not None
    assert outcome.result.status == "COMPLETED"
    first, second = (chat.model_dump() for chat in outcome.record.chats)
    assert "request_timeout" not in first
    assert "foo" not in second
    assert (first["temperature"], first["top_k"]) == (0.3, 5)  # what TrainGate asked for stays
    dropped = [r.getMessage() for r in caplog.records if "is not sent to TrainGate" in r.message]
    assert any("'request_timeout'" in line for line in dropped)
    assert any("'foo'" in line for line in dropped)


async def test_osmosis_llm_client_drops_unknown_keywords() -> None:
    gate = MockTrainGate(ScriptedBackend([]))
    with serve_in_thread(gate.app) as url:
        gate.expect("direct-1")
        async with OsmosisLLMClient(url, "direct-1") as client:
            result = await client.chat_completions(QUESTION, foo=1, max_tokens=20)
    assert result.message["role"] == "assistant"
    [chat] = gate.records["direct-1"].chats
    assert "foo" not in chat.model_dump()
    assert chat.max_tokens == 20


@pytest.mark.parametrize(
    "name", ["ValidationError", "validate_and_report", "DEFAULT_HOST", "DEFAULT_PORT"]
)
def test_v1s_all_names_import_from_compat(name: str) -> None:
    """In v1's ``__all__``; the migration page says every v1 name is in osmosis_rollout.compat."""
    import osmosis_rollout.compat as compat

    assert name in compat.__all__
    assert getattr(compat, name) is not None


def test_v1_defaults_and_validate_and_report(capsys: pytest.CaptureFixture[str]) -> None:
    from osmosis_rollout.compat import DEFAULT_HOST, DEFAULT_PORT, validate_and_report

    assert (DEFAULT_HOST, DEFAULT_PORT) == ("0.0.0.0", 9000)
    result = validate_and_report(load_asset("v1_calculator").agent_loop, verbose=True)
    assert result.valid
    assert "Valid" in capsys.readouterr().out


def test_v1s_docker_compose_log_level_is_read(tmp_path: Path) -> None:
    from osmosis_rollout.compat.settings import legacy_settings

    found = legacy_settings({"OSMOSIS_ROLLOUT_LOG_LEVEL": "INFO"}, cwd=tmp_path)
    assert found.values == {"log_level": "info"}
    assert found.ignored == []


def test_the_models_key_with_jobs_names_the_environment(tmp_path: Path) -> None:
    """``--jobs`` workers read OPENAI_API_KEY only: v1's ``--api-key`` there is refused."""
    result = run_cli(
        "test", AGENT, "-d", str(v1_dataset(tmp_path)), "--model", "gpt-4o", "--api-key", "sk-x",
        "--jobs", "2", env=no_llm_env(),
    )  # fmt: skip
    assert_one_clear_error(result, "set OPENAI_API_KEY instead")
    assert "sk-x" not in result.stdout + result.stderr
