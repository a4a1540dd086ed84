"""``osmosis serve``: exit codes and messages (CliRunner), auth decisions, and real processes."""

from __future__ import annotations

import io
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from rich.console import Console
from typer.testing import CliRunner

from osmosis_rollout.cli import app
from osmosis_rollout.cli.serve import _print_banner, decide_auth
from osmosis_rollout.config import ServerSettings

from .commands import assert_one_clear_error, run_cli, run_cli_text
from .processes import REPO, clean_env, osmosis_serve, stop_process, wait_healthy
from .support import CALCULATOR, DATASET, ROOT

ASSETS = REPO / "tests" / "assets"
AGENT = f"{ASSETS / 'srv_agents.py'}:ToolAgent"
TERM80 = {"COLUMNS": "80"}  # a narrow terminal: an error must still be one line


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> CliRunner:
    """A CliRunner in an empty directory with no OSMOSIS_* settings inherited."""
    for name in list(os.environ):
        if name.startswith("OSMOSIS_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    return CliRunner()


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port on 127.0.0.1 that another socket is listening on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def error_lines(text: str) -> list[str]:
    """The non-empty lines of an output."""
    return [line for line in text.splitlines() if line.strip()]


# --------------------------------------------------------------------------------------------
# Mistakes: one clear line, exit 2, no traceback
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        pytest.param(
            f"{ASSETS / 'srv_import_fails.py'}:Agent",
            "imports 'osmosis_no_such_dependency' at ",
            id="missing-dependency",
        ),
        pytest.param(f"{ASSETS / 'nope.py'}:Agent", "file not found", id="no-file"),
        pytest.param(f"{ASSETS / 'srv_agents.py'}:Nope", "has no attribute 'Nope'", id="no-attr"),
        pytest.param("not a target", "must be MODULE:ATTR or FILE.py:ATTR", id="bad-format"),
    ],
)
def test_import_failure_is_one_line_and_exit_2(
    runner: CliRunner, target: str, expected: str
) -> None:
    """An agent that cannot be imported gives exit 2 and one error line, no traceback."""
    result = runner.invoke(app, ["serve", target, "--no-validate"], env=TERM80)

    assert result.exit_code == 2
    [line] = error_lines(result.stderr)
    assert line.startswith("Error: ")
    assert expected in line
    assert "Traceback" not in result.output
    assert result.stdout == ""


def test_port_in_use_is_one_line_and_exit_2(runner: CliRunner, busy_port: int) -> None:
    """A busy port gives exit 2 and says which port, and what to do."""
    result = runner.invoke(
        app, ["serve", AGENT, "--no-validate", "--port", str(busy_port)], env=TERM80
    )

    assert result.exit_code == 2
    [line] = error_lines(result.stderr)
    assert f"port {busy_port} on 127.0.0.1 is already in use" in line
    assert "--port" in line
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["--bogus"], id="unknown-flag"),
        pytest.param(["--port", "abc"], id="port-not-int"),
        pytest.param(["--rollout-timeout", "soon"], id="timeout-not-float"),
    ],
)
def test_bad_flags_exit_2(runner: CliRunner, args: list[str]) -> None:
    """Flags the parser rejects are usage errors: exit 2."""
    result = runner.invoke(app, ["serve", AGENT, "--no-validate", *args], env=TERM80)

    assert result.exit_code == 2
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("args", "field"),
    [
        pytest.param(["--max-concurrent", "0"], "max_concurrent", id="max-concurrent"),
        pytest.param(["--port", "70000"], "port", id="port-range"),
        pytest.param(["--shutdown-grace", "-1"], "shutdown_grace_s", id="grace"),
        pytest.param(["--log-level", "loud"], "log_level", id="log-level"),
        pytest.param(["--max-queued", "-1"], "max_queued", id="max-queued"),
        pytest.param(["--record-ttl", "0"], "record_ttl_s", id="record-ttl"),
    ],
)
def test_invalid_flag_values_exit_2_naming_the_setting(
    runner: CliRunner, args: list[str], field: str
) -> None:
    """Values out of range are one ConfigError line naming the setting, exit 2."""
    result = runner.invoke(app, ["serve", AGENT, "--no-validate", *args], env=TERM80)

    assert result.exit_code == 2
    [line] = error_lines(result.stderr)
    assert f"invalid settings: {field} ({args[0]}, OSMOSIS_{field.upper()}" in line


