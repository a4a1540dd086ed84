"""``OpenAICompatibleBackend`` against what llama.cpp's real server sent (``engine_stub``'s
recorded bodies): errors a retry cannot change, its slots, its timings, its replies."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx2
import pytest
from typer.testing import CliRunner

from osmosis_rollout.cli import app
from osmosis_rollout.errors import LLMBackendError
from osmosis_rollout.evaluation import RunObserver, TestOptions, TestReport, run_test
from osmosis_rollout.protocol import CompletionsRequest
from osmosis_rollout.testing import Harness, OpenAICompatibleBackend, RolloutRecord

from .engine_stub import RECORDED, EngineStub, recorded, recorded_error
from .openai_stub import OpenAIStub, error, slow, text
from .support import load_asset

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
ASSETS = ROOT / "tests" / "assets"
CALCULATOR = f"{ROOT}/examples/calculator/agent.py:CalculatorAgent"
HISTORY = load_asset("fnd_history")
QUESTION = [{"role": "user", "content": "What is 12 + 30?"}]
TAGGED_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
KINDS = ["needs_jinja", "context_length", "unparsable_reply"]


def backend_for(stub: OpenAIStub, sleeps: list[float] | None = None) -> OpenAICompatibleBackend:
    """A backend reaching ``stub`` in-process, its backoff sleeps noted in ``sleeps``."""

    async def sleep(seconds: float) -> None:
        if sleeps is not None:
            sleeps.append(seconds)

    http = httpx2.AsyncClient(transport=stub.transport())
    return OpenAICompatibleBackend("http://stub.test/v1", "qwen", http=http, sleep=sleep)


class Notes(RunObserver):
    """Keeps what the run says as it goes."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, message: str) -> None:
        self.lines.append(message)


def dataset(tmp_path: Path, rows: int) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"messages": QUESTION}) + "\n" for _ in range(rows)))
    return path


def run(options: TestOptions) -> tuple[TestReport, Notes]:
    notes = Notes()
    return asyncio.run(run_test(options, notes)), notes


# -- 4. errors that a retry cannot change -------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_a_deterministic_server_error_fails_at_once(kind: str) -> None:
    """The three HTTP 500 bodies llama.cpp sends for what will not change: one request, no
    backoff, the server's words and its kind; only a missing --jinja fails every row."""
    stub = OpenAIStub([recorded_error(kind)])
    sleeps: list[float] = []
    async with backend_for(stub, sleeps) as backend:
        with pytest.raises(LLMBackendError) as info:
            await backend.complete(
                CompletionsRequest(rollout_id="r", messages=QUESTION), RolloutRecord("r")
            )
    assert len(stub.bodies) == 1
    assert sleeps == []
    exc = info.value
    assert (exc.kind, exc.systemic, exc.status_code) == (kind, kind == "needs_jinja", 500)
    assert RECORDED["errors"][kind]["body"]["error"]["message"] in str(exc)


async def test_a_transient_server_error_is_still_retried() -> None:
    """A 500 that names nothing lasting (an overloaded slot) is retried with backoff."""
    stub = OpenAIStub([error(500, "slot unavailable"), error(503, "loading model"), text("42")])
    sleeps: list[float] = []
    async with backend_for(stub, sleeps) as backend:
        reply = await backend.complete(
            CompletionsRequest(rollout_id="r", messages=QUESTION), RolloutRecord("r")
        )
    assert reply.message.content == "42"
    assert len(sleeps) == 2


def test_a_full_context_fails_each_row_once_and_is_explained_once(tmp_path: Path) -> None:
    """Every row hits `Context size has been exceeded.`: one request per row, each row an
    ERROR counted under llm_errors, and the advice (-c, --parallel, --max-tokens) said once."""
    stub = OpenAIStub(default=recorded_error("context_length"))
    rows = dataset(tmp_path, 3)
    with stub.serve() as url:
        options = TestOptions(target=CALCULATOR, dataset=rows, llm_url=url, model="qwen")
        report, _ = run(options)
        args = ["test", CALCULATOR, "-d", str(rows), "--llm-url", url, "--model", "qwen"]
        result = CliRunner().invoke(app, args)
    assert len(stub.bodies) == 6  # three rows, twice: one request each
    assert [row.status for row in report.rows] == ["ERROR"] * 3
    assert [row.llm_error for row in report.rows] == ["context_length"] * 3
    assert report.summary["llm_errors"] == {"context_length": 3}
    (hint,) = [line for line in report.model_lines if "context_length" in line]
    assert "3 row(s) failed with context_length (not retried)" in hint
    assert "raise llama-server's -c" in hint
    assert result.exit_code == 1
    assert result.stderr.count("raise llama-server's -c") == 1, result.stderr


