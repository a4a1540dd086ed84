"""The conformance probes of ``osmosis test`` (``evaluation/conformance.py``): after the rows, a
malformed start carrying made-up keys, a NaN and a negative timeout, and a finished rollout's
init sent again, each a run-level finding citing the protocol page's line on its risk. Here on a
server of nothing but Starlette with each defect (``tests/assets/foreign/starlette_v2.py``) and
on our own ``osmosis serve``; the official SDK's servers are in tests/test_launch_sdk.py."""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from osmosis_rollout.cli import app
from osmosis_rollout.errors import ConfigError
from osmosis_rollout.evaluation import TestOptions, run_test
from osmosis_rollout.evaluation import conformance as conformance_module
from osmosis_rollout.evaluation.launch import LaunchSpec, launch
from osmosis_rollout.evaluation.run import RunObserver
from osmosis_rollout.testing import Harness

from .support import ASSETS, ROOT

pytestmark = pytest.mark.anyio

SERVER = ASSETS / "foreign" / "starlette_v2.py"
PROBES = {"error_echoes_secrets", "bad_input_server_error", "duplicate_rollout_run_twice"}
ROW = {"user_prompt": "What is 2+2?", "ground_truth": "4", "mock_replies": [{"content": "4"}]}


class _Said(RunObserver):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, message: str) -> None:
        self.lines.append(message)

    def warn(self, message: str) -> None:
        self.lines.append(message)


def _rows(tmp_path: Path) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(ROW) + "\n")
    return path


def _spec(mode: str, tmp_path: Path) -> LaunchSpec:
    return LaunchSpec(shlex.join([sys.executable, str(SERVER), mode]), cwd=tmp_path)


def _probed(summary: dict[str, Any]) -> dict[str, str]:
    return {f["code"]: f["message"] for f in summary["run_findings"] if f["code"] in PROBES}


def test_each_cited_line_of_the_protocol_page_explains_its_risk() -> None:
    page = (ROOT / "docs" / "protocol-v2.md").read_text().splitlines()
    for cited, words in (
        (conformance_module.WHY_ECHO, "puts both keys in those logs"),
        (conformance_module.WHY_SERVER_ERROR, "a `5xx` (D4) says the server failed"),
        (conformance_module.WHY_DUPLICATE, "runs the rollout twice"),
    ):
        line = int(cited.rsplit(":", 1)[1])
        assert words in page[line - 1], cited


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("echo", {"error_echoes_secrets"}),
        ("crash", {"bad_input_server_error"}),
        ("rerun", {"duplicate_rollout_run_twice"}),
        ("sound", set()),
        ("echo,crash,rerun", PROBES),
    ],
)
async def test_a_launched_servers_defects_are_one_run_finding_each(
    mode: str, expected: set[str], tmp_path: Path
) -> None:
    said = _Said()
    options = TestOptions(launch=_spec(mode, tmp_path), dataset=_rows(tmp_path), protocol=None)
    report = await run_test(options, said)
    found = _probed(report.summary)
    assert set(found) == expected
    for code, message in found.items():
        assert "docs/protocol-v2.md:" in message, (code, message)
    if "error_echoes_secrets" in found:
        assert "llm_api_key and the controller_api_key" in found["error_echoes_secrets"]
        assert "osmosis-canary" not in found["error_echoes_secrets"]  # the keys are not repeated
    if "duplicate_rollout_run_twice" in found:
        assert "HTTP 202" in found["duplicate_rollout_run_twice"]
    part = report.summary["conformance"]
    assert part["probes"] == 3
    assert part["requests"] >= 5
    assert sorted(part["findings"]) == sorted(expected)
    assert any(line.startswith("conformance: 3 probe(s)") for line in said.lines), said.lines
    # the rows are the server's rollouts: the probes fail none of them, and only --strict fails
    # the run on them
    assert [row.passed for row in report.rows] == [True]
    assert report.exit_code == 0


async def test_strict_fails_the_run_on_a_probes_finding(tmp_path: Path) -> None:
    def keyed(mode: str) -> LaunchSpec:
        return dataclasses.replace(_spec(mode, tmp_path), env={"SERVER_KEY": "s3cret"})

    options = TestOptions(
        launch=keyed("crash"), dataset=_rows(tmp_path), protocol=None, strict=True, api_key="s3cret"
    )
    report = await run_test(options)
    assert report.summary["run_findings"] == [
        f for f in report.summary["run_findings"] if f["code"] == "bad_input_server_error"
    ]
    assert report.summary["conformance"]["fails_run"] is True
    assert [row.passed for row in report.rows] == [True]
    assert report.exit_code == 1
    sound = await run_test(dataclasses.replace(options, launch=keyed("sound")))
    assert sound.summary["run_findings"] == []
    assert sound.summary["conformance"]["fails_run"] is False
    assert sound.exit_code == 0