def test_missing_target_says_how_to_give_one(runner: CliRunner) -> None:
    """No TARGET and no `agent` in pyproject: exit 2 with a hint."""
    result = runner.invoke(app, ["serve"], env=TERM80)

    assert result.exit_code == 2
    assert "missing TARGET" in result.stderr
    assert "osmosis serve path/to/agent.py:MyAgent" in result.stderr


def test_reload_on_a_busy_port_fails_before_the_banner() -> None:
    """--reload on a taken port: the one-line error and exit 2, not a banner then uvicorn's 3."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = str(busy.getsockname()[1])
        result = run_cli("serve", CALCULATOR, "--reload", "--no-validate", "--port", port)
    assert_one_clear_error(result, f"port {port} on 127.0.0.1 is already in use")
    assert "listening on" not in result.stderr


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
    result = run_cli("serve", f"{tmp_path}/configless.py:ConfiglessAgent", "--port", "0")
    assert result.exit_code == 1, result.stderr
    assert "missing [config] section in tools.toml" in result.stderr
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


# --------------------------------------------------------------------------------------------
# Settings from pyproject.toml in the current directory, and from the environment
# --------------------------------------------------------------------------------------------


def test_pyproject_in_cwd_gives_the_agent_and_the_serve_settings(
    runner: CliRunner, tmp_path: Path, busy_port: int
) -> None:
    """`agent` from [tool.osmosis] and `port` from [tool.osmosis.serve] are used."""
    (tmp_path / "pyproject.toml").write_text(
        f'[tool.osmosis]\nagent = "{AGENT}"\n\n[tool.osmosis.serve]\nport = {busy_port}\n',
        encoding="utf-8",
    )

    result = runner.invoke(app, ["serve", "--no-validate"], env=TERM80)

    assert result.exit_code == 2
    assert f"port {busy_port} on 127.0.0.1 is already in use" in result.stderr


def test_unknown_key_in_the_serve_table_stops_the_command(
    runner: CliRunner, tmp_path: Path
) -> None:
    """A typo in [tool.osmosis.serve] is exit 2 with the key named."""
    (tmp_path / "pyproject.toml").write_text(
        "[tool.osmosis.serve]\nprot = 9001\n", encoding="utf-8"
    )

    result = runner.invoke(app, ["serve", AGENT, "--no-validate"], env=TERM80)

    assert result.exit_code == 2
    assert "unknown setting 'prot' in [tool.osmosis.serve]" in result.stderr


def test_flags_beat_the_environment(
    runner: CliRunner, busy_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OSMOSIS_PORT is read, and --port overrides it."""
    monkeypatch.setenv("OSMOSIS_PORT", str(busy_port))
    from_env = runner.invoke(app, ["serve", AGENT, "--no-validate"], env=TERM80)
    monkeypatch.setenv("OSMOSIS_MAX_CONCURRENT", "0")
    overridden = runner.invoke(
        app, ["serve", AGENT, "--no-validate", "--max-concurrent", "3"], env=TERM80
    )

    assert f"port {busy_port} on 127.0.0.1 is already in use" in from_env.stderr
    assert f"port {busy_port} on 127.0.0.1 is already in use" in overridden.stderr


def test_serve_help_shows_the_pyproject_tables() -> None:
    """`serve --help` names [tool.osmosis] instead of Rich swallowing it as markup."""
    result = run_cli("serve", "--help", env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "then [tool.osmosis] /" in result.stdout
    assert "[tool.osmosis.serve] in pyproject.toml" in result.stdout


# --------------------------------------------------------------------------------------------
# The auth decision and the banner
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "env"),
    [
        pytest.param(["--api-key", ""], {}, id="empty-flag"),
        pytest.param(["--api-key", "   "], {}, id="blank-flag"),
        pytest.param([], {"OSMOSIS_API_KEY": ""}, id="empty-env"),
        pytest.param(["--host", "0.0.0.0", "--api-key", ""], {}, id="empty-on-public"),
    ],
)
def test_a_blank_server_key_is_a_usage_error_saying_how_to_turn_auth_off(
    runner: CliRunner, args: list[str], env: dict[str, str]
) -> None:
    """``--api-key "$UNSET"`` used to serve without auth under an "auth on" banner (and on
    0.0.0.0 it even stopped the generated key): now exit 2 before anything is bound."""
    result = runner.invoke(app, ["serve", AGENT, "--no-validate", *args], env={**TERM80, **env})

    assert result.exit_code == 2, result.output
    text = " ".join(result.stderr.split())
    assert "the server key is blank" in text
    assert "--no-auth" in text
    assert "listening on" not in result.output


