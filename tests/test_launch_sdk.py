"""``osmosis test --launch`` on real official servers: a rollout written with osmosis-ai 0.3's
public API the way its scaffold writes one (``tests/assets/foreign/sdk_rollout/main.py``), run
unchanged in the SDK's own Python 3.12 venv (``tests/peer_sdk.py``, never ours), with and
without a grader. 0.3.2 is the last release of the callback wire (v2); 0.3.8 speaks the polling
wire, found from its ``/health`` with no ``--protocol``."""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from osmosis_rollout.evaluation import TestOptions, run_test
from osmosis_rollout.evaluation.launch import LaunchSpec
from osmosis_rollout.evaluation.run import RunObserver
from osmosis_rollout.testing.harness import MOCK_API_KEY, MOCK_CALLBACK_KEY
from osmosis_rollout.trajectory import read_trace

from .peer_sdk import python_of, sdk_venv
from .support import ASSETS

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

ROLLOUT = ASSETS / "foreign" / "sdk_rollout"
ROWS = [
    {"user_prompt": "What is 6*7?", "ground_truth": "42", "mock_replies": [{"content": "42."}]},
    {"user_prompt": "What is 2+2?", "ground_truth": "4", "mock_replies": [{"content": "4, so."}]},
]


@pytest.fixture(scope="module")
def sdk_032() -> Path:
    """osmosis-ai 0.3.2 (the callback wire) in its cached Python 3.12+ venv."""
    return python_of(sdk_venv("0.3.2"))


class _Said(RunObserver):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, message: str) -> None:
        self.lines.append(message)


def _rows(tmp_path: Path) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return path


def _options(python: Path, tmp_path: Path, **env: str) -> TestOptions:
    spec = LaunchSpec(shlex.join([str(python), "main.py"]), cwd=ROLLOUT, env=env)
    return TestOptions(launch=spec, dataset=_rows(tmp_path), protocol=None, timeout=20)


async def test_the_scaffolds_rollout_runs_unchanged_with_the_mocks_figures(
    sdk_032: Path, tmp_path: Path
) -> None:
    said = _Said()
    report = await run_test(_options(sdk_032, tmp_path), said)
    assert any(line.startswith("protocol v2:") for line in said.lines), said.lines
    for row in report.rows:
        assert row.status == "COMPLETED", row.error_message
        assert row.reward == 1.0
        # what the mock served, not the server's metrics: it sends none
        assert row.turns == 1
        assert row.prompt_tokens > 0
        assert row.response_tokens > 0
        assert row.turn_finish_reasons == ["stop"]
        assert row.latency_ms > 0
    summary: Any = report.summary
    assert summary["prompt_tokens"] == sum(r.prompt_tokens for r in report.rows)
    # its LocalBackend keeps no status, its start needs no key and answers no id, and the
    # conformance probes (on by default with --launch) find D3, D4 and D6: one run-level
    # finding each, and the rows pass
    assert [f["code"] for f in summary["run_findings"]] == [
        "status_unsupported",
        "init_without_key",
        "init_without_id",
        "error_echoes_secrets",
        "bad_input_server_error",
        "duplicate_rollout_run_twice",
    ]
    assert all(row.passed for row in report.rows)
    assert report.exit_code == 0


async def test_the_official_servers_rollouts_are_traced_from_the_mocks_side(
    sdk_032: Path, tmp_path: Path
) -> None:
    """--debug-dir with the official server: the mock TrainGate writes its side of each rollout
    (the start and its 202, the chat turn with the mock's reply and token counts, both
    callbacks, the status answer), linked from the results rows, with none of its keys."""
    traces, results = tmp_path / "traces", tmp_path / "results.jsonl"
    options = dataclasses.replace(_options(sdk_032, tmp_path), debug_dir=traces, output=results)
    report = await run_test(options)
    assert [row.status for row in report.rows] == ["COMPLETED", "COMPLETED"]
    rows = [json.loads(line) for line in results.read_text().splitlines()[:2]]
    for row, wanted in zip(rows, ROWS, strict=True):
        assert row["trace"] == f"traces/{row['rollout_id']}.jsonl"
        trace = traces / f"{row['rollout_id']}.jsonl"
        records = [json.loads(line) for line in trace.read_text().splitlines()]
        assert [r["event"] for r in records] == [
            "rollout_start", "start", "turn", "callback", "callback", "status", "rollout_end",
            "findings",
        ]  # fmt: skip
        start, turn, completion, grader, status = records[1:6]
        assert records[0]["side"] == "traingate"
        # its 202 carries no rollout_id (init_without_id): an empty object
        assert (start["path"], start["status_code"], start["answer"]) == ("/rollout", 202, {})
        assert turn["messages"] == [{"role": "user", "content": wanted["user_prompt"]}]
        assert turn["reply"]["content"] == wanted["mock_replies"][0]["content"]
        assert turn["finish_reason"] == "stop"
        assert turn["usage"]["prompt_tokens"] == row["prompt_tokens"] > 0
        assert completion["body"]["status"] == "success"
        assert grader["body"]["sample"]["reward"] == 1.0
        assert (status["status_code"], status["answer"]["status"]) == (200, "unknown")
        assert records[6]["status"] == "COMPLETED"
        assert records[6]["reward"] == 1.0
        trajectory = read_trace(trace)
        assert trajectory.messages() == row["final_messages"]
        text = trace.read_text()
        assert MOCK_API_KEY not in text
        assert MOCK_CALLBACK_KEY not in text


