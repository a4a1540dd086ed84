"""The platform's launch contract: ``_OSMOSIS_ROLLOUT_PORT``, ``_ARTIFACT_ROOT``,
``_INSTANCE_ID`` and ``_NAME`` fill ``osmosis serve``'s and ``serve()``'s settings, and
``/health`` names the instance in its body and in ``x-osmosis-rollout-instance-id``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx2
import pytest

from osmosis_rollout.config import ServerSettings
from osmosis_rollout.errors import ConfigError
from osmosis_rollout.launch_contract import apply_launch, launch_settings, port_conflict
from osmosis_rollout.loader import load_agent
from osmosis_rollout.server import create_app

from .processes import REPO, clean_env, osmosis_serve, stop_process, wait_healthy
from .support import free_port

AGENT = f"{REPO}/examples/calculator/agent.py:CalculatorAgent"


def test_each_variable_fills_its_setting() -> None:
    """The four variables become the port, the artifact root, the instance id and the name."""
    found = launch_settings(
        {
            "_OSMOSIS_ROLLOUT_PORT": "8123",
            "_OSMOSIS_ROLLOUT_ARTIFACT_ROOT": "/tmp/artifacts",
            "_OSMOSIS_ROLLOUT_INSTANCE_ID": "inst-42",
            "_OSMOSIS_ROLLOUT_NAME": "calc",
            "_OSMOSIS_ROLLOUT_UNRELATED": "x",
        }
    )
    assert found == {
        "port": 8123,
        "artifact_root": Path("/tmp/artifacts"),
        "instance_id": "inst-42",
        "server_name": "calc",
    }
    assert launch_settings({"_OSMOSIS_ROLLOUT_PORT": ""}) == {}  # empty is unset


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("_OSMOSIS_ROLLOUT_PORT", "eighty"),
        ("_OSMOSIS_ROLLOUT_PORT", "70000"),
        ("_OSMOSIS_ROLLOUT_INSTANCE_ID", "a\r\nX-Injected: 1"),
        ("_OSMOSIS_ROLLOUT_NAME", "x" * 300),
    ],
)
def test_a_bad_value_is_one_error_naming_its_variable(variable: str, value: str) -> None:
    """A value the server cannot use fails at start, naming the variable (never a traceback)."""
    with pytest.raises(ConfigError, match=rf"^{variable}=.* is not usable") as caught:
        launch_settings({variable: value})
    assert "\r\n" not in str(caught.value)  # escaped, it cannot forge a log line


def test_a_given_port_wins_and_a_different_one_is_warned_about() -> None:
    """serve(port=...) keeps its port; the platform's fills in only when none was given."""
    environ = {"_OSMOSIS_ROLLOUT_PORT": "8123", "_OSMOSIS_ROLLOUT_INSTANCE_ID": "i-1"}
    assert apply_launch(ServerSettings(), environ).port == 8123
    given = apply_launch(ServerSettings(port=9100, instance_id="mine"), environ)
    assert (given.port, given.instance_id) == (9100, "mine")
    warning = port_conflict(9100, environ)
    assert warning is not None
    assert "8123" in warning
    assert "9100" in warning
    assert port_conflict(8123, environ) is None
    assert port_conflict(9100, {}) is None


def test_the_platform_sits_between_osmosis_variables_and_the_project_file(tmp_path: Path) -> None:
    """flags > OSMOSIS_* > _OSMOSIS_ROLLOUT_* > [tool.osmosis]: the platform's run beats the
    project's file, a variable the user set beats the platform."""
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text("[tool.osmosis.serve]\nport = 9000\n")
    launch = launch_settings({"_OSMOSIS_ROLLOUT_PORT": "8123"})
    assert ServerSettings.resolve(pyproject=pyproject, fallback=launch).port == 8123
    user = {"OSMOSIS_PORT": "8200"}
    assert ServerSettings.resolve(environ=user, pyproject=pyproject, fallback=launch).port == 8200
    assert ServerSettings.resolve({"port": 8300}, fallback=launch).port == 8300