def test_a_blank_key_in_pyproject_is_a_usage_error(runner: CliRunner) -> None:
    """``api_key = ""`` in ``[tool.osmosis]`` is the same mistake."""
    Path("pyproject.toml").write_text('[tool.osmosis]\napi_key = ""\n', encoding="utf-8")
    result = runner.invoke(app, ["serve", AGENT, "--no-validate"], env=TERM80)

    assert result.exit_code == 2
    assert "the server key is blank" in " ".join(result.stderr.split())


@pytest.mark.parametrize(
    ("args", "field"),
    [
        pytest.param(["--traingate", "tg:0"], "traingate", id="traingate-port"),
        pytest.param(["--traingate", "[::1"], "traingate", id="traingate-v6"),
    ],
)
def test_a_malformed_traingate_flag_exits_2_naming_it(
    runner: CliRunner, args: list[str], field: str
) -> None:
    """``--traingate`` entries are checked at start."""
    result = runner.invoke(app, ["serve", AGENT, "--no-validate", *args], env=TERM80)

    assert result.exit_code == 2
    assert f"{field} (--traingate, OSMOSIS_TRAINGATE" in " ".join(result.stderr.split())


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_loopback_without_key_serves_without_auth(host: str) -> None:
    """On loopback no key is invented."""
    settings, generated = decide_auth(ServerSettings(host=host), no_auth=False)

    assert settings.api_key is None
    assert generated is False


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "rollouts.example"])
def test_public_host_without_key_gets_a_generated_key(host: str) -> None:
    """A non-loopback host without a key gets a fresh one, marked as generated."""
    settings, generated = decide_auth(
        ServerSettings(host=host), no_auth=False, new_key=lambda: "generated-key"
    )

    assert settings.api_key is not None
    assert settings.api_key.get_secret_value() == "generated-key"
    assert generated is True


def test_generated_keys_are_fresh_and_long() -> None:
    """The default generator makes a different, unguessable key each time."""
    keys = set()
    for _ in range(3):
        settings, _generated = decide_auth(ServerSettings(host="0.0.0.0"), no_auth=False)
        assert settings.api_key is not None
        keys.add(settings.api_key.get_secret_value())

    assert len(keys) == 3
    assert all(len(k) >= 32 for k in keys)


def test_configured_key_from_the_environment_is_kept_on_a_public_host() -> None:
    """OSMOSIS_API_KEY is used as is; nothing is generated."""
    base = ServerSettings.resolve({"host": "0.0.0.0"}, environ={"OSMOSIS_API_KEY": "env-key"})
    settings, generated = decide_auth(base, no_auth=False)

    assert settings.api_key is not None
    assert settings.api_key.get_secret_value() == "env-key"
    assert generated is False


def test_no_auth_wins_over_everything() -> None:
    """--no-auth drops a configured key and generates none."""
    base = ServerSettings.resolve({"host": "0.0.0.0", "api_key": "k"})
    settings, generated = decide_auth(base, no_auth=True)

    assert settings.api_key is None
    assert generated is False


def banner(settings: ServerSettings, generated: bool) -> str:
    """The start banner as plain text."""
    out = io.StringIO()
    _print_banner(Console(file=out, width=200), "agent.py:A", "a", settings, generated)
    return out.getvalue()