async def test_strict_fails_the_rows_of_a_server_without_status(
    sdk_032: Path, tmp_path: Path
) -> None:
    options = dataclasses.replace(_options(sdk_032, tmp_path), strict=True)
    report = await run_test(options)
    assert "status_unsupported" in [f["code"] for f in report.summary["run_findings"]]
    assert {f.code for f in report.findings} == {
        "status_wrong",
        "init_without_key",
        "init_without_id",
    }
    assert report.exit_code == 1


async def test_a_rollout_without_a_grader_is_reported_without_a_reward(
    sdk_032: Path, tmp_path: Path
) -> None:
    report = await run_test(_options(sdk_032, tmp_path, NO_GRADER="1"))
    for row in report.rows:
        assert row.status == "ERROR"
        assert row.reward is None
        assert row.turns == 1  # the workflow ran: its chat turn was served
    assert report.exit_code == 1


async def test_the_scaffolds_rollout_on_osmosis_ai_038_runs_over_polling(tmp_path: Path) -> None:
    python = python_of(sdk_venv("0.3.8"))
    said = _Said()
    report = await run_test(_options(python, tmp_path), said)
    assert any(line.startswith("protocol polling:") for line in said.lines), said.lines
    for row in report.rows:
        assert row.status == "COMPLETED", (row.error_message, row.findings)
        assert row.reward == 1.0
        assert row.turns == 1
        assert row.prompt_tokens > 0
    assert report.exit_code == 0, report.findings


async def test_the_conformance_probes_find_what_osmosis_ai_032_does(
    sdk_032: Path, tmp_path: Path
) -> None:
    said = _Said()
    report = await run_test(_options(sdk_032, tmp_path), said)
    found = {f["code"]: f for f in report.summary["run_findings"]}
    # FastAPI's default 422 echoes the whole body of a start missing a field, both keys in it
    assert found["error_echoes_secrets"]["details"] == {
        "http": 422,
        "echoed": ["llm_api_key", "controller_api_key"],
    }
    # the NaN timeout's 422 cannot be encoded (its input is NaN): a text 500; -1 is accepted
    assert found["bad_input_server_error"]["details"] == {"answers": {"NaN": 500}}
    # no deduplication: the repeated init is accepted and run again, callbacks and all
    rerun = found["duplicate_rollout_run_twice"]["details"]
    assert rerun["http"] == 202
    assert rerun["chat_calls"] == 1
    assert rerun["callbacks"] == 2
    assert any(line.startswith("conformance: 3 probe(s)") for line in said.lines), said.lines


async def test_the_conformance_probes_find_what_osmosis_ai_038_does(tmp_path: Path) -> None:
    python = python_of(sdk_venv("0.3.8"))
    report = await run_test(_options(python, tmp_path))
    found = {f["code"]: f for f in report.summary["run_findings"]}
    conformance = {"error_echoes_secrets", "bad_input_server_error", "duplicate_rollout_run_twice"}
    # a repeated rollout_id is a 409 since 0.3.3; the 422's echo and the NaN's 500 remain
    assert conformance & set(found) == {"error_echoes_secrets", "bad_input_server_error"}
    assert found["error_echoes_secrets"]["details"] == {"http": 422, "echoed": ["llm_api_key"]}
    assert found["bad_input_server_error"]["details"] == {"answers": {"NaN": 500}}
    assert report.summary["conformance"]["notes"] == []  # the repeated id's rollout was judged
    assert report.exit_code == 0


async def test_osmosis_ai_038_forced_onto_v2_is_warned_of_before_any_row(tmp_path: Path) -> None:
    from osmosis_rollout.evaluation.served import served

    python = python_of(sdk_venv("0.3.8"))
    warned: list[str] = []
    options = dataclasses.replace(_options(python, tmp_path), protocol="v2")
    async with served(options, lambda line: None, warned.append) as live:
        assert live.wire.protocol == "v2"  # kept: the user may mean it
    assert warned == [
        "--protocol v2 given, but /health shows the polling wire (osmosis-ai 0.3.3 or later): "
        "rollouts will likely never end (it sends no callback); drop --protocol to use polling"
    ]


async def test_a_polling_start_to_osmosis_ai_032_names_the_wire_it_speaks(
    sdk_032: Path, tmp_path: Path
) -> None:
    options = dataclasses.replace(_options(sdk_032, tmp_path), protocol="polling")
    report = await run_test(dataclasses.replace(options, conformance=False))
    for row in report.rows:
        assert row.status == "REFUSED"
        message: Any = row.error_message
        assert "HTTP 422: completion_callback_url: Field required" in message, message
        assert "try --protocol v2" in message
        assert MOCK_API_KEY not in message  # the 422's echoed body is not shown
