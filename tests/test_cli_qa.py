"""Rough edges a new user hit on the command line, each pinned once fixed."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from typer.testing import CliRunner

from osmosis_rollout.cli import app
from osmosis_rollout.cli._common import run_async
from osmosis_rollout.errors import ConfigError
from osmosis_rollout.server import create_app

from .support import load_asset

ROOT = Path(__file__).resolve().parent.parent
CALCULATOR = f"{ROOT}/examples/calculator/agent.py:CalculatorAgent"
DATASET = str(ROOT / "examples/calculator/dataset.jsonl")

runner = CliRunner()


def invoke(*args: str, env: dict[str, str] | None = None) -> Any:
    return runner.invoke(app, list(args), env=env)


def assert_one_clear_error(result: Any, message: str, *, code: int = 2) -> None:
    assert result.exit_code == code, result.stdout + result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stdout + result.stderr


# -- help ------------------------------------------------------------------------------------


def test_serve_help_shows_the_pyproject_tables() -> None:
    """`serve --help` names [tool.osmosis] instead of Rich swallowing it as markup."""
    result = invoke("serve", "--help", env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "then [tool.osmosis] /" in result.stdout
    assert "[tool.osmosis.serve] in pyproject.toml" in result.stdout


@pytest.mark.parametrize("command", ["validate", "test", "serve"])
def test_usage_line_names_the_target_like_the_docs(command: str) -> None:
    """Every command's usage line calls the agent TARGET, as errors and docs do."""
    result = invoke(command, "--help", env={"COLUMNS": "200"})
    assert result.exit_code == 0
    usage = next(line for line in result.stdout.splitlines() if "Usage:" in line)
    assert "TARGET" in usage


# -- osmosis test: flags that would be ignored or misread -------------------------------------


@pytest.mark.parametrize("url", ["notaurl", "localhost:9000", "ftp://host", "http://"])
def test_server_url_typo_is_a_usage_error(url: str) -> None:
    """A --server value that is not an http(s) URL with a host exits 2 with an example URL."""
    result = invoke("test", "--server", url, "-d", DATASET)
    assert_one_clear_error(result, "is not an http:// or https:// URL with a host")
    assert "http://127.0.0.1:9000" in result.stderr


def test_row_without_interactive_is_refused_with_the_batch_equivalent() -> None:
    """--row is an --interactive flag; in a batch it used to be ignored and every row ran."""
    result = invoke("test", CALCULATOR, "-d", DATASET, "--row", "3")
    assert_one_clear_error(result, "--row works only with --interactive")
    assert "--offset 2 --limit 1" in result.stderr


@pytest.mark.parametrize("flag", [["--json"], ["--output", "out.jsonl"]])
def test_interactive_refuses_batch_only_outputs(flag: list[str], tmp_path: Path) -> None:
    """--json and --output write batch results; with --interactive they would do nothing."""
    with contextlib.chdir(tmp_path):
        result = invoke("test", CALCULATOR, "-d", DATASET, "-i", *flag)
    assert_one_clear_error(result, f"{flag[0]} works only in batch mode")
    assert not (tmp_path / "out.jsonl").exists()


def test_interactive_row_beyond_the_dataset_exits_2() -> None:
    """--interactive --row N past the last row is a usage error, not a session that exits 0."""
    result = invoke("test", CALCULATOR, "-d", DATASET, "-i", "--row", "99")
    assert_one_clear_error(result, "--row 99 is not in the dataset rows loaded (1-10)")


# -- osmosis test --server with a key --------------------------------------------------------