def test_banner_prints_a_generated_key_once_and_a_given_key_never() -> None:
    """A generated key is shown exactly once (TrainGate needs it); a configured one never."""
    settings = ServerSettings(host="0.0.0.0", api_key="generated-abc")  # type: ignore[arg-type]

    shown = banner(settings, generated=True)
    hidden = banner(settings, generated=False)

    assert shown.count("generated-abc") == 1
    assert "generated key" in shown
    assert "generated-abc" not in hidden
    assert "auth          on (Bearer key required)" in hidden
    assert "listening on  http://0.0.0.0:9000" in hidden


def test_banner_says_where_inits_may_send_the_servers_calls() -> None:
    """The destination rule in force: the allow-list, or the default (loopback refused on a
    public interface)."""
    listed = banner(ServerSettings(traingate=("tg.internal:8000",)), generated=False)
    local = banner(ServerSettings(), generated=False)
    public = banner(
        ServerSettings(host="0.0.0.0", api_key="k"),  # type: ignore[arg-type]
        generated=False,
    )

    assert "traingate     tg.internal:8000 only (--traingate)" in listed
    assert "traingate     any host but link-local, cloud metadata (set --traingate" in local
    assert "link-local, cloud metadata, loopback (set --traingate" in public


# --------------------------------------------------------------------------------------------
# Real processes
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_sigint_stops_the_server_cleanly(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT) stops `osmosis serve` with exit 0 and no traceback."""
    with osmosis_serve(
        tmp_path / "server.log",
        AGENT,
        "--port",
        "0",
        "--no-validate",
        "--outbox-dir",
        str(tmp_path / "outbox"),
    ) as server:
        health = httpx2.get(f"{server.url}/health", timeout=5)
        server.proc.send_signal(signal.SIGINT)
        code = server.proc.wait(timeout=15)

    assert health.json()["agent_loop"] == "srv-tools"
    assert code == 0
    output = server.output()
    assert "Traceback" not in output
    assert "auth          off (no server key)" in output
    assert "debug traces  off (use --debug-dir)" in output


@pytest.mark.usefixtures("no_inherited_settings")
def test_serve_warns_at_start_and_logs_each_finished_rollout_with_why(tmp_path: Path) -> None:
    """The static warnings `validate` prints appear at start; a rollout that ends ERROR because
    run() returned None is one log line with id, status, finish reason, turns, time and why."""
    forgetful = f"{ROOT}/tests/assets/val_no_result.py:ForgetfulAgent"
    with osmosis_serve(tmp_path / "serve.log", forgetful, "--port", "0") as served:
        code, out, err = run_cli_text("test", "--server", served.url, "-d", DATASET, "--limit", "1")
        assert code == 1, out + err
        deadline = time.monotonic() + 20
        while "rollout " not in served.log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        log = served.log.read_text()
    assert "warning NO_RESULT_RETURNED" in log
    line = next(line for line in log.splitlines() if "rollout " in line and " ERROR " in line)
    assert re.search(r"rollout \S+ ERROR \(error\), 1 turn, \d+\.\d\d s: run\(\) returned", line)
    assert "it must return ctx.complete(...)" in line


@pytest.mark.usefixtures("no_inherited_settings")
def test_reload_with_a_syntax_error_prints_one_line_and_keeps_watching(tmp_path: Path) -> None:
    import httpx2

    from .processes import stop_process, wait_healthy
    from .support import free_port

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


@pytest.mark.slow
def test_reload_actually_serves(tmp_path: Path) -> None:
    """`--reload` starts a server through the app factory that answers /health."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = tmp_path / "reload.log"
    command = [sys.executable, "-m", "osmosis_rollout", "serve", AGENT, "--reload"]
    command += ["--port", str(port), "--no-validate", "--outbox-dir", str(tmp_path / "outbox")]
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            command,
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            env=clean_env(OSMOSIS_API_KEY="reload-key"),
            start_new_session=True,  # the reloader's child is in our process group
        )
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc, log)
        health = httpx2.get(f"http://127.0.0.1:{port}/health", timeout=5).json()
        platform = httpx2.get(
            f"http://127.0.0.1:{port}/platform/health",
            headers={"Authorization": "Bearer reload-key"},
            timeout=5,
        )
    finally:
        stop_process(proc)

    assert health["agent_loop"] == "srv-tools"
    assert platform.status_code == 200  # the key reached the reloaded child
    assert "reload-key" not in log.read_text(errors="replace")
