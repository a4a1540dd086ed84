"""``osmosis test --server URL`` / ``--launch CMD`` with ``--debug-dir``: the mock TrainGate writes
its side of each rollout as a trace (``testing/gate_trace.py``), on every wire and for servers
none of ours: a bare Starlette one launched by the command line, and ``osmosis serve`` over v2
and polling. The official osmosis-ai 0.3.2 server's run is in ``test_launch_sdk.py``."""

from __future__ import annotations

import contextlib
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from osmosis_rollout.evaluation import TestOptions, run_test
from osmosis_rollout.redaction import REDACTED
from osmosis_rollout.testing.harness import MOCK_API_KEY, MOCK_CALLBACK_KEY
from osmosis_rollout.trajectory import Trajectory, read_trace

from .processes import clean_env, osmosis_serve, stop_process
from .support import ASSETS, CALCULATOR, DATASET

pytestmark = pytest.mark.anyio

SERVER_KEY = "srv-key-for-the-trace-test-7f3a"
LLM_KEY = "sk-llm-key-for-the-trace-test-91c2"


def trace_lines(folder: Path) -> dict[str, list[dict[str, Any]]]:
    """Each trace file's records, by file name."""
    return {
        path.name: [json.loads(line) for line in path.read_text().splitlines()]
        for path in sorted(folder.glob("*.jsonl"))
    }


def assert_no_secrets(folder: Path, *secrets: str) -> None:
    """No trace holds a key, in any form the file could carry it."""
    for path in folder.iterdir():
        text = path.read_text()
        for secret in (MOCK_API_KEY, MOCK_CALLBACK_KEY, *secrets):
            assert secret not in text, (path.name, secret)


def events(records: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r for r in records if r["event"] == kind]


def assert_gate_side(trajectory: Trajectory, row: dict[str, Any], protocol: str) -> None:
    """What every trace of the mock's side says, checked against its results row."""
    assert trajectory.start["side"] == "traingate"
    assert trajectory.start["protocol"] == protocol
    assert trajectory.bad_lines == 0
    assert len(trajectory.turns) == row["turns"] > 0
    for turn in trajectory.turns:
        assert turn.reply is not None
        assert turn.reply["role"] == "assistant"
        assert turn.finish_reason in ("stop", "tool_calls")
        assert turn.usage["prompt_tokens"] > 0
        assert turn.usage["completion_tokens"] > 0
        assert turn.ts is not None
    assert [t.finish_reason for t in trajectory.turns] == row["turn_finish_reasons"]
    assert sum(t.usage["prompt_tokens"] for t in trajectory.turns) == row["prompt_tokens"]
    assert trajectory.end is not None
    assert trajectory.end["status"] == row["status"]
    assert trajectory.end["reward"] == row["reward"]
    assert trajectory.end["metrics"]["num_llm_calls"] == row["turns"]
    # the deltas put back together are the conversation the server reported
    assert trajectory.messages() == row["final_messages"]


def results_rows(path: Path) -> list[dict[str, Any]]:
    return [r for r in map(json.loads, path.read_text().splitlines()) if r.get("type") == "row"]