@contextlib.contextmanager
def keyed_server(key: str) -> Iterator[str]:
    """The calculator agent behind a real uvicorn (with its lifespan) that requires ``key``."""
    agent = load_asset("seed_calculator").CalculatorAgent()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    config = uvicorn.Config(create_app(agent, api_key=key), log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def test_server_with_a_key_can_be_tested_with_api_key() -> None:
    """--api-key (or OSMOSIS_API_KEY) lets `test --server` drive a server started with a key."""
    with keyed_server("s3cret-server-key") as url:
        refused = invoke("test", "--server", url, "-d", DATASET, "--limit", "1")
        passed = invoke(
            "test", "--server", url, "-d", DATASET, "--limit", "2", "--api-key", "s3cret-server-key"
        )
        from_env = invoke(
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


# -- osmosis serve --reload -------------------------------------------------------------------


def test_reload_on_a_busy_port_fails_before_the_banner() -> None:
    """--reload on a taken port: the one-line error and exit 2, not a banner then uvicorn's 3."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = str(busy.getsockname()[1])
        result = invoke("serve", CALCULATOR, "--reload", "--no-validate", "--port", port)
    assert_one_clear_error(result, f"port {port} on 127.0.0.1 is already in use")
    assert "listening on" not in result.stderr


# -- the async bridge -------------------------------------------------------------------------


async def _rows_fail_together() -> None:
    raise ExceptionGroup("rows", [ConfigError("server went away"), ConfigError("again")])


async def _mixed_failure() -> None:
    raise ExceptionGroup("rows", [ConfigError("server went away"), RuntimeError("bug")])


def test_run_async_shows_a_group_of_domain_errors_as_the_first_one() -> None:
    """Concurrent rows failing with one domain error reach the CLI as that error, not a group."""
    with pytest.raises(ConfigError, match="server went away"):
        run_async(_rows_fail_together())


def test_run_async_keeps_a_group_with_a_real_bug_intact() -> None:
    """A group that holds anything but domain errors is a bug: it keeps its traceback."""
    with pytest.raises(ExceptionGroup):
        run_async(_mixed_failure())


# -- datasets ---------------------------------------------------------------------------------


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
    result = invoke("test", CALCULATOR, "-d", str(path))
    assert_one_clear_error(result, message)


# -- Ctrl-C in a batch ------------------------------------------------------------------------

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


# -- what the reports print -------------------------------------------------------------------

_GET_TOOLS_RAISES = """
from osmosis_rollout import RolloutAgentLoop


class ConfiglessAgent(RolloutAgentLoop):
    name = "configless"

    def get_tools(self, request):
        raise RuntimeError("missing [config] section in tools.toml")

    async def run(self, ctx):
        return ctx.complete(list(ctx.request.messages))
"""


def test_serve_validation_failure_prints_brackets_in_messages(tmp_path: Path) -> None:
    """A failed start-up check quotes the agent's error as is; Rich markup must not eat it."""
    (tmp_path / "configless.py").write_text(_GET_TOOLS_RAISES, encoding="utf-8")
    result = invoke("serve", f"{tmp_path}/configless.py:ConfiglessAgent", "--port", "0")
    assert result.exit_code == 1, result.stderr
    assert "missing [config] section in tools.toml" in result.stderr
    assert "Traceback" not in result.stderr


def test_summary_throughput_is_rounded_for_people() -> None:
    """The summary shows `93.9 rollouts/s over 32 ms`, not `93.903 rollouts/s over 0.032 s`."""
    result = invoke("test", CALCULATOR, "-d", DATASET, "--limit", "2", env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.stderr
    assert re.search(r"throughput +\d+\.\d rollouts/s over (\d+ ms|\d+\.\d\d s)\b", result.stdout)


def test_init_help_names_the_real_default_template() -> None:
    """`osmosis init --help` shows scaffold's default template without importing scaffold."""
    from osmosis_rollout.cli import init as init_command
    from osmosis_rollout.scaffold import DEFAULT_TEMPLATE

    assert init_command._DEFAULT_TEMPLATE == DEFAULT_TEMPLATE


def test_validate_names_the_classes_and_the_bad_line(tmp_path: Path) -> None:
    """A wrong class name lists the classes in the file; a syntax error quotes the line."""
    from osmosis_rollout.cli import app as cli_app

    agent = tmp_path / "agent.py"
    agent.write_text("class Alpha:\n    pass\n\n\nclass Beta:\n    pass\n")
    missing = CliRunner().invoke(cli_app, ["validate", f"{agent}:Zzz"])
    assert missing.exit_code == 2
    assert "classes defined there: Alpha, Beta" in missing.stderr
    agent.write_text("class Alpha:\n    def f(self)\n        pass\n")
    broken = CliRunner().invoke(cli_app, ["validate", f"{agent}:Alpha", "--json"])
    assert broken.exit_code == 1
    assert "def f(self)" in broken.stdout


def test_serve_with_a_broken_pyproject_is_one_clear_error(tmp_path: Path) -> None:
    """No TARGET and an unreadable pyproject.toml: exit 2 naming the file, no traceback."""
    from osmosis_rollout.cli import app as cli_app

    (tmp_path / "pyproject.toml").write_text("[tool.osmosis\nagent = 1\n")
    cwd = Path.cwd()
    os.chdir(tmp_path)
    try:
        result = CliRunner().invoke(cli_app, ["serve"])
    finally:
        os.chdir(cwd)
    assert result.exit_code == 2
    assert "pyproject.toml" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_imports_the_agent_once_even_with_validation(tmp_path: Path) -> None:
    """The start-up checks reuse the loaded agent: the module's code runs once."""
    from osmosis_rollout.cli.serve import _load_and_check

    marker = tmp_path / "imports.txt"
    agent = tmp_path / "once_agent.py"
    agent.write_text(
        "from pathlib import Path\n"
        "from osmosis_rollout import RolloutAgentLoop\n"
        f"with Path({str(marker)!r}).open('a') as f:\n    f.write('x')\n\n\n"
        "class Once(RolloutAgentLoop):\n"
        "    name = 'once'\n\n"
        "    def get_tools(self, request):\n"
        "        return []\n\n"
        "    async def run(self, ctx):\n"
        "        return ctx.complete(list(ctx.request.messages))\n"
    )
    loaded = _load_and_check(f"{agent}:Once", validate=True)
    assert loaded.name == "once"
    assert marker.read_text() == "x"