def test_a_server_without_jinja_stops_the_run_with_one_message(tmp_path: Path) -> None:
    """`tools param requires --jinja flag` is the server's configuration: every row would
    fail, so the batch stops at the first and says to restart with --jinja."""
    stub = OpenAIStub(default=recorded_error("needs_jinja"))
    with stub.serve() as url:
        options = TestOptions(
            target=CALCULATOR, dataset=dataset(tmp_path, 6), llm_url=url, model="q", concurrency=1
        )
        report, _ = run(options)
    assert len(stub.bodies) == 1
    assert report.summary["skipped"] == 5
    assert "needs_jinja" in report.summary["stopped_early"]
    assert any("restart llama-server with --jinja" in line for line in report.model_lines)


# -- 5. concurrency from the server's slots -----------------------------------------------------


@pytest.mark.slow
def test_concurrency_follows_the_slots_llama_cpp_reports(tmp_path: Path) -> None:
    """/props says 2 slots: 2 rollouts at once, not 8, and the run says why."""
    stub = EngineStub("llamacpp", [], slots=2)
    stub.script = [slow(0.2, text("42")) for _ in range(6)]
    with stub.serve() as url:
        options = TestOptions(
            target=CALCULATOR, dataset=dataset(tmp_path, 6), llm_url=url, model="q"
        )
        report, notes = run(options)
    assert report.max_in_flight == 2
    assert report.summary["concurrency"] == {"rollouts": 2, "from": "server", "server_slots": 2}
    assert any("concurrency 2: llama.cpp reports 2 slot(s)" in line for line in notes.lines)
    assert any(r.path == "/props" for r in stub.requests)


@pytest.mark.slow
def test_concurrency_given_overrides_the_slots_and_is_told_it_queues(tmp_path: Path) -> None:
    """--concurrency 4 against 2 slots: 4 at once, and a note that the rest wait."""
    stub = EngineStub("llamacpp", [], slots=2)
    stub.script = [slow(0.2, text("42")) for _ in range(4)]
    with stub.serve() as url:
        options = TestOptions(
            target=CALCULATOR, dataset=dataset(tmp_path, 4), llm_url=url, model="q", concurrency=4
        )
        report, notes = run(options)
    assert report.max_in_flight == 4
    assert report.summary["concurrency"]["from"] == "option"
    assert any("against 2 slot(s) of llama.cpp" in line for line in notes.lines)


def test_a_server_that_reports_no_slots_keeps_the_default(tmp_path: Path) -> None:
    """No /props (vLLM, OpenAI): 8 at once, and a line saying the server did not tell."""
    stub = OpenAIStub(default=text("42"))
    with stub.serve() as url:
        options = TestOptions(
            target=CALCULATOR, dataset=dataset(tmp_path, 1), llm_url=url, model="q"
        )
        report, notes = run(options)
    assert report.summary["concurrency"] == {"rollouts": 8, "from": "default", "server_slots": None}
    assert any("does not report how many requests it serves" in line for line in notes.lines)


# -- 6 and 7. where the time goes; the sampling in use ------------------------------------------


def test_the_engine_timings_split_each_turn_into_model_and_toolkit_time(tmp_path: Path) -> None:
    """llama.cpp's `timings` (prompt_ms + predicted_ms) are the model's time; the rest of the
    request is the server's and HTTP's; what the agent waited beyond that is the toolkit's."""
    stub = EngineStub("llamacpp", [TAGGED_CALL, "The sum is 3."])
    agent = f"{ASSETS}/fnd_history.py:ToolAppendOnlyAgent"
    with stub.serve() as url:
        options = TestOptions(target=agent, dataset=dataset(tmp_path, 2), llm_url=url, model="q")
        report, _ = run(options)
    split = report.summary["time_per_turn_ms"]
    assert split["turns_timed"] == 4
    assert split["model"] > 0
    assert split["server_and_http"] >= 0
    assert split["toolkit"] is not None
    assert split["toolkit"] >= 0
    assert any(
        line.startswith("time per turn (median of 4): model ") for line in report.model_lines
    )


def test_with_jobs_the_split_is_made_from_every_workers_turns(tmp_path: Path) -> None:
    """``--jobs 2``: the turns run in the workers, whose backends time them; each sends its
    times back, so the run still says where a turn's time went."""
    stub = EngineStub("llamacpp", [TAGGED_CALL, "The sum is 3."])
    agent = f"{ASSETS}/fnd_history.py:ToolAppendOnlyAgent"
    with stub.serve() as url:
        options = TestOptions(
            target=agent, dataset=dataset(tmp_path, 2), llm_url=url, model="q", jobs=2
        )
        report, _ = run(options)
    assert report.summary["passed"] == 2, [(r.error_message, r.findings) for r in report.rows]
    split = report.summary["time_per_turn_ms"]
    assert split["turns_timed"] == 4
    assert split["model"] > 0
    assert split["toolkit"] is not None