def test_launch_of_a_starlette_only_server_writes_the_gates_side(tmp_path: Path) -> None:
    """A v2 server written with bare Starlette and urllib: each rollout's trace holds its start
    and 202, the chat turn it asked for with the mock's reply, its two callbacks and the status
    answer (a 404: it has no status route), each timed; the run's last lines say where."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "".join(
            json.dumps({"user_prompt": f"Say {word}.", "ground_truth": word, "note": SERVER_KEY})
            + "\n"
            for word in ("yes", "no")
        )
    )
    command = shlex.join(
        [sys.executable, str(ASSETS / "foreign" / "starlette_health.py"), "rollout"]
    )
    traces, results = tmp_path / "traces", tmp_path / "results.jsonl"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "osmosis_rollout",
            "test",
            "--launch",
            command,
            "-d",
            str(rows),
            "--debug-dir",
            str(traces),
            "-o",
            str(results),
            "--timeout",
            "30",
            "--api-key",
            SERVER_KEY,
        ],
        cwd=tmp_path,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        stop_process(proc)  # type: ignore[arg-type]
    assert "Traceback" not in err
    assert f"traces written to {traces} (the mock TrainGate's side" in " ".join(err.split())
    found = results_rows(results)
    assert [r["status"] for r in found] == ["COMPLETED", "COMPLETED"], out + err
    files = trace_lines(traces)
    assert len(files) == 2
    for row in found:
        assert row["trace"] == f"traces/{row['rollout_id']}.jsonl"  # linked for osmosis view
        records = files[Path(row["trace"]).name]
        assert [r["event"] for r in records] == [
            "rollout_start", "start", "turn", "callback", "callback", "status", "rollout_end",
            "findings",
        ]  # fmt: skip
        assert all(r["rollout_id"] == row["rollout_id"] and r["ts"] > 0 for r in records)
        times = [r["ts"] for r in records[1:-2]]
        assert times == sorted(times)
        start, turn, completion, grader, status = records[1:6]
        assert (start["method"], start["path"], start["status_code"]) == ("POST", "/rollout", 202)
        assert start["body"]["llm_api_key"] == start["body"]["controller_api_key"] == REDACTED
        assert start["body"]["initial_messages"][-1]["content"] == f"Say {row['ground_truth']}."
        assert turn["messages"] == start["body"]["initial_messages"]
        assert turn["params"] == {"model": "default"}
        assert turn["reply"]["content"] == f"Answer to: Say {row['ground_truth']}."
        assert turn["finish_reason"] == "stop"
        assert turn["usage"]["completion_tokens"] > 0
        assert (completion["name"], completion["body"]["status"]) == ("completion", "success")
        assert (grader["name"], grader["body"]["sample"]["reward"]) == ("grader", 1.0)
        assert (status["method"], status["status_code"], status["answer"]) == (
            "GET",
            404,
            "Not Found",
        )
        assert all(r["latency_ms"] >= 0 for r in (start, turn, completion, grader, status))
        assert_gate_side(read_trace(traces / Path(row["trace"]).name), row, "v2")
    assert_no_secrets(traces, SERVER_KEY)


def rows_carrying_keys(tmp_path: Path) -> Path:
    """The calculator's first two rows, each with a column holding the keys of the run."""
    rows = tmp_path / "rows.jsonl"
    lines = Path(DATASET).read_text().splitlines()[:2]
    rows.write_text(
        "".join(
            json.dumps({**json.loads(line), "note": f"{SERVER_KEY} {LLM_KEY}"}) + "\n"
            for line in lines
        )
    )
    return rows