@pytest.mark.anyio
async def test_health_names_the_instance_in_its_body_and_header() -> None:
    """The platform's runner reads ``x-osmosis-rollout-instance-id``; v2 reads the body's."""
    settings = ServerSettings(instance_id="run-7-instance")
    app = create_app(load_agent(AGENT), settings=settings)
    transport = httpx2.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx2.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http,
    ):
        response = await http.get("/health")
    assert response.status_code == 200
    assert response.headers["x-osmosis-rollout-instance-id"] == "run-7-instance"
    assert response.json()["instance_id"] == "run-7-instance"


def test_osmosis_serve_listens_on_the_platforms_port_and_reports_its_instance(
    tmp_path: Path,
) -> None:
    """Started the platform's way (no --port), the server is where the controller will call."""
    port = free_port()
    env = clean_env(
        _OSMOSIS_ROLLOUT_PORT=str(port),
        _OSMOSIS_ROLLOUT_INSTANCE_ID="inst-abc",
        _OSMOSIS_ROLLOUT_NAME="calc",
        _OSMOSIS_ROLLOUT_ARTIFACT_ROOT=str(tmp_path / "artifacts"),
    )
    with osmosis_serve(tmp_path / "serve.log", AGENT, env=env) as served:
        assert served.port == port
        health = httpx2.get(f"{served.url}/health", timeout=10)
        banner = served.output()
    assert health.headers["x-osmosis-rollout-instance-id"] == "inst-abc"
    assert f"platform      rollout calc, instance inst-abc, artifacts {tmp_path}" in banner
    assert "warning" not in banner


def test_a_given_port_wins_with_a_warning(tmp_path: Path) -> None:
    """--port beats the platform's port, and the banner says the controller will miss it."""
    env = clean_env(_OSMOSIS_ROLLOUT_PORT=str(free_port()))
    with osmosis_serve(tmp_path / "serve.log", AGENT, "--port", "0", env=env) as served:
        banner = " ".join(served.output().split())
    assert f"_OSMOSIS_ROLLOUT_PORT is {env['_OSMOSIS_ROLLOUT_PORT']}" in banner
    assert "where the platform's controller will not call it" in banner


def test_serve_takes_the_platforms_port_when_none_is_given(tmp_path: Path) -> None:
    """The Python twin: serve(agent) with no port listens where _OSMOSIS_ROLLOUT_PORT says, and
    reports the platform's instance."""
    port = free_port()
    script = (
        "from osmosis_rollout.loader import load_agent\n"
        "from osmosis_rollout.server import serve\n"
        f"serve(load_agent({AGENT!r}))\n"
    )
    env = clean_env(_OSMOSIS_ROLLOUT_PORT=str(port), _OSMOSIS_ROLLOUT_INSTANCE_ID="py-twin")
    log = tmp_path / "serve.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-c", script],
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc, log, timeout=30)
        health = httpx2.get(f"http://127.0.0.1:{port}/health", timeout=10)
    finally:
        stop_process(proc)
    assert health.headers["x-osmosis-rollout-instance-id"] == "py-twin"


def test_serve_keywords_become_settings_with_the_port_left_for_the_platform() -> None:
    """serve(agent, host=...) builds the app's settings from its keywords: the bound host is
    the one the screening and the destination policy judge, and no port means "not given"."""
    from osmosis_rollout.server.serve import _settings_of

    settings, rest = _settings_of("0.0.0.0", None, "info", {"max_concurrent": 4, "client": None})
    assert (settings.host, settings.max_concurrent) == ("0.0.0.0", 4)
    assert "port" not in settings.model_fields_set
    assert rest == {"client": None}
    with pytest.raises(ConfigError, match=r"invalid serve\(\) settings: max_concurrent"):
        _settings_of("127.0.0.1", 9000, "info", {"max_concurrent": 0})


def test_a_bad_platform_variable_stops_osmosis_serve_with_one_line() -> None:
    """Exit 2 and an error naming the variable, before anything is bound."""
    from typer.testing import CliRunner

    from osmosis_rollout.cli import app

    result = CliRunner().invoke(app, ["serve", AGENT], env={"_OSMOSIS_ROLLOUT_PORT": "eighty"})
    assert result.exit_code == 2
    assert "_OSMOSIS_ROLLOUT_PORT='eighty' is not usable" in " ".join(result.stderr.split())
    assert "Traceback" not in result.output
