"""`osmosis test` from the command line: the quickstart, outputs, exit codes, other backends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from typer.testing import CliRunner

from osmosis_rollout.cli import app

from .support import free_port, serve_in_thread

ROOT = Path(__file__).resolve().parent.parent
CALCULATOR = f"{ROOT}/examples/calculator/agent.py:CalculatorAgent"
DATASET = str(ROOT / "examples/calculator/dataset.jsonl")
BAD = f"{ROOT}/tests/assets/bad_agents.py"

runner = CliRunner()


def invoke(*args: str, env: dict[str, str] | None = None) -> Any:
    return runner.invoke(app, ["test", *args], env=env)


def test_quickstart_example_passes_offline() -> None:
    """The README's main job: every calculator row passes, with a table and a summary."""
    result = invoke(CALCULATOR, "--dataset", DATASET)
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "Rollouts" in result.stdout
    assert "10/10" in result.stdout
    assert "rollouts" in result.stderr  # the progress bar lives on stderr


def test_output_file_and_json_summary(tmp_path: Path) -> None:
    """--output keeps one object per row plus a summary; --json prints only JSON on stdout."""
    out = tmp_path / "results.jsonl"
    result = invoke(CALCULATOR, "-d", DATASET, "--limit", "3", "-o", str(out), "--json")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["passed"] == 3
    assert summary["rows"] == 3
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["type"] for line in lines] == ["row", "row", "row", "summary"]
    assert sorted(line["row"] for line in lines[:3]) == [1, 2, 3]
    assert lines[0]["final_messages"][0]["role"] == "system"
    assert lines[0]["metrics"]["num_llm_calls"] == 2
    assert "mock-traingate-key" not in out.read_text()


def test_params_reach_each_request(tmp_path: Path) -> None:
    """--max-turns, --temperature and --max-tokens go into every init request."""
    out = tmp_path / "r.jsonl"
    result = invoke(
        f"{BAD}:GoodAgent", "-d", DATASET, "--limit", "1", "--max-tokens", "5", "-o", str(out)
    )
    # the mock LLM honours max_tokens, so the answer is cut, and that is reported, not passed
    assert result.exit_code == 1, result.stderr
    row = json.loads(out.read_text().splitlines()[0])
    assert row["finish_reason"] == "length"
    assert row["turn_finish_reasons"] == ["length"]
    assert [f["code"] for f in row["findings"]] == ["truncated_reply"]
    assert row["response_tokens"] <= 5


