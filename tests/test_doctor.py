"""osmosis doctor: each check ok / warn / fail with a reason and a fix, as JSON; exit 1 on fail."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from osmosis_rollout.doctor import PROGRAMS
from osmosis_rollout.scaffold import create_project

from .openai_stub import OpenAIStub


def doctor(project: Path, *args: str, path: str | None = None, **env: str) -> tuple[int, Any]:
    """``osmosis doctor --json`` run in ``project`` as its own process (each run imports the
    agent afresh): (exit code, the report)."""
    environ = {
        k: v for k, v in os.environ.items() if not k.startswith(("OSMOSIS_", "OPENAI_", "PYTEST_"))
    }
    environ.update({"OSMOSIS_PORT": "0", **env})
    if path is not None:
        environ["PATH"] = path
    proc = subprocess.run(
        [sys.executable, "-m", "osmosis_rollout", "doctor", "--json", *args],
        cwd=project,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def checks(report: Any) -> dict[str, Any]:
    return {check["name"]: check for check in report["checks"]}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    dest = tmp_path / "demo"
    create_project(dest, name="demo", template="tools")
    return dest


def test_a_fresh_project_passes_every_check(project: Path) -> None:
    code, report = doctor(project)
    assert code == 0
    assert report["version"] == 1
    assert report["ok"] is True
    found = checks(report)
    assert {"python", "packages", "project", "agent", "validate", "dataset", "llm", "port"} <= set(
        found
    )
    for check in report["checks"]:
        assert check["status"] in ("ok", "warn", "fail")
        assert check["reason"]
    assert found["project"]["details"]["target"] == "demo.agent:DemoAgent"
    rows = found["dataset"]["details"]["first_rows"]
    assert len(rows) == 3
    assert rows[0]["ground_truth"] == "42"
    assert found["packages"]["details"]["versions"]["osmosis-rollout"]


def _fake_programs(folder: Path, names: list[str]) -> None:
    folder.mkdir(exist_ok=True)
    for name in names:
        exe = folder / name
        exe.write_text("#!/bin/sh\nexit 0\n")
        exe.chmod(exe.stat().st_mode | stat.S_IEXEC)


@pytest.mark.skipif(sys.platform == "win32", reason="PATH and executables as on POSIX")
def test_optional_programs_found_or_missing_on_path(project: Path, tmp_path: Path) -> None:
    """Without redis-server, bwrap and chromium on PATH each is a warning with its install
    line; with them, each is ok and names where it was found. Neither fails the run."""
    bare = tmp_path / "bare"
    bare.mkdir()
    code, report = doctor(project, path=str(bare))
    assert code == 0
    found = checks(report)
    for name, _, _, install in PROGRAMS:
        assert found[name]["status"] == "warn"
        assert found[name]["fix"] == install
        assert "not found" in found[name]["reason"]

    tools = tmp_path / "tools"
    _fake_programs(tools, ["redis-server", "bwrap", "chromium"])
    code, report = doctor(project, path=str(tools))
    assert code == 0
    found = checks(report)
    for name, *_ in PROGRAMS:
        assert found[name]["status"] == "ok"
        assert found[name]["details"]["path"].startswith(str(tools))


def test_an_agent_that_does_not_import_fails_and_exits_1(project: Path) -> None:
    (project / "demo" / "agent.py").write_text("import nowhere_to_be_found\n")
    code, report = doctor(project)
    assert code == 1
    assert report["ok"] is False
    agent = checks(report)["agent"]
    assert agent["status"] == "fail"
    assert "nowhere_to_be_found" in agent["reason"]
    assert agent["fix"]
    assert "validate" not in checks(report)  # nothing to check statically


def test_a_bad_dataset_fails(project: Path) -> None:
    (project / "dataset.jsonl").write_text('{"user_prompt": "hi"}\nnot json\n')
    code, report = doctor(project)
    assert code == 1
    assert checks(report)["dataset"]["status"] == "fail"


def test_no_project_warns(tmp_path: Path) -> None:
    code, report = doctor(tmp_path)
    assert code == 0
    assert checks(report)["project"]["status"] == "warn"
    assert "agent" not in checks(report)


def test_the_llm_is_reached_and_its_key_never_printed(project: Path) -> None:
    secret = "sk-doctor-secret-123456"
    with OpenAIStub().serve() as base_url:
        code, report = doctor(project, OPENAI_BASE_URL=base_url, OPENAI_API_KEY=secret)
    llm = checks(report)["llm"]
    assert code == 0
    assert llm["status"] == "ok"
    assert llm["details"]["key_set"] is True
    assert llm["details"]["status"] == 200
    assert secret not in json.dumps(report)

    code, report = doctor(project, OPENAI_BASE_URL="http://127.0.0.1:9/v1", OPENAI_API_KEY=secret)
    llm = checks(report)["llm"]
    assert llm["status"] == "warn"
    assert "not reachable" in llm["reason"]
    assert secret not in json.dumps(report)


def test_a_taken_port_warns(project: Path) -> None:
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        code, report = doctor(project, OSMOSIS_PORT=str(port))
    found = checks(report)["port"]
    assert code == 0
    assert found["status"] == "warn"
    assert found["details"]["port"] == port
    assert "--port" in found["fix"]


def test_a_bad_port_setting_fails(project: Path) -> None:
    code, report = doctor(project, OSMOSIS_PORT="not-a-port")
    assert code == 1
    assert checks(report)["port"]["status"] == "fail"


def test_a_dependency_missing_from_the_install_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """An install older than its pyproject (a dependency added since) is named, not left to
    surface as the agent's import error."""
    from osmosis_rollout import doctor as doctor_module

    assert "pydantic" in doctor_module._requirements()
    monkeypatch.setattr(doctor_module, "_requirements", lambda: ["pydantic", "no-such-dist-xyz"])
    check = doctor_module._packages()
    assert check.status == "fail"
    assert check.reason == "missing: no-such-dist-xyz"
    assert check.details["versions"]["pydantic"]