@pytest.mark.parametrize("protocol", ["v1", "v2", "polling"])
async def test_osmosis_serve_driven_by_the_mock_gets_a_trace_of_each_rollout(
    protocol: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Our own server in its own process, keyed, over each wire: the chat turns (on v2 and
    polling with the tools sent on each; v1 declares them in its 202), the result as that wire
    delivers it (v1: one callback; v2: two and a status answer; polling: the long polls'
    answers and the re-reads), and no key of any side in the files, not even one a dataset row
    carries."""
    monkeypatch.setenv("OPENAI_API_KEY", LLM_KEY)
    rows = rows_carrying_keys(tmp_path)
    traces, results = tmp_path / "traces", tmp_path / "results.jsonl"
    agent = CALCULATOR
    with osmosis_serve(
        tmp_path / "serve.log", agent, "--port", "0", "--api-key", SERVER_KEY
    ) as served:
        report = await run_test(
            TestOptions(
                server=served.url,
                api_key=SERVER_KEY,
                dataset=rows,
                protocol=protocol,
                debug_dir=traces,
                output=results,
                timeout=30,
            )
        )
    assert [r.status for r in report.rows] == ["COMPLETED", "COMPLETED"]
    found = results_rows(results)
    for row in found:
        trace = traces / f"{row['rollout_id']}.jsonl"
        assert row["trace"] == f"traces/{trace.name}"
        trajectory = read_trace(trace)
        assert_gate_side(trajectory, row, protocol)
        assert trajectory.start["agent"] == "calculator"
        assert trajectory.start["tools"] == ["add", "subtract", "multiply", "divide"]
        assert [t.delta_from for t in trajectory.turns] == [0, 3, 5, 7, 9]  # deltas, not copies
        records = trace_lines(traces)[trace.name]
        start = events(records, "start")[0]
        assert start["status_code"] == 202
        if protocol == "v1":
            assert start["path"] == "/v1/rollout/init"
            assert [t["function"]["name"] for t in start["answer"]["tools"]] == trajectory.start[
                "tools"
            ]
            assert all(t.tools is None for t in trajectory.turns)  # none sent with a call
            [completed] = events(records, "callback")
            assert completed["name"] == "completed"
            assert completed["body"]["final_messages"] == row["final_messages"]
            assert events(records, "status") == []
            continue
        tools = ["add", "subtract", "multiply", "divide"]
        assert all(t.tools == tools for t in trajectory.turns)
        schemas = [r for r in records if "tool_schemas" in r]
        assert len(schemas) == 1
        assert schemas[0]["turn"] == 1
        if protocol == "v2":
            assert [c["name"] for c in events(records, "callback")] == ["completion", "grader"]
            assert events(records, "status")[-1]["answer"]["status"] == "success"
        else:
            assert events(records, "callback") == []
            assert start["answer"]["polling_lease_token"] == REDACTED
            polls = events(records, "poll")
            assert polls[0]["path"] == f"/rollout/{row['rollout_id']}/result"
            finished = [
                p for p in polls if p["status_code"] == 200 and p["answer"]["status"] == "success"
            ]
            assert len(finished) == 2  # the result, then the second read of it
            assert finished[0]["answer"]["sample"]["messages"] == row["final_messages"]
            assert polls[-1]["status_code"] == 403  # the read with a wrong lease
    assert_no_secrets(traces, SERVER_KEY, LLM_KEY)


async def test_interactive_with_server_traces_the_stepped_rollout(tmp_path: Path) -> None:
    """`osmosis test -i --server URL --debug-dir DIR` used to be refused too: the stepped
    rollout's trace is the mock's side, as in a batch."""
    import anyio
    from prompt_toolkit import PromptSession
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput
    from rich.console import Console

    from osmosis_rollout.repl import run_repl
    from osmosis_rollout.server import create_app
    from osmosis_rollout.testing import ScriptedBackend

    from .support import serve_in_thread
    from .test_repl import ROWS, Screen, add_call, calculator

    traces = tmp_path / "traces"
    app = create_app(calculator(), api_key=SERVER_KEY, shutdown_grace_s=0)
    with serve_in_thread(app, lifespan="on") as url, create_pipe_input() as pipe:
        session: PromptSession[str] = PromptSession(input=pipe, output=DummyOutput())
        pipe.send_text("c\nq\n")
        pipe.close()
        with anyio.fail_after(20):
            code = await run_repl(
                None,
                backend=ScriptedBackend([add_call(12, 30), {"content": "42"}]),
                rows=ROWS,
                start_row=1,
                server_url=url,
                server_key=SERVER_KEY,
                debug_dir=traces,
                session=session,
                console=Console(file=Screen(), width=120),
            )
    assert code == 0
    [trace] = traces.iterdir()
    trajectory = read_trace(trace)
    assert trajectory.start["side"] == "traingate"
    assert [t.reply["content"] if t.reply else None for t in trajectory.turns] == [None, "42"]
    assert trajectory.end is not None
    assert trajectory.end["status"] == "COMPLETED"
    assert_no_secrets(traces, SERVER_KEY)


async def test_a_refused_start_and_a_server_gone_are_traced_too(tmp_path: Path) -> None:
    """A start answered 503 leaves a trace saying REFUSED with the answer; a server that went
    away between two rows leaves the start that failed in transit and NO_RESULT."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from osmosis_rollout.testing.harness import Harness, ServerUnreachable

    from .support import serve_in_thread

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def busy(request: Request) -> JSONResponse:
        return JSONResponse({"detail": "no slot free"}, status_code=503)

    server = Starlette(routes=[Route("/health", health), Route("/rollout", busy, methods=["POST"])])
    hi = [{"role": "user", "content": "hi"}]
    with serve_in_thread(server) as url:
        async with Harness(
            server_url=url, debug_dir=tmp_path, protocol="v2", server_key=SERVER_KEY
        ) as harness:
            outcome = await harness.run(hi, rollout_id="refused")
            assert outcome.init_status == 503
    [start, end] = [
        r for r in trace_lines(tmp_path)["refused.jsonl"] if r["event"] != "rollout_start"
    ]
    assert (start["event"], start["status_code"], start["answer"]) == (
        "start",
        503,
        {"detail": "no slot free"},
    )
    assert (end["status"], end["error_message"]) == ("REFUSED", "the start was answered HTTP 503")

    async with contextlib.AsyncExitStack() as stack:
        with serve_in_thread(server) as url:  # up for the harness's probe of /health
            gate = Harness(server_url=url, debug_dir=tmp_path, protocol="v2")
            harness = await stack.enter_async_context(gate)
        with pytest.raises(ServerUnreachable):  # and gone by the first row
            await harness.run(hi, rollout_id="gone")
    records = trace_lines(tmp_path)["gone.jsonl"]
    assert [r["event"] for r in records] == ["rollout_start", "start", "rollout_end"]
    assert records[1]["error"].startswith("TransportFailure")
    assert records[2]["status"] == "NO_RESULT"
    assert_no_secrets(tmp_path, SERVER_KEY)


async def test_a_cancel_asked_while_the_rollout_runs_is_in_its_trace(tmp_path: Path) -> None:
    """The REPL's Ctrl-C on a server in another process (``Harness.cancel_remote``) is one of
    the rollout's calls: its answer is in the trace beside the controller's own cancel at the
    deadline, for a server that takes a rollout and never ends it."""
    import anyio
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from osmosis_rollout.testing.harness import Harness

    from .support import serve_in_thread

    started = anyio.Event()

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def accept(request: Request) -> JSONResponse:
        started.set()
        return JSONResponse({"rollout_id": "stuck"}, status_code=202)

    async def cancel(request: Request) -> JSONResponse:
        return JSONResponse({"dispositions": {"stuck": "cancelled_running"}})

    routes = [
        Route("/health", health),
        Route("/rollout", accept, methods=["POST"]),
        Route("/rollout/cancel", cancel, methods=["POST"]),
    ]
    hi = [{"role": "user", "content": "hi"}]
    with serve_in_thread(Starlette(routes=routes)) as url:
        gate = Harness(server_url=url, debug_dir=tmp_path, protocol="v2", v2_slack_s=0.2)
        async with gate as harness, anyio.create_task_group() as tasks:
            tasks.start_soon(lambda: harness.run(hi, rollout_id="stuck", timeout_s=0.2))
            await started.wait()
            assert await harness.cancel_remote("stuck") is True
    records = trace_lines(tmp_path)["stuck.jsonl"]
    cancels = events(records, "cancel")
    assert len(cancels) == 2  # the one asked, then the controller's at the deadline
    for answer in cancels:
        assert (answer["method"], answer["path"], answer["status_code"]) == (
            "POST",
            "/rollout/cancel",
            200,
        )
        assert answer["body"] == {"ids": ["stuck"]}
    assert records[-2]["status"] == "NO_RESULT"
