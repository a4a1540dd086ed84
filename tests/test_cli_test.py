"""`osmosis test` from the command line: the quickstart, outputs, usage errors and exit codes,
`--server` (with a key), other backends, interrupted runs."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from pydantic import SecretStr
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from typer.testing import CliRunner

from osmosis_rollout.cli import app
from osmosis_rollout.config import ServerSettings
from osmosis_rollout.server import create_app

from .commands import assert_one_clear_error, run_cli, run_cli_text
from .support import CALCULATOR, DATASET, ROOT, free_port, load_asset, serve_in_thread

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
    assert lines[0]["metrics"]["num_llm_calls"] == 5  # one turn per tool (4), then the answer
    assert "mock-traingate-key" not in out.read_text()


@pytest.mark.usefixtures("no_inherited_settings")
def test_piped_tables_have_no_trailing_spaces() -> None:
    code, out, err = run_cli_text("test", CALCULATOR, "-d", DATASET, "--limit", "2")
    assert code == 0, out + err
    assert "Rollouts" in out
    assert [line for line in out.splitlines() if line.endswith(" ")] == []


def test_summary_throughput_is_rounded_for_people() -> None:
    """The summary shows `93.9 rollouts/s over 32 ms`, not `93.903 rollouts/s over 0.032 s`."""
    result = run_cli("test", CALCULATOR, "-d", DATASET, "--limit", "2", env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.stderr
    assert re.search(r"throughput +\d+\.\d rollouts/s over (\d+ ms|\d+\.\d\d s)\b", result.stdout)


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
        (["-d", DATASET], "a server is tested with --launch CMD or --server URL (or --config"),
        ([CALCULATOR], "--dataset is required"),
        ([CALCULATOR, "-d", "nope.jsonl"], "nope.jsonl"),
        ([CALCULATOR, "-d", DATASET, "--llm", "gpt"], "unknown --llm"),
        (["no_such_file.py:Agent", "-d", DATASET], "no_such_file.py"),
        ([CALCULATOR, "--server", "http://127.0.0.1:1", "-d", DATASET], "not both"),
        (["--server", "http://127.0.0.1:1", "-d", DATASET], "cannot reach the rollout server"),
        ([CALCULATOR, "-d", DATASET, "--protocol", "v3"], "--protocol 'v3': choose v1 or v2"),
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


@pytest.mark.parametrize("url", ["notaurl", "localhost:9000", "ftp://host", "http://"])
def test_server_url_typo_is_a_usage_error(url: str) -> None:
    """A --server value that is not an http(s) URL with a host exits 2 with an example URL."""
    result = run_cli("test", "--server", url, "-d", DATASET)
    assert_one_clear_error(result, "is not an http:// or https:// URL with a host")
    assert "http://127.0.0.1:9000" in result.stderr


def test_debug_dir_with_server_keeps_the_mock_traingates_side(tmp_path: Path) -> None:
    """--debug-dir with --server used to be refused (the server runs the rollouts, so there was
    nothing of this process's to trace); the mock TrainGate now writes its side of each
    rollout there, the rows link them, and the closing lines say where they are."""
    agent = load_asset("rev_agents").OpaqueMessageAgent()
    traces, results = tmp_path / "traces", tmp_path / "results.jsonl"
    with serve_in_thread(create_app(agent), lifespan="on") as url:
        args = ["--server", url, "-d", DATASET, "--limit", "2", "--debug-dir", str(traces)]
        result = invoke(*args, "-o", str(results))
    closing = " ".join(result.stderr.split())
    assert f"traces written to {traces} (the mock TrainGate's side of each rollout)" in closing
    rows = [json.loads(line) for line in results.read_text().splitlines()[:2]]
    assert sorted(p.name for p in traces.iterdir()) == sorted(
        f"{row['rollout_id']}.jsonl" for row in rows
    )
    assert all(row["trace"] == f"traces/{row['rollout_id']}.jsonl" for row in rows)


@pytest.mark.parametrize("mode", [[CALCULATOR], ["--server", "http://127.0.0.1:9"]])
def test_debug_dir_on_a_file_is_a_usage_error(mode: list[str], tmp_path: Path) -> None:
    """A --debug-dir that is a file used to end the run in a FileExistsError traceback."""
    taken = tmp_path / "traces"
    taken.write_text("not a folder")
    result = run_cli("test", *mode, "-d", DATASET, "--debug-dir", str(taken))
    assert_one_clear_error(result, "a file is there; give a folder")


def test_row_without_interactive_is_refused_with_the_batch_equivalent() -> None:
    """--row is an --interactive flag; in a batch it used to be ignored and every row ran."""
    result = run_cli("test", CALCULATOR, "-d", DATASET, "--row", "3")
    assert_one_clear_error(result, "--row works only with --interactive")
    assert "--offset 2 --limit 1" in result.stderr


@pytest.mark.parametrize("flag", [["--json"], ["--output", "out.jsonl"]])
def test_interactive_refuses_batch_only_outputs(flag: list[str], tmp_path: Path) -> None:
    """--json and --output write batch results; with --interactive they would do nothing."""
    with contextlib.chdir(tmp_path):
        result = run_cli("test", CALCULATOR, "-d", DATASET, "-i", *flag)
    assert_one_clear_error(result, f"{flag[0]} works only in batch mode")
    assert not (tmp_path / "out.jsonl").exists()


def test_interactive_row_beyond_the_dataset_exits_2() -> None:
    """--interactive --row N past the last row is a usage error, not a session that exits 0."""
    result = run_cli("test", CALCULATOR, "-d", DATASET, "-i", "--row", "99")
    assert_one_clear_error(result, "--row 99 is not in the dataset rows loaded (1-10)")


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("rows.json", "", "rows.json has no rows"),
        ("rows.json", "  \n", "rows.json has no rows"),
        ("rows.jsonl", '{"user_prompt": "a"\n', "Expecting ',' delimiter (column 20)"),
        (
            "rows.jsonl",
            '{"messages": [{"role": "user"}]}\n',
            "'messages[0].content': must be a string or a list of content parts, but it is missing",
        ),
        (
            "rows.jsonl",
            '{"messages": [{"content": "hi"}]}\n',
            "'messages[0].role': must be one of assistant, developer, system, tool, user, "
            "but it is missing",
        ),
    ],
)
def test_dataset_messages_say_what_is_wrong(
    name: str, text: str, message: str, tmp_path: Path
) -> None:
    """An empty file has no rows; JSON columns point at the fault; missing keys say missing."""
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    result = run_cli("test", CALCULATOR, "-d", str(path))
    assert_one_clear_error(result, message)


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


@pytest.fixture
def keyed_server() -> Iterator[str]:
    """A rollout server on 127.0.0.1 that requires the key `right-key`."""
    agent = load_asset("tool_agent")
    settings = ServerSettings(api_key=SecretStr("right-key"))
    app_ = create_app(agent.ToolAgent(), settings=settings)
    with serve_in_thread(app_, lifespan="on") as url:
        yield url


@pytest.mark.usefixtures("no_inherited_settings")
@pytest.mark.parametrize(
    ("key_args", "problem"),
    [([], "requires a key and none was given"), (["--api-key", "wrong"], "refused the key given")],
)
def test_a_missing_or_wrong_server_key_stops_before_the_first_row(
    keyed_server: str, key_args: list[str], problem: str
) -> None:
    code, out, err = run_cli_text("test", "--server", keyed_server, "-d", DATASET, *key_args)
    assert code == 2
    assert f"the rollout server at {keyed_server} {problem}" in err
    assert "--api-key KEY or the OSMOSIS_API_KEY environment variable" in err
    assert "REFUSED" not in out + err  # no row was run
    assert "--verbose" not in out + err


@pytest.mark.usefixtures("no_inherited_settings")
def test_the_right_server_key_runs_the_rows(keyed_server: str) -> None:
    code, out, err = run_cli_text(
        "test", "--server", keyed_server, "-d", DATASET, "--limit", "2", "--api-key", "right-key"
    )
    assert "REFUSED" not in out, out + err
    assert code == 0, out + err


@contextlib.contextmanager
def keyed_calculator_server(key: str) -> Iterator[str]:
    """The calculator agent behind a real uvicorn (with its lifespan) that requires ``key``."""
    agent = load_asset("seed_calculator").CalculatorAgent()
    with serve_in_thread(create_app(agent, api_key=key), lifespan="on") as url:
        yield url


def test_server_with_a_key_can_be_tested_with_api_key() -> None:
    """--api-key (or OSMOSIS_API_KEY) lets `test --server` drive a server started with a key."""
    with keyed_calculator_server("s3cret-server-key") as url:
        refused = run_cli("test", "--server", url, "-d", DATASET, "--limit", "1")
        passed = run_cli(
            "test", "--server", url, "-d", DATASET, "--limit", "2", "--api-key", "s3cret-server-key"
        )
        from_env = run_cli(
            "test",
            "--server",
            url,
            "-d",
            DATASET,
            "--limit",
            "1",
            "--json",
            env={"OSMOSIS_API_KEY": "s3cret-server-key"},
        )
    # without the key the run stops before any row, with one usage error naming the fix
    assert refused.exit_code == 2, refused.stdout + refused.stderr
    assert "requires a key and none was given" in refused.stderr
    assert "--api-key KEY or the OSMOSIS_API_KEY" in refused.stderr
    assert passed.exit_code == 0, passed.stdout + passed.stderr
    assert "2/2" in passed.stdout
    assert from_env.exit_code == 0, from_env.stderr
    assert json.loads(from_env.stdout)["passed"] == 1
    for result in (refused, passed, from_env):
        assert "s3cret-server-key" not in result.stdout + result.stderr


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


def test_the_closing_hint_with_server_points_at_both_sides_traces() -> None:
    """With --server the closing hint names both traces: --debug-dir here keeps the mock
    TrainGate's side, and the agent's own steps are the server's `osmosis serve --debug-dir`."""
    agent = load_asset("rev_agents").OpaqueMessageAgent()
    with serve_in_thread(create_app(agent), lifespan="on") as url:
        result = invoke("--server", url, "-d", DATASET, "--limit", "1")
    assert result.exit_code == 1, result.stdout + result.stderr
    hint = " ".join(result.stderr.split())
    assert "Rerun with --verbose to see the agents' tracebacks" in hint
    assert "start the server with `osmosis serve --debug-dir DIR`" in hint
    assert "or --debug-dir DIR to keep the mock TrainGate's side of every rollout" in hint


SLOW_AGENT = """
import anyio
from osmosis_rollout import RolloutAgentLoop


class Slow(RolloutAgentLoop):
    name = "slow"

    def get_tools(self, request):
        return []

    async def run(self, ctx):
        open(f"{MARKS}/{ctx.request.rollout_id}", "w").close()  # the test waits for two
        messages = list(ctx.request.messages)
        result = await ctx.chat(messages)
        messages.append(result.message)
        await anyio.sleep(1.0)
        return ctx.complete(messages)
"""


def _ignore_sigint() -> None:
    """What a shell without job control does to a background job (``cmd &`` in a script)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.usefixtures("no_inherited_settings")
@pytest.mark.parametrize(
    ("signum", "name", "sigint_ignored"),
    [
        pytest.param(signal.SIGTERM, "SIGTERM", False, id="sigterm"),
        pytest.param(signal.SIGINT, "Ctrl-C", False, id="ctrl-c"),
        # `cmd & ...; kill -TERM $!` in a CI script: the job starts with SIGINT ignored.
        pytest.param(signal.SIGTERM, "SIGTERM", True, id="sigterm-background-job"),
    ],
)
def test_an_interrupted_json_run_prints_its_partial_summary(
    tmp_path: Path, signum: int, name: str, sigint_ignored: bool
) -> None:
    """SIGTERM is handled like Ctrl-C; both leave the partial summary on stdout and in -o.
    SIGTERM does so even when SIGINT is ignored, as it is in a script's background job."""
    marks = tmp_path / "marks"
    marks.mkdir()
    (tmp_path / "slow.py").write_text(f"MARKS = {str(marks)!r}\n{SLOW_AGENT}")
    out = tmp_path / "out.jsonl"
    osmosis = Path(sys.executable).parent / "osmosis"
    args = [str(osmosis), "test", f"{tmp_path}/slow.py:Slow", "-d", DATASET]
    args += ["--concurrency", "1", "--json", "-o", str(out)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OSMOSIS_")}
    proc = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=_ignore_sigint if sigint_ignored else None,
    )
    try:
        deadline = time.monotonic() + 60
        while len(list(marks.iterdir())) < 2:  # row 1 finished, row 2 started
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no row finished in 60 s"
            time.sleep(0.05)
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, stderr
    summary = json.loads(stdout)
    assert summary["stopped_early"] == f"interrupted ({name})"
    assert 1 <= summary["rows"] < 10
    last = json.loads(out.read_text().splitlines()[-1])
    assert last["stopped_early"] == f"interrupted ({name})"


_STUCK_AGENT = """
import anyio
from osmosis_rollout import RolloutAgentLoop


class StuckAgent(RolloutAgentLoop):
    name = "stuck"

    def get_tools(self, request):
        return []

    async def run(self, ctx):
        if ctx.request.metadata.get("stuck"):
            await anyio.sleep_forever()
        messages = list(ctx.request.messages)
        reply = await ctx.chat(messages)
        return ctx.complete([*messages, reply.message])
"""


def test_an_interrupt_with_samples_counts_rollouts_not_rows(tmp_path: Path) -> None:
    """With --samples the interrupt counts rollouts (rows times samples) and says so; it said
    "2 of 8 row(s)" of a 4-row dataset."""
    (tmp_path / "stuck.py").write_text(_STUCK_AGENT, encoding="utf-8")
    rows = [{"user_prompt": "quick"}] + [{"user_prompt": "never", "stuck": True}] * 3
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "results.jsonl"
    command = [sys.executable, "-m", "osmosis_rollout", "test", "stuck.py:StuckAgent"]
    command += ["-d", "rows.jsonl", "--samples", "2", "--concurrency", "8", "-o", str(out)]
    proc = subprocess.Popen(
        command,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "COLUMNS": "200"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 20
        while not (out.exists() and out.read_text().count("\n") >= 2):  # the quick row's two
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the quick row never finished"
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = stderr.decode()
    assert proc.returncode == 130, text
    assert "2 of 8 rollouts (4 rows × 2 samples) finished before the interrupt" in text


def test_ctrl_c_keeps_finished_rows_and_marks_the_results_file_partial(tmp_path: Path) -> None:
    """SIGINT mid-batch: exit 130, finished rows kept, then a summary saying it was cut short."""
    (tmp_path / "stuck.py").write_text(_STUCK_AGENT, encoding="utf-8")
    rows = [{"user_prompt": "quick"}] + [{"user_prompt": "never", "stuck": True}] * 3
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "results.jsonl"
    command = [sys.executable, "-m", "osmosis_rollout", "test", "stuck.py:StuckAgent"]
    proc = subprocess.Popen(
        [*command, "-d", "rows.jsonl", "--concurrency", "4", "-o", str(out)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "COLUMNS": "200"},
        # A background shell starts children with SIGINT ignored; Ctrl-C must reach this one.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 20
        # The results file is the only signal another process gives: poll it for the first row.
        while not (out.exists() and out.read_text().count("\n") >= 1):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the quick row never finished"
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = stderr.decode()
    assert proc.returncode == 130, text
    assert "Traceback" not in text
    assert f"1 of 4 row(s) finished before the interrupt; their results are in {out}" in text
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["type"] for line in lines] == ["row", "summary"]
    assert lines[0]["passed"] is True
    assert lines[1]["rows"] == 1
    assert lines[1]["stopped_early"] == "interrupted (Ctrl-C)"


@pytest.mark.usefixtures("no_inherited_settings")
def test_q_at_a_turn_prompt_says_you_left_not_ctrl_c() -> None:
    """Piped commands work without a terminal warning; `q` names itself as the reason."""
    osmosis = Path(sys.executable).parent / "osmosis"
    proc = subprocess.run(
        [str(osmosis), "test", CALCULATOR, "-i", "-d", DATASET, "--row", "1"],
        input="q\n",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "COLUMNS": "100"},
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "error: rollout cancelled (you left the REPL)" in output
    assert "Ctrl-C at the REPL" not in output
    assert "not a terminal" not in output


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
    monkeypatch.setattr("osmosis_rollout.evaluation.cpus.cpu_count", lambda: 1)
    cassette = tmp_path / "cassette.jsonl"
    result = invoke(
        CALCULATOR, "-d", DATASET, "--limit", "2", "--jobs", "auto", "--record", str(cassette)
    )
    assert result.exit_code == 0, result.stderr
    assert "cassette of 2 row(s) written" in result.stderr
    assert cassette.exists()


def test_jobs_auto_on_two_busy_cpus_is_one_process_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two CPUs with other work on them: ``auto`` runs one process (it ran two, slower than one;
    issue 30), so ``--record`` works, and one line says what ``auto`` chose and why."""
    monkeypatch.setattr("osmosis_rollout.evaluation.cpus.cpu_count", lambda: 2)
    monkeypatch.setattr("osmosis_rollout.evaluation.cpus.machine_load", lambda: 1.2)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    cassette = tmp_path / "cassette.jsonl"
    result = invoke(
        CALCULATOR, "-d", DATASET, "--limit", "2", "--jobs", "auto", "--record", str(cassette)
    )
    assert result.exit_code == 0, result.stderr
    assert "--jobs auto: 1 process (0.8 of 2 CPUs free at load 1.2)" in result.stderr
    assert "cassette of 2 row(s) written" in result.stderr


def test_jobs_auto_runs_a_small_batch_in_one_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On idle CPUs, a run of a few rows is still one process: starting workers costs more."""
    monkeypatch.setattr("osmosis_rollout.evaluation.cpus.cpu_count", lambda: 8)
    monkeypatch.setattr("osmosis_rollout.evaluation.cpus.machine_load", lambda: 0.0)
    result = invoke(CALCULATOR, "-d", DATASET, "--offset", "1", "--jobs", "auto", "--json")
    rows = len(Path(DATASET).read_text().splitlines()) - 1
    assert result.exit_code == 0, result.stderr
    assert f"--jobs auto: 1 process ({rows} rows: workers pay off from 400)" in result.stderr
    assert json.loads(result.stdout[result.stdout.index("{") :])["rows"] == rows


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


def bad_rows_dataset(tmp_path: Path) -> Path:
    """Two good calculator rows and three bad ones (lines 2, 3 and 5)."""
    good = Path(DATASET).read_text().splitlines()[:2]
    lines = [good[0], '{"user_prompt": "b",', '{"user_prompt": 5}', good[1], '{"q": "e"}']
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_every_bad_row_is_named_and_the_run_stops_with_exit_2(tmp_path: Path) -> None:
    """Not only the first: each bad row's line and problem, then how to go on."""
    result = invoke(CALCULATOR, "-d", str(bad_rows_dataset(tmp_path)))
    assert_one_clear_error(result, "Error: 3 rows of rows.jsonl are bad:")
    err = " ".join(result.stderr.split())
    assert "row 2: invalid JSON on line 2 of rows.jsonl" in err
    assert "row 3, column 'user_prompt': must be a string, got a number (5) (line 3)" in err
    assert "row 5, column 'user_prompt': needs a 'user_prompt' string or a 'messages' list" in err
    assert "Hint: fix the rows, or run the others with --skip-bad-rows" in err
    assert "Rollouts" not in result.stdout


def test_skip_bad_rows_runs_the_others_and_counts_them(tmp_path: Path) -> None:
    """--skip-bad-rows: a warning names them, the summary and --json count them, exit 0."""
    path = bad_rows_dataset(tmp_path)
    shown = invoke(CALCULATOR, "-d", str(path), "--skip-bad-rows")
    as_json = invoke(CALCULATOR, "-d", str(path), "--skip-bad-rows", "--json")

    assert shown.exit_code == 0, shown.stdout + shown.stderr
    err = " ".join(shown.stderr.split())
    assert "Warning: skipping 3 bad row(s) of rows.jsonl: row 2: invalid JSON on line 2" in err
    assert "2/2" in shown.stdout
    assert re.search(r"bad rows\s+3 skipped \(not run, not in passed/2\)", shown.stdout)
    summary = json.loads(as_json.stdout)
    assert (summary["rows"], summary["passed"], summary["bad_rows_skipped"]) == (2, 2, 3)
    # Without the option the summary has no such key: it is not a count of zero skipped.
    plain = json.loads(invoke(CALCULATOR, "-d", DATASET, "--limit", "1", "--json").stdout)
    assert "bad_rows_skipped" not in plain


def test_a_replay_of_an_edited_row_says_its_error_once(tmp_path: Path) -> None:
    """A dataset row changed after recording has no recorded row: its error and the
    replay_diverged finding carry the same words, and the output says them once."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text(Path(DATASET).read_text().splitlines()[0] + "\n")
    cassette = tmp_path / "c.jsonl"
    target = CALCULATOR
    recording = CliRunner().invoke(
        app, ["test", target, "-d", str(rows), "--record", str(cassette)]
    )
    assert recording.exit_code == 0, recording.stderr
    rows.write_text(rows.read_text().replace("12 + 30", "12 + 31"))
    result = CliRunner().invoke(app, ["test", target, "-d", str(rows), "--replay", str(cassette)])
    assert result.exit_code == 1
    output = " ".join((result.stdout + result.stderr).split())
    assert output.count("no row of the cassette") == 1, output
    assert "replay_diverged x1" in output


def test_server_with_protocol_v2_drives_a_v2_server(tmp_path: Path) -> None:
    """--server URL --protocol v2: POST /rollout, the two callbacks, the status check; the
    same summary, --json and --output as on v1."""
    from .v2_stub import V2Stub

    stub = V2Stub()
    out = tmp_path / "results.jsonl"
    with serve_in_thread(stub.app) as url:
        result = invoke(
            "--server", url, "--protocol", "v2", "-d", DATASET, "--limit", "3", "--json",
            "-o", str(out),
        )  # fmt: skip
    assert result.exit_code == 0, result.stdout + result.stderr
    summary = json.loads(result.stdout)
    assert (summary["rows"], summary["passed"], summary["findings"]) == (3, 3, {})
    rows = [json.loads(line) for line in out.read_text().splitlines()][:-1]
    assert [r["status"] for r in rows] == ["COMPLETED"] * 3
    assert stub.inits == 3
    assert all(r.body["label"] is not None for r in stub.rollouts.values())


def test_a_cassette_replays_only_on_the_wire_it_was_recorded_on(tmp_path: Path) -> None:
    """Recorded on v1, replayed with --protocol v2: refused, naming the flag (the agent's
    requests differ between the wires, so every row would read as diverged)."""
    cassette = tmp_path / "run.jsonl"
    recorded = invoke(CALCULATOR, "-d", DATASET, "--limit", "1", "--record", str(cassette))
    assert recorded.exit_code == 0, recorded.stderr
    assert json.loads(cassette.read_text().splitlines()[0])["protocol"] == "v1"
    result = invoke(CALCULATOR, "--replay", str(cassette), "--protocol", "v2")
    assert_one_clear_error(result, "was recorded with --protocol v1; replay it with --protocol v1")


def test_jobs_run_the_rows_over_v2_as_well(tmp_path: Path) -> None:
    """--jobs workers speak the wire the run asked for: an agent rewarded 1.0 only when its
    chat channel is the v2 one."""
    agent = tmp_path / "wire_agent.py"
    agent.write_text(WIRE_AGENT)
    args = [f"{agent}:WireAgent", "-d", DATASET, "--limit", "4", "--jobs", "2", "--json"]
    for protocol, reward in (("v2", 1.0), ("v1", 0.0), ("polling", 1.0)):
        result = invoke(*args, "--protocol", protocol)
        assert result.exit_code == 0, result.stdout + result.stderr
        summary = json.loads(result.stdout)
        assert (summary["rows"], summary["passed"], summary["findings"]) == (4, 4, {})
        assert summary["mean_reward"] == reward, protocol


WIRE_AGENT = """
from osmosis_rollout import RolloutAgentLoop


class WireAgent(RolloutAgentLoop):
    name = "wire"

    def get_tools(self, request):
        return []

    async def run(self, ctx):
        messages = list(ctx.request.messages)
        result = await ctx.chat(messages)
        v2 = type(ctx.llm).__name__ == "V2ChatChannel"
        return ctx.complete([*messages, result.message], reward=1.0 if v2 else 0.0)
"""


def test_a_polling_run_records_its_wire_and_replays_on_it(tmp_path: Path) -> None:
    """--protocol polling in process: a cassette that names the wire, replayed on it, and
    refused on another."""
    cassette = tmp_path / "run.jsonl"
    recorded = invoke(
        CALCULATOR, "-d", DATASET, "--limit", "2", "--protocol", "polling", "--json",
        "--record", str(cassette),
    )  # fmt: skip
    assert recorded.exit_code == 0, recorded.stdout + recorded.stderr
    summary = json.loads(recorded.stdout)
    assert (summary["rows"], summary["passed"], summary["findings"]) == (2, 2, {})
    assert json.loads(cassette.read_text().splitlines()[0])["protocol"] == "polling"
    replayed = invoke(CALCULATOR, "--replay", str(cassette), "--protocol", "polling", "--json")
    assert replayed.exit_code == 0, replayed.stdout + replayed.stderr
    assert json.loads(replayed.stdout)["findings"] == {}
    result = invoke(CALCULATOR, "--replay", str(cassette), "--protocol", "v2")
    assert_one_clear_error(
        result, "was recorded with --protocol polling; replay it with --protocol polling"
    )


def test_max_turns_on_v2_says_it_cannot_reach_the_agent() -> None:
    result = invoke(
        CALCULATOR, "-d", DATASET, "--limit", "1", "--protocol", "v2", "--max-turns", "3"
    )
    assert result.exit_code == 0, result.stderr
    assert "--max-turns: protocol v2 has no turn budget" in result.stderr
    quiet = invoke(CALCULATOR, "-d", DATASET, "--limit", "1", "--protocol", "v2")
    assert "--max-turns" not in quiet.stderr


def test_zero_rewards_on_an_unscripted_mock_say_why_and_what_to_do(tmp_path: Path) -> None:
    """Every reward 0 with no row scripting the mock: the run says the mock does not know the
    task's answers and names mock_replies; a row that scripts the right answer gets reward 1
    and no such note."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"user_prompt": "What is 12 + 30?", "ground_truth": "42"}) + "\n")
    unscripted = invoke(CALCULATOR, "-d", str(rows), env={"COLUMNS": "200"})
    assert unscripted.exit_code == 0, unscripted.output
    assert "Every reward is 0, and no row scripts the mock LLM" in unscripted.stderr
    assert "mock_replies" in unscripted.stderr
    scripted_row = {"user_prompt": "What is 12 + 30?", "ground_truth": "42",
                    "mock_replies": ["42"]}  # fmt: skip
    rows.write_text(json.dumps(scripted_row) + "\n")
    scripted = invoke(CALCULATOR, "-d", str(rows), "--json")
    assert json.loads(scripted.stdout)["mean_reward"] == 1
    assert "Every reward is 0" not in scripted.stderr


def test_a_run_where_no_rollout_completed_is_not_trainable(tmp_path: Path) -> None:
    """Every rollout an error leaves no trajectory: the verdict is no, and says why (it said
    yes, for want of a finding)."""
    broken = tmp_path / "broken.py"
    broken.write_text(
        "from osmosis_rollout import RolloutAgentLoop\n\n\n"
        "class Broken(RolloutAgentLoop):\n"
        "    name = 'broken'\n\n"
        "    def get_tools(self, request):\n"
        "        return []\n\n"
        "    async def run(self, ctx):\n"
        "        raise RuntimeError('boom')\n"
    )
    result = invoke(f"{broken}:Broken", "-d", DATASET, "--limit", "2", env={"COLUMNS": "200"})
    assert result.exit_code == 1
    assert "no: no rollout completed" in result.stdout
    as_json = invoke(f"{broken}:Broken", "-d", DATASET, "--limit", "2", "--json")
    assert json.loads(as_json.stdout)["trainable"] is False