async def test_a_running_server_is_probed_only_when_asked(tmp_path: Path) -> None:
    async with launch(_spec("echo,crash,rerun", tmp_path)) as server:
        options = TestOptions(server=server.url, dataset=_rows(tmp_path), protocol=None)
        quiet = await run_test(options)
        assert "conformance" not in quiet.summary
        assert not _probed(quiet.summary)
        asked = await run_test(dataclasses.replace(options, conformance=True))
        assert set(_probed(asked.summary)) == PROBES
    off = TestOptions(
        launch=_spec("echo", tmp_path), dataset=_rows(tmp_path), protocol=None, conformance=False
    )
    report = await run_test(off)
    assert "conformance" not in report.summary
    assert not _probed(report.summary)


async def test_conformance_in_process_is_refused(tmp_path: Path) -> None:
    options = TestOptions(
        target=f"{ASSETS / 'v2_interop_agent.py'}:InteropAgent",
        dataset=_rows(tmp_path),
        conformance=True,
    )
    with pytest.raises(ConfigError, match="--launch CMD or --server URL"):
        await run_test(options)


def test_the_command_refuses_conformance_in_process_and_says_when_it_probed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    rows = _rows(tmp_path)
    runner = CliRunner()
    refused = runner.invoke(
        app,
        [
            "test",
            f"{ASSETS / 'v2_interop_agent.py'}:InteropAgent",
            "-d",
            str(rows),
            "--conformance",
        ],
    )
    assert refused.exit_code == 2, refused.output
    assert "--conformance" in refused.output
    assert "Traceback" not in refused.output
    ran = runner.invoke(
        app,
        ["test", "--launch", shlex.join([sys.executable, str(SERVER), "echo"]), "-d", str(rows)],
    )
    assert ran.exit_code == 0, ran.output
    assert "conformance: 3 probe(s) of POST /rollout sent" in ran.output
    assert "error_echoes_secrets" in ran.output


@pytest.mark.parametrize("protocol", ["v2", "polling"])
async def test_our_own_server_shows_no_probe_finding(protocol: str, tmp_path: Path) -> None:
    agent = f"{ASSETS / 'v2_interop_agent.py'}:InteropAgent"
    command = [sys.executable, "-m", "osmosis_rollout", "serve", agent, "--no-validate"]
    spec = LaunchSpec(shlex.join(command), cwd=tmp_path, env={"OSMOSIS_API_KEY": "s3cret"})
    options = TestOptions(
        launch=spec, dataset=_rows(tmp_path), protocol=protocol, api_key="s3cret", strict=True
    )
    report = await run_test(options)
    part = report.summary["conformance"]
    assert part["probes"] == 3
    assert part["findings"] == []
    assert part["notes"] == []  # the repeated-id probe's rollout finished: it was judged
    assert report.summary["run_findings"] == []
    assert report.exit_code == 0, [r.findings for r in report.rows]


async def test_a_server_whose_rollouts_never_end_is_not_asked_to_repeat_one(
    tmp_path: Path,
) -> None:
    # the repeated-id probe needs a rollout that ends: after a run where none did, it is left
    # out (and said), and the other two are sent
    async with (
        launch(_spec("rerun", tmp_path)) as server,
        Harness(server_url=server.url, protocol="v2") as harness,
    ):
        done = await conformance_module.probe_server(harness, rollouts_end=False)
    assert done.probes == 2
    assert done.notes == [
        "no row's rollout ended on this server, so a repeated rollout_id was not probed"
    ]
    assert done.findings == []


async def test_asking_for_probes_on_protocol_v1_says_there_are_none(tmp_path: Path) -> None:
    agent = f"{ASSETS / 'v2_interop_agent.py'}:InteropAgent"
    command = [sys.executable, "-m", "osmosis_rollout", "serve", agent, "--no-validate"]
    spec = LaunchSpec(shlex.join(command), cwd=tmp_path, env={"OSMOSIS_API_KEY": "s3cret"})
    said = _Said()
    options = TestOptions(
        launch=spec, dataset=_rows(tmp_path), protocol=None, api_key="s3cret", conformance=True
    )
    report = await run_test(options, said)  # our /health names its agent_loop: v1
    assert "conformance" not in report.summary
    assert any("--conformance: protocol v1 has no probes" in line for line in said.lines)
    assert report.exit_code == 0
