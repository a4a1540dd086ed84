"""Frictions a new user met in the first hour (issue 16), each pinned by a test."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from typer.testing import CliRunner

from osmosis_rollout.cli import app
from osmosis_rollout.config import ServerSettings
from osmosis_rollout.server import create_app

from .support import load_asset, serve_in_thread
from .test_server_uvicorn import osmosis_serve

ROOT = Path(__file__).resolve().parent.parent
CALCULATOR = f"{ROOT}/examples/calculator/agent.py:CalculatorAgent"
DATASET = str(ROOT / "examples/calculator/dataset.jsonl")


@pytest.fixture(autouse=True)
def no_inherited_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("OSMOSIS_"):
            monkeypatch.delenv(name)


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    return result.exit_code, result.stdout, result.stderr


# --- item 5: the server key is checked once, before the run ---------------------------------------


@pytest.fixture
def keyed_server() -> Iterator[str]:
    """A rollout server on 127.0.0.1 that requires the key `right-key`."""
    agent = load_asset("tool_agent")
    settings = ServerSettings(api_key=SecretStr("right-key"))
    app_ = create_app(agent.ToolAgent(), settings=settings)
    with serve_in_thread(app_, lifespan="on") as url:
        yield url


@pytest.mark.parametrize(
    ("key_args", "problem"),
    [([], "requires a key and none was given"), (["--api-key", "wrong"], "refused the key given")],
)
def test_a_missing_or_wrong_server_key_stops_before_the_first_row(
    keyed_server: str, key_args: list[str], problem: str
) -> None:
    code, out, err = invoke("test", "--server", keyed_server, "-d", DATASET, *key_args)
    assert code == 2
    assert f"the rollout server at {keyed_server} {problem}" in err
    assert "--api-key KEY or the OSMOSIS_API_KEY environment variable" in err
    assert "REFUSED" not in out + err  # no row was run
    assert "--verbose" not in out + err


def test_the_right_server_key_runs_the_rows(keyed_server: str) -> None:
    code, out, err = invoke(
        "test", "--server", keyed_server, "-d", DATASET, "--limit", "2", "--api-key", "right-key"
    )
    assert "REFUSED" not in out, out + err
    assert code == 0, out + err


# --- item 7: shell completion ---------------------------------------------------------------------


def osmosis_process(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The installed `osmosis` command as a user runs it (completion needs a real process)."""
    osmosis = Path(sys.executable).parent / "osmosis"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("OSMOSIS_", "_OSMOSIS"))}
    full_env.update(env or {})
    return subprocess.run(
        [str(osmosis), *args], env=full_env, capture_output=True, text=True, timeout=60, check=False
    )


def test_show_completion_prints_a_bash_script() -> None:
    proc = osmosis_process("--show-completion", "bash")
    assert proc.returncode == 0, proc.stderr
    assert "complete -o default -F _osmosis_completion osmosis" in proc.stdout