def test_findings_make_the_exit_code_1() -> None:
    """A history-rewriting agent fails with its finding named in the report."""
    result = invoke(f"{BAD}:RewritesHistoryAgent", "-d", DATASET, "--limit", "2")
    assert result.exit_code == 1
    assert "history_rewritten" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-d", DATASET], "missing TARGET"),
        ([CALCULATOR], "--dataset is required"),
        ([CALCULATOR, "-d", "nope.jsonl"], "nope.jsonl"),
        ([CALCULATOR, "-d", DATASET, "--llm", "gpt"], "unknown --llm"),
        (["no_such_file.py:Agent", "-d", DATASET], "no_such_file.py"),
        ([CALCULATOR, "--server", "http://127.0.0.1:1", "-d", DATASET], "not both"),
        (["--server", "http://127.0.0.1:1", "-d", DATASET], "cannot reach the rollout server"),
    ],
)
def test_usage_errors_exit_2_with_one_clear_line(args: list[str], message: str) -> None:
    """Usage mistakes exit 2 with a message on stderr and no traceback."""
    result = invoke(*args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_openai_without_a_key_or_url_is_a_usage_error() -> None:
    """--llm openai with neither OPENAI_API_KEY nor a URL fails at once, before any row."""
    result = invoke(
        CALCULATOR,
        "-d",
        DATASET,
        "--llm",
        "openai",
        "--model",
        "m",
        env={"OPENAI_API_KEY": None, "OPENAI_BASE_URL": None},  # type: ignore[dict-item]
    )
    assert result.exit_code == 2
    assert "OPENAI_API_KEY" in result.stderr


def test_malformed_dataset_names_row_and_column(tmp_path: Path) -> None:
    """A bad row stops the run before it starts, naming the row and the column."""
    bad = tmp_path / "rows.jsonl"
    bad.write_text('{"user_prompt": "hi"}\n{"user_prompt": 3}\n')
    result = invoke(CALCULATOR, "-d", str(bad))
    assert result.exit_code == 2
    assert "row 2" in result.stderr
    assert "user_prompt" in result.stderr


@pytest.fixture
def running_server(tmp_path: Path) -> Iterator[str]:
    """`osmosis serve` on the calculator example, as a real process on 127.0.0.1."""
    port = free_port()
    log = tmp_path / "server.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "osmosis_rollout",
                "serve",
                CALCULATOR,
                "--port",
                str(port),
                "--no-validate",
                "--log-level",
                "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=sink,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx2.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx2.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start: {log.read_text()}")
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.mark.slow
def test_against_a_running_server(running_server: str) -> None:
    """--server drives a real uvicorn; the mock TrainGate listens on 127.0.0.1 for callbacks."""
    result = invoke("--server", running_server, "-d", DATASET, "--limit", "4", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["passed"] == 4


class StubLLM:
    """An OpenAI-style /v1/chat/completions that answers with a fixed status or a reply."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.bodies: list[dict[str, Any]] = []

    async def completions(self, request: Request) -> JSONResponse:
        self.bodies.append(await request.json())
        if self.status != 200:
            return JSONResponse({"error": {"message": "bad key sk-live-123"}}, self.status)
        return JSONResponse(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": "42"},
                    }
                ],
                "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10},
            }
        )


def stub_app(stub: StubLLM) -> Starlette:
    return Starlette(routes=[Route("/v1/chat/completions", stub.completions, methods=["POST"])])


@pytest.mark.slow
def test_openai_compatible_backend_forwards_tools() -> None:
    """--llm-url sends the agent's tools to the model server and uses its replies."""
    stub = StubLLM()
    with serve_in_thread(stub_app(stub)) as url:
        result = invoke(
            CALCULATOR,
            "-d",
            DATASET,
            "--limit",
            "5",
            "--llm-url",
            f"{url}/v1",
            "--model",
            "m",
            "--json",
        )
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["passed"] == 5
    assert summary["mean_reward"] == 0.8  # "42" is right for rows 1-4, wrong for row 5
    names = {t["function"]["name"] for t in stub.bodies[0]["tools"]}
    assert names == {"add", "subtract", "multiply", "divide"}


@pytest.mark.slow
def test_auth_failure_stops_the_batch_early() -> None:
    """A rejected API key stops the batch: later rows are skipped, the key is never shown."""
    stub = StubLLM(status=401)
    with serve_in_thread(stub_app(stub)) as url:
        result = invoke(
            CALCULATOR,
            "-d",
            DATASET,
            "--llm-url",
            f"{url}/v1",
            "--model",
            "m",
            "--concurrency",
            "1",
            "--json",
            env={"OPENAI_API_KEY": "sk-live-123"},
        )
    assert result.exit_code == 1
    summary = json.loads(result.stdout)
    assert summary["skipped"] >= 8
    assert "auth" in summary["stopped_early"]
    assert len(stub.bodies) <= 2
    assert "sk-live-123" not in result.stdout + result.stderr


def test_agent_tracebacks_only_with_verbose() -> None:
    """Failing rows are reported in the table; agents' tracebacks appear only with --verbose."""
    agent = f"{ROOT}/tests/assets/rev_agents.py:OpaqueMessageAgent"
    quiet = invoke(agent, "-d", DATASET, "--limit", "1")
    loud = invoke(agent, "-d", DATASET, "--limit", "1", "--verbose")
    assert quiet.exit_code == loud.exit_code == 1
    assert "Traceback" not in quiet.stderr
    assert "--verbose" in quiet.stderr
    assert "Traceback" in loud.stderr


_FILE_AGENT = '''
import os

from osmosis_rollout import RolloutAgentLoop, Toolbox


class FileAgent(RolloutAgentLoop):
    """Keeps a buffered file open for its whole life; its toolbox holds one of its own methods,
    so the agent is in a reference cycle and only a garbage collection finalizes it."""

    name = "file-agent"

    def __init__(self):
        self.log = open(os.environ["AGENT_LOG"], "w")
        self.toolbox = Toolbox([self.note])

    def note(self, text: str) -> str:
        """Note a text."""
        return text

    def get_tools(self, request):
        return self.toolbox.schemas

    async def run(self, ctx):
        self.log.write(f"ran {ctx.request.rollout_id}\\n")
        result = await ctx.chat(list(ctx.request.messages))
        return ctx.complete([*ctx.request.messages, result.message])
'''


def test_what_an_agent_wrote_to_a_file_it_never_closed_is_there_after_the_command(
    tmp_path: Path,
) -> None:
    """An agent in a reference cycle is finalized at exit and its open file flushed, as Python
    does by default: the command's garbage-collector tuning (no freeze at exit, none of what the
    agent built while setting up) must not change that."""
    (tmp_path / "agent.py").write_text(_FILE_AGENT)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"user_prompt": f"hi {i}"}) + "\n" for i in range(3)))
    log = tmp_path / "agent.log"
    done = subprocess.run(
        [str(Path(sys.executable).parent / "osmosis"), "test", "agent.py:FileAgent", "-d",
         str(rows)],
        cwd=tmp_path, env={**os.environ, "AGENT_LOG": str(log)},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert log.read_text().count("ran ") == 3


# -- --jobs, parsed once ---------------------------------------------------------------------------


def test_jobs_auto_on_one_cpu_is_one_process_so_record_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--jobs auto`` on a one-CPU machine means one process, so ``--record`` is not refused
    (it was: the check compared the text "auto" with "1")."""
    monkeypatch.setattr("osmosis_rollout.evaluation.parallel.cpu_count", lambda: 1)
    cassette = tmp_path / "cassette.jsonl"
    result = invoke(
        CALCULATOR, "-d", DATASET, "--limit", "2", "--jobs", "auto", "--record", str(cassette)
    )
    assert result.exit_code == 0, result.stderr
    assert "cassette of 2 row(s) written" in result.stderr
    assert cassette.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--record", "CASSETTE"], "cassette of 2 row(s) written"),
        (["-i", "--row", "99"], "--row 99 is not in the dataset rows loaded (1-2)"),
    ],
    ids=["record", "interactive"],
)
def test_jobs_01_is_one_process_like_jobs_1(tmp_path: Path, args: list[str], message: str) -> None:
    """``--jobs 01`` is the number 1: not refused with ``--record`` or ``--interactive`` (the
    check compared it with the text "1")."""
    args = [str(tmp_path / "c.jsonl") if a == "CASSETTE" else a for a in args]
    result = invoke(CALCULATOR, "-d", DATASET, "--limit", "2", "--jobs", "01", *args)
    assert "--jobs" not in result.stderr, result.stderr
    assert message in result.stderr
