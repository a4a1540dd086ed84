"""`--token-check` against stand-ins for vLLM and llama.cpp with a real tokenizer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2
import pytest
from typer.testing import CliRunner

from osmosis_rollout.cli import app
from osmosis_rollout.evaluation.runner import RowInput, RowResult, RunOptions, run_batch
from osmosis_rollout.evaluation.token_check import (
    TokenCheckBackend,
    TokenCheckUnavailable,
    detect_engine,
)
from osmosis_rollout.testing import Harness, OpenAICompatibleBackend

from .engine_stub import EngineStub
from .openai_stub import OpenAIStub
from .support import load_asset

pytestmark = pytest.mark.anyio

ENGINES = ["vllm", "llamacpp"]
URL = "http://engine.test/v1"
QUESTION = [{"role": "user", "content": "What is 1 + 2?"}]
HISTORY = load_asset("fnd_history")
#: What the model writes: a call in the template's own format, then an answer.
TAGGED_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
BARE_CALL = '{"name": "add", "arguments": {"a": 1, "b": 2}}'
ASSETS = Path(__file__).parent / "assets"


async def check(
    stub: EngineStub, agent_name: str, rows: int = 1
) -> tuple[list[RowResult], TokenCheckBackend]:
    """Run ``rows`` rollouts of a fnd_history agent with the token check on, in-process."""
    http = httpx2.AsyncClient(transport=stub.transport(), base_url="http://engine.test")
    inner = OpenAICompatibleBackend(URL, "m", http=http)
    async with http:
        backend = await TokenCheckBackend.connect(inner)
        agent = getattr(HISTORY, agent_name)()
        inputs = [RowInput(i, QUESTION) for i in range(1, rows + 1)]
        async with Harness(agent, backend=backend) as harness:
            report = await run_batch(harness, inputs, RunOptions(timeout_s=10))
    return report.rows, backend


@pytest.mark.parametrize("engine", ENGINES)
async def test_an_agent_that_keeps_the_reply_has_no_drift(engine: str) -> None:
    """The model wrote the call as the template renders it, the agent kept it: no drift."""
    stub = EngineStub(engine, [TAGGED_CALL, "The sum is 3."])
    rows, backend = await check(stub, "ToolAppendOnlyAgent", rows=2)
    assert [row.findings for row in rows] == [[], []]
    assert all(row.passed for row in rows)
    summary = backend.report.as_dict()
    assert summary["engine"] == {"vllm": "vLLM", "llamacpp": "llama.cpp"}[engine]
    assert summary["rollouts_checked"] == 2
    assert summary["turns_compared"] == 2
    assert summary["turns_with_drift"] == 0
    assert summary["turns_skipped"] == 0
    # the check used the engine's own endpoints, and asked for the sampled ids
    paths = {r.path for r in stub.requests}
    expected = {"/tokenize"} | ({"/apply-template"} if engine == "llamacpp" else set())
    assert expected <= paths
    flag = "return_token_ids" if engine == "vllm" else "logprobs"
    assert all(body[flag] is True for body in stub.bodies)


@pytest.mark.parametrize("engine", ENGINES)
async def test_re_serialised_arguments_drift_though_the_messages_are_equivalent(
    engine: str,
) -> None:
    """Compact arguments pass the append-only guard but change the tokens: token_drift."""
    stub = EngineStub(engine, [TAGGED_CALL, "The sum is 3."])
    rows, backend = await check(stub, "CompactsArgumentsAgent")
    (row,) = rows
    assert [f.code for f in row.findings] == ["token_drift"]
    message = row.findings[0].message
    assert "turn 2's prompt differs from turn 1's prompt + sampled tokens at position" in message
    assert "of turn 1's sampled reply" in message
    assert "tool call re-rendered" in message
    # a few tokens on each side, decoded: the model's spaced JSON against the compact one
    sampled, rendered = message.split("the model sampled ")[1].split(" but the template ")
    assert sampled != rendered
    assert "'" in sampled
    summary = backend.report.as_dict()
    assert summary["turns_with_drift"] == 1
    assert summary["rollouts_with_drift"] == 1
    assert summary["causes"] == {"tool call re-rendered": 1}


@pytest.mark.parametrize("engine", ENGINES)
async def test_null_content_where_the_server_sent_empty_is_neither_drift_nor_a_rewrite(
    engine: str,
) -> None:
    """llama.cpp answers a parsed call with `"content": ""`; an agent rebuilding the reply
    with `None` renders the same tokens, and both checks say so."""
    stub = EngineStub(engine, [TAGGED_CALL, "The sum is 3."])
    rows, backend = await check(stub, "NullContentToolReplyAgent")
    assert rows[0].findings == []
    assert backend.report.as_dict()["turns_compared"] == 1
    assert stub.parsed(TAGGED_CALL)["content"] == ("" if engine == "llamacpp" else None)


@pytest.mark.parametrize("engine", ENGINES)
async def test_the_tokens_decide_over_a_difference_the_template_does_not_render(
    engine: str,
) -> None:
    """A changed tool-call id is a different message, but the template renders no ids: the
    prompt's tokens are the same, so TrainGate trains on what the model saw; no finding."""
    stub = EngineStub(engine, [TAGGED_CALL, "The sum is 3."])
    rows, backend = await check(stub, "RenamesCallIdAgent")
    assert rows[0].findings == []
    assert backend.report.as_dict()["turns_with_drift"] == 0