@pytest.mark.parametrize(
    ("temperature", "said"),
    [
        (
            None,
            "sampling: the server's defaults (temperature 0.8, top_p 0.95, seed random): "
            "replies vary between runs; pass --temperature 0",
        ),
        (0.0, "sampling: temperature 0 (--temperature)"),
    ],
)
def test_the_sampling_in_use_is_said(tmp_path: Path, temperature: float | None, said: str) -> None:
    """Runs vary unless the sampling is greedy: the run says which sampling its turns use."""
    stub = EngineStub("llamacpp", ["The sum is 3."])
    with stub.serve() as url:
        options = TestOptions(
            target=CALCULATOR,
            dataset=dataset(tmp_path, 1),
            llm_url=url,
            model="q",
            temperature=temperature,
        )
        _, notes = run(options)
    assert any(line.startswith(said) for line in notes.lines), notes.lines


# -- 1-3. the replies llama.cpp sent ------------------------------------------------------------


async def test_the_recorded_empty_content_tool_call_rebuilt_with_null_is_no_rewrite() -> None:
    """llama.cpp's `"content": ""` beside a parsed call, rebuilt with `None`: no finding."""
    stub = EngineStub("llamacpp", [])
    stub.script = [recorded("empty_content_tool_call"), text("42")]
    assert RECORDED["empty_content_tool_call"]["choices"][0]["message"]["content"] == ""
    backend = backend_for(stub)
    async with backend, Harness(HISTORY.NullContentToolReplyAgent(), backend=backend) as harness:
        outcome = await harness.run(QUESTION, timeout_s=10)
    assert outcome.findings == []
    # Null fields are left out on the wire (docs/protocol.md): absent is the agent's null.
    assert stub.bodies[1]["messages"][1].get("content") is None
    assert stub.bodies[1]["messages"][1]["tool_calls"]


async def test_the_recorded_bare_json_call_says_the_template_expects_tags() -> None:
    """The model wrote bare JSON with --jinja on; /props shows a template with <tool_call>
    tags: the advice is the template, not the parser flag."""
    stub = EngineStub("llamacpp", [])
    stub.script = [recorded("bare_json_call"), text("42")]
    agent = load_calculator()
    async with backend_for(stub) as backend:
        await backend.probe()
        async with Harness(agent, backend=backend) as harness:
            outcome = await harness.run(QUESTION, timeout_s=10)
    (finding,) = outcome.findings
    assert finding.code == "tool_call_in_text"
    assert (
        "call to tool 'multiply' as text (a JSON object) instead of tool_calls" in finding.message
    )
    assert "without the <tool_call> tags its chat template expects" in finding.message
    assert "--chat-template-file" in finding.message
    assert "--jinja" not in finding.message


async def test_the_recorded_broken_call_is_a_finding_that_says_what_is_broken() -> None:
    """`"b": 4 + 5` is no JSON: once PASS with reward 0, now a finding naming the problem."""
    stub = EngineStub("llamacpp", [])
    stub.script = [recorded("broken_json_call"), text("13")]
    backend = backend_for(stub)
    async with backend, Harness(load_calculator(), backend=backend) as harness:
        outcome = await harness.run(QUESTION, timeout_s=10)
    (finding,) = outcome.findings
    assert "call to tool 'add' as text (a JSON object) whose JSON is broken" in finding.message
    assert "Expecting ',' delimiter" in finding.message
    assert "before '+ 5}}'" in finding.message


def load_calculator() -> Any:
    from osmosis_rollout.loader import load_agent

    return load_agent(CALCULATOR)


def test_seed_is_sent_to_a_real_server_one_per_row_and_sample(tmp_path: Path) -> None:
    """``--seed`` reaches the model server as each request's ``seed``: the same for every turn
    of a rollout, different for each row and sample, the same again on a rerun; without
    ``--seed`` none is sent (the server samples as it is set to)."""
    stub = OpenAIStub(default=text("42"))
    rows = dataset(tmp_path, 2)
    with stub.serve() as url:
        base = {"target": CALCULATOR, "dataset": rows, "llm_url": url, "model": "q"}
        run(TestOptions(**base, seed=7, samples=2))
        first = [body["seed"] for body in stub.bodies]
        run(TestOptions(**base, seed=7, samples=2))
        again = [body["seed"] for body in stub.bodies[len(first) :]]
        run(TestOptions(**base))
        unseeded = stub.bodies[2 * len(first) :]
    assert len(first) == 4  # two rows, two samples, one turn each
    assert len(set(first)) == 4
    assert sorted(again) == sorted(first)
    assert all(0 <= seed < 2**31 for seed in first)
    assert unseeded
    assert all("seed" not in body for body in unseeded)