def test_install_completion_writes_the_script_for_the_shell(tmp_path: Path) -> None:
    proc = osmosis_process("--install-completion", "bash", env={"HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert "_osmosis_completion" in (tmp_path / ".bash_completions" / "osmosis.sh").read_text()
    assert "osmosis.sh" in (tmp_path / ".bashrc").read_text()


@pytest.mark.parametrize(
    ("words", "cword", "expected"),
    [("osmosis val", "1", "validate"), ("osmosis test --conc", "2", "--concurrency")],
)
def test_completion_completes_commands_and_options(words: str, cword: str, expected: str) -> None:
    """What bash calls on <Tab> once the script is installed."""
    env = {"_OSMOSIS_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": cword}
    proc = osmosis_process(env=env)
    assert proc.stdout.split() == [expected], proc.stderr


# --- item 11: help and usage errors look like one tool --------------------------------------------


@pytest.mark.parametrize("command", [[], ["init"], ["validate"], ["test"], ["serve"]])
def test_help_shows_no_bool_type_on_flags_and_no_braces(command: list[str]) -> None:
    code, out, _ = invoke(*command, "--help")
    assert code == 0
    assert "<bool>" not in out
    assert "{" not in out
    assert "--help" in out


@pytest.mark.parametrize(
    ("args", "message", "usage"),
    [
        (["validate", "--bogus"], "No such option: --bogus", "osmosis validate [OPTIONS] [TARGET]"),
        (["tset"], "No such command 'tset'. Did you mean 'test'?", "osmosis [OPTIONS] COMMAND"),
        (
            ["test", "--concurrency", "x"],
            "Invalid value for '--concurrency'",
            "osmosis test [OPTIONS] [TARGET]",
        ),
    ],
)
def test_usage_errors_are_plain_error_lines_like_every_other_error(
    args: list[str], message: str, usage: str
) -> None:
    """Typer's boxed panel is gone: `Error:` then `Hint:`, as `fail()` prints them."""
    code, out, err = invoke(*args)
    assert code == 2
    lines = err.splitlines()
    assert lines[0].startswith(f"Error: {message}")
    assert lines[1].startswith(f"Hint: usage: {usage}")
    assert lines[1].endswith("--help")
    assert "╭" not in err + out


# --- item 3: serve says what it does --------------------------------------------------------------


def test_serve_warns_at_start_and_logs_each_finished_rollout_with_why(tmp_path: Path) -> None:
    """The static warnings `validate` prints appear at start; a rollout that ends ERROR because
    run() returned None is one log line with id, status, finish reason, turns, time and why."""
    forgetful = f"{ROOT}/tests/assets/val_no_result.py:ForgetfulAgent"
    with osmosis_serve(tmp_path / "serve.log", forgetful, "--port", "0") as served:
        code, out, err = invoke("test", "--server", served.url, "-d", DATASET, "--limit", "1")
        assert code == 1, out + err
        deadline = time.monotonic() + 20
        while "rollout " not in served.log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        log = served.log.read_text()
    assert "warning NO_RESULT_RETURNED" in log
    line = next(line for line in log.splitlines() if "rollout " in line and " ERROR " in line)
    assert re.search(r"rollout \S+ ERROR \(error\), 1 turn, \d+\.\d\d s: run\(\) returned", line)
    assert "it must return ctx.complete(...)" in line


@pytest.mark.anyio
async def test_a_completed_rollout_is_one_info_line(caplog: pytest.LogCaptureFixture) -> None:
    from osmosis_rollout.testing import Harness, ScriptedBackend

    agent = load_asset("tool_agent").ToolAgent()
    with caplog.at_level(logging.INFO, logger="osmosis_rollout"):
        async with Harness(agent, backend=ScriptedBackend([{"content": "done"}])) as harness:
            outcome = await harness.run([{"role": "user", "content": "hi"}], rollout_id="r-7")
    assert outcome.result is not None
    assert outcome.result.status == "COMPLETED"
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("rollout r-7 ")]
    assert len(lines) == 1
    assert re.fullmatch(r"rollout r-7 COMPLETED \(stop\), 1 turn, \d+\.\d\d s", lines[0])


# --- item 6: times that add up -------------------------------------------------------------------


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


def test_repl_metrics_show_paused_apart_from_llm_and_tool_wall_time() -> None:
    from rich.console import Console

    from osmosis_rollout.protocol import RolloutMetrics
    from osmosis_rollout.repl.views import metrics_table

    metrics = RolloutMetrics(
        total_latency_ms=6000,
        llm_latency_ms=5700,  # as the agent measured it: 5650 ms of it was you at the prompt
        tool_latency_ms=40,
        num_llm_calls=2,
        num_tool_calls=4,
        tool_wall_ms=10,
    )
    console = Console(width=100, record=True, no_color=True)
    console.print(metrics_table(metrics, paused_ms=5650, model_ms=18))
    rows = {line.split()[0]: line.strip() for line in console.export_text().splitlines() if line}
    cells = {name: row.split()[1:3] for name, row in rows.items()}
    assert cells["paused"] == ["5.65", "s"]  # a row of its own, not indented under llm
    assert cells["llm"] == ["50", "ms"]  # 5700 - 5650: the LLM calls without the pauses
    assert cells["model"] == ["18", "ms"]
    assert cells["tool"] == ["10", "ms"]
    assert rows["tool"].endswith("wall time; 40 ms summed over parallel calls")
    assert cells["other"] == ["290", "ms"]  # 6000 - 5700 - 10
    assert not any(line.startswith("  paused") for line in console.export_text().splitlines())


# --- item 11: smaller ones ------------------------------------------------------------------------


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


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A package `osm_fr_pkg` in the working folder: one agent and one plain function."""
    monkeypatch.syspath_prepend(str(tmp_path / "unused"))  # sys.path restored afterwards
    monkeypatch.chdir(tmp_path)
    before = set(sys.modules)
    pkg = tmp_path / "osm_fr_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    source = (ROOT / "tests/assets/docs_sandbox/agent.py").read_text()
    (pkg / "agent.py").write_text(source)
    yield pkg
    for name in set(sys.modules) - before:
        del sys.modules[name]


@pytest.mark.parametrize("target", ["osm_fr_pkg.agent", "osm_fr_pkg/agent.py"])
def test_a_target_without_class_suggests_the_one_agent_defined(package: Path, target: str) -> None:
    code, _, err = invoke("validate", target)
    assert code == 2
    assert f"did you mean {target}:MyAgent?" in err


def test_a_function_target_says_it_is_a_function_and_names_the_agents(package: Path) -> None:
    code, out, _ = invoke("validate", "osm_fr_pkg.agent:add", "--json")
    assert code == 1
    message = json.loads(out)["problems"][0]["message"]
    assert message.startswith("add is a function, not an agent")
    assert message.endswith("agents defined there: MyAgent")
    assert "class add(" not in message


def test_piped_tables_have_no_trailing_spaces() -> None:
    code, out, err = invoke("test", CALCULATOR, "-d", DATASET, "--limit", "2")
    assert code == 0, out + err
    assert "Rollouts" in out
    assert [line for line in out.splitlines() if line.endswith(" ")] == []


# --- item 10: interrupted runs --------------------------------------------------------------------

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


@pytest.mark.parametrize(
    ("signum", "name"), [(signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "Ctrl-C")]
)
def test_an_interrupted_json_run_prints_its_partial_summary(
    tmp_path: Path, signum: int, name: str
) -> None:
    """SIGTERM is handled like Ctrl-C; both leave the partial summary on stdout and in -o."""
    marks = tmp_path / "marks"
    marks.mkdir()
    (tmp_path / "slow.py").write_text(f"MARKS = {str(marks)!r}\n{SLOW_AGENT}")
    out = tmp_path / "out.jsonl"
    osmosis = Path(sys.executable).parent / "osmosis"
    args = [str(osmosis), "test", f"{tmp_path}/slow.py:Slow", "-d", DATASET]
    args += ["--concurrency", "1", "--json", "-o", str(out)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OSMOSIS_")}
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
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


# --- item 9: --reload and a syntax error ----------------------------------------------------------


def test_reload_with_a_syntax_error_prints_one_line_and_keeps_watching(tmp_path: Path) -> None:
    import httpx2

    from .support import free_port
    from .test_server_uvicorn import stop_process, wait_healthy

    agent = tmp_path / "agent.py"
    good = (ROOT / "tests/assets/docs_sandbox/agent.py").read_text()
    agent.write_text(good)
    port = free_port()
    log = tmp_path / "serve.log"
    command = [sys.executable, "-m", "osmosis_rollout", "serve", "agent.py:MyAgent", "--reload"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OSMOSIS_")}
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [*command, "--port", str(port), "--no-validate"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            env={**env, "COLUMNS": "200"},
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log, timeout=60)
        agent.write_text(good.replace("def add(a: float", "def add(a: float,,", 1))
        deadline = time.monotonic() + 60
        while "Error: syntax error in" not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.1)
        broken = httpx2.get(f"{url}/health", timeout=5)
        agent.write_text(good)  # fixed: the reloader is still watching
        wait_healthy(url, proc, log, timeout=60)
    finally:
        stop_process(proc)
    text = log.read_text(errors="replace")
    assert "Traceback" not in text
    assert "Error: syntax error in agent.py at agent.py:" in text
    assert broken.status_code == 503
    assert "the agent failed to load: syntax error" in broken.json()["detail"]


def test_a_rejected_edit_shows_an_example_with_the_agents_own_tool() -> None:
    from osmosis_rollout.errors import ToolError
    from osmosis_rollout.protocol import OpenAIFunctionToolSchema
    from osmosis_rollout.repl.commands import parse_reply

    search = OpenAIFunctionToolSchema.model_validate(
        {
            "type": "function",
            "function": {
                "name": "search",
                "description": "Search the catalogue.",
                "parameters": {
                    "type": "object",
                    "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                    "required": ["query"],
                },
            },
        }
    )
    with pytest.raises(ToolError) as info:
        parse_reply('{"arguments": {}}', [search], turn=1)
    message = str(info.value)
    assert '{"name": "search", "arguments": {"query": "text"}}' in message
    assert '"add"' not in message
    example = message.partition("e.g. ")[2]
    assert parse_reply(example, [search], turn=1).warnings == ()  # the example itself is valid


def test_the_piped_stdout_wrapper_outlives_a_closed_stream_quietly() -> None:
    """The wrapper may be collected after the stream under it closed (a test runner's capture,
    a closed pipe): that must not raise, or pytest's unraisable hook fails the caller's test."""
    import gc
    import io

    from osmosis_rollout.cli._common import _RstripLines

    target = io.StringIO()
    wrapper = _RstripLines(target)
    wrapper.write("a line  \npending")
    assert target.getvalue() == "a line\n"
    target.close()
    wrapper.flush()  # nothing to write to any more: dropped, not an error
    del wrapper
    gc.collect()