async def test_without_sampled_ids_the_messages_decide() -> None:
    """No token ids to compare: the history check's finding stands."""
    stub = EngineStub("llamacpp", [TAGGED_CALL, "The sum is 3."], returns_ids=False)
    rows, _ = await check(stub, "RenamesCallIdAgent")
    assert [f.code for f in rows[0].findings] == ["history_rewritten"]


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_bare_json_call_re_rendered_in_tags_drifts_for_any_agent(engine: str) -> None:
    """The model sampled `{"`, the template renders `<tool_call>`: drift at the reply's start."""
    stub = EngineStub(engine, [BARE_CALL, "The sum is 3."], parse_bare_json=True)
    rows, _ = await check(stub, "ToolAppendOnlyAgent")
    (finding,) = rows[0].findings
    assert finding.code == "token_drift"
    assert "at token 1 of turn 1's sampled reply" in finding.message
    assert "'{\"'" in finding.message or "'{'" in finding.message
    assert "'<tool_call>'" in finding.message


async def test_single_turn_rollouts_say_why_nothing_was_compared() -> None:
    """`0 turn(s) compared` used to stand alone; when each rollout made one turn, it says so."""
    stub = EngineStub("llamacpp", ["The sum is 3."])
    http = httpx2.AsyncClient(transport=stub.transport(), base_url="http://engine.test")
    async with http:
        backend = await TokenCheckBackend.connect(OpenAICompatibleBackend(URL, "m", http=http))
        agent = load_asset("bad_agents").GoodAgent()
        async with Harness(agent, backend=backend) as harness:
            rows = [RowInput(1, QUESTION), RowInput(2, QUESTION)]
            await run_batch(harness, rows, RunOptions(timeout_s=10))
    lines = "\n".join(backend.report.lines())
    assert "2 rollout(s) checked, 0 turn(s) compared" in lines
    assert "2 (every one of the 2) rollout(s) made a single LLM turn: nothing to compare" in lines


async def test_a_failing_tokenizer_endpoint_skips_the_comparison_not_the_rollout() -> None:
    """The check only observes: a tokenizer error mid-run is counted and shown, rows still pass."""
    stub = EngineStub("vllm", [TAGGED_CALL, "The sum is 3."], tokenize_fails_after=2)
    rows, backend = await check(stub, "CompactsArgumentsAgent")  # the probe, then turn 1
    assert rows[0].status == "COMPLETED"
    assert rows[0].findings == []
    summary = backend.report.as_dict()
    assert (summary["turns_compared"], summary["turns_skipped"]) == (0, 1)
    assert summary["render_errors"] == 1
    lines = "\n".join(backend.report.lines())
    assert "the tokenizer endpoint failed 1 time(s), first: " in lines
    assert "HTTP 500" in lines


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_server_that_returns_no_sampled_ids_is_said_so(engine: str) -> None:
    """Without sampled ids nothing can be compared: counted as skipped, and the summary says
    which request field the engine needs."""
    stub = EngineStub(engine, [TAGGED_CALL, "The sum is 3."], returns_ids=False)
    rows, backend = await check(stub, "CompactsArgumentsAgent")
    assert rows[0].findings == []
    summary = backend.report.as_dict()
    assert (summary["turns_compared"], summary["turns_skipped"]) == (0, 1)
    assert "no sampled token ids" in "\n".join(backend.report.lines())


async def test_a_server_without_tokenizer_endpoints_is_a_clear_error() -> None:
    """Neither vLLM's nor llama.cpp's endpoints: one error naming both and what to do."""
    stub = OpenAIStub()
    async with httpx2.AsyncClient(transport=stub.transport()) as http:
        with pytest.raises(TokenCheckUnavailable) as info:
            await detect_engine(http, URL, "m")
    text = str(info.value)
    assert "vLLM's POST /tokenize" in text
    assert "llama.cpp's POST /apply-template" in text
    assert "HTTP 404" in text
    assert "leave out --token-check" in text


@pytest.mark.slow
def test_cli_token_check_reports_drift_and_summarises(tmp_path: Path) -> None:
    """`osmosis test --llm-url URL --token-check`: the finding per row and a run summary."""
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text(json.dumps({"messages": QUESTION}) + "\n")
    out = tmp_path / "out.jsonl"
    stub = EngineStub("llamacpp", [TAGGED_CALL, "The sum is 3."])
    agent = f"{ASSETS}/fnd_history.py:CompactsArgumentsAgent"
    with stub.serve() as url:
        args = ["test", agent, "-d", str(dataset), "--llm-url", url, "--model", "m"]
        result = CliRunner().invoke(app, [*args, "--token-check", "-o", str(out)])
    assert result.exit_code == 1, result.stdout + result.stderr
    assert "token check (llama.cpp): 1 rollout(s) checked, 1 turn(s) compared, 1 with drift" in (
        result.stderr
    )
    assert "tool call re-rendered" in result.stderr
    row, summary = (json.loads(line) for line in out.read_text().splitlines())
    assert [f["code"] for f in row["findings"]] == ["token_drift"]
    assert summary["token_check"]["turns_with_drift"] == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--token-check"], "--token-check needs a real model"),
        (["--token-check", "--llm-url", "{url}", "--model", "m"], "has neither vLLM"),
    ],
    ids=["mock", "no-endpoints"],
)
def test_cli_token_check_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    """With the mock LLM, or a server without tokenizer endpoints: exit 2 and why."""
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text(json.dumps({"messages": QUESTION}) + "\n")
    agent = f"{ASSETS}/fnd_history.py:ToolAppendOnlyAgent"
    stub = OpenAIStub()
    with stub.serve() as url:
        full: list[Any] = ["test", agent, "-d", str(dataset), *args]
        result = CliRunner().invoke(app, [a.replace("{url}", url) for a in full])
    assert result.exit_code == 2, result.stdout + result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
