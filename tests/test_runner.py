"""The batch runner: findings fire on purpose-built bad agents and never on good ones."""

from __future__ import annotations

import contextlib
from typing import Any

import anyio
import httpx2
import pytest
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from osmosis_rollout.evaluation.runner import RowInput, RunOptions, run_batch, summarise
from osmosis_rollout.testing import Harness, MockLLMBackend

from .support import load_asset, serve_in_thread

pytestmark = pytest.mark.anyio

ROWS = [
    RowInput(index=i, messages=[{"role": "user", "content": f"question {i}"}]) for i in (1, 2, 3)
]


async def run_agent(agent: object, *, timeout_s: float = 10.0) -> list[set[str]]:
    async with Harness(agent, backend=MockLLMBackend(seed=1)) as harness:  # type: ignore[arg-type]
        report = await run_batch(harness, ROWS, RunOptions(timeout_s=timeout_s, concurrency=3))
    return [{f.code for f in row.findings} for row in report.rows]


@pytest.mark.parametrize(
    ("agent_name", "finding"),
    [
        ("RewritesHistoryAgent", "history_rewritten"),
        ("CompletesTwiceAgent", "duplicate_completion"),
        ("WrongKeyAgent", "bad_api_key"),
        ("UnknownToolAgent", "unknown_tool"),
    ],
)
async def test_each_finding_fires_on_its_bad_agent(agent_name: str, finding: str) -> None:
    """Every row of a purpose-built bad agent carries exactly the finding it provokes."""
    agent = getattr(load_asset("bad_agents"), agent_name)()
    for codes in await run_agent(agent):
        assert codes == {finding}


async def test_good_agents_have_no_findings() -> None:
    """The good test agent and the calculator example pass cleanly: no false positives."""
    good = load_asset("bad_agents").GoodAgent()
    calculator = load_asset("../../examples/calculator/agent").CalculatorAgent()
    for agent in (good, calculator):
        assert await run_agent(agent) == [set(), set(), set()]


async def test_rows_keep_dataset_order_and_summary_counts() -> None:
    """Results come back in dataset order with consistent totals, even when run concurrently."""
    agent = load_asset("../../examples/calculator/agent").CalculatorAgent()
    async with Harness(agent, backend=MockLLMBackend()) as harness:
        report = await run_batch(harness, ROWS, RunOptions(concurrency=2))
    assert [r.index for r in report.rows] == [1, 2, 3]
    summary = summarise(report)
    assert summary["passed"] == 3
    assert summary["failed"] == 0
    assert summary["tool_calls"] == sum(r.tool_calls for r in report.rows) > 0
    assert summary["latency_ms_p50"] <= summary["latency_ms_p95"]
    assert all(r.turns == 5 for r in report.rows)  # the mock walks 4 tools, then answers


async def test_a_slow_agent_fails_its_rows_at_the_timeout() -> None:
    """A rollout over the row timeout ends ERROR/timeout (the server's deadline), not a hang."""
    agent = load_asset("bad_agents").SlowAgent()
    async with Harness(agent, backend=MockLLMBackend(), rollout_timeout_s=0.3) as harness:
        with anyio.fail_after(10):
            report = await run_batch(harness, ROWS[:1], RunOptions(timeout_s=5))
    row = report.rows[0]
    assert row.status == "ERROR"
    assert row.finish_reason == "timeout"
    assert not row.passed


async def test_a_server_that_never_calls_back_gets_no_completion() -> None:
    """Against a server that accepts inits but never sends a callback: no_completion."""

    async def init(request: Request) -> JSONResponse:
        body = await request.json()
        return JSONResponse({"rollout_id": body["rollout_id"], "tools": []}, status_code=202)

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "healthy", "agent_loop": "rogue"})

    rogue = Starlette(
        routes=[
            Route("/v1/rollout/init", init, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
        ]
    )
    with serve_in_thread(rogue) as url:
        async with Harness(server_url=url, backend=MockLLMBackend()) as harness:
            report = await run_batch(harness, ROWS[:2], RunOptions(timeout_s=0.2))
    for row in report.rows:
        assert row.status == "NO_RESULT"
        assert {f.code for f in row.findings} == {"no_completion"}


async def test_a_row_without_a_result_shows_the_turns_the_mock_served() -> None:
    """A server that asks for two turns and never calls back: NO_RESULT, with the turns and
    tokens the mock served (docs/any-server.md: a row's figures are what the mock served)."""

    async def two_turns(body: dict[str, Any]) -> None:
        headers = {"authorization": f"Bearer {body['api_key']}"}
        messages = list(body["messages"])
        async with httpx2.AsyncClient() as http:
            for _ in range(2):
                chat = {"rollout_id": body["rollout_id"], "messages": messages}
                reply = await http.post(
                    f"{body['server_url']}/v1/chat/completions", json=chat, headers=headers
                )
                messages.append(reply.json()["choices"][0]["message"])
                messages.append({"role": "user", "content": "and again"})

    async def init(request: Request) -> JSONResponse:
        body = await request.json()
        answer = {"rollout_id": body["rollout_id"], "tools": []}
        return JSONResponse(answer, status_code=202, background=BackgroundTask(two_turns, body))

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "healthy", "agent_loop": "forgetful"})

    forgetful = Starlette(
        routes=[
            Route("/v1/rollout/init", init, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
        ]
    )
    with serve_in_thread(forgetful) as url:
        async with Harness(server_url=url, backend=MockLLMBackend()) as harness:
            report = await run_batch(harness, ROWS[:1], RunOptions(timeout_s=5))
    row = report.rows[0]
    assert row.status == "NO_RESULT"
    assert row.turns == 2
    assert row.prompt_tokens > 0
    assert row.response_tokens > 0
    assert len(row.turn_finish_reasons) == 2


async def test_a_row_that_cannot_be_sent_is_refused_and_the_rest_run() -> None:
    """A row whose metadata is over the limit is REFUSED with a reason; other rows still run."""
    agent = load_asset("bad_agents").GoodAgent()
    rows = [
        ROWS[0],
        RowInput(index=2, messages=ROWS[1].messages, metadata={"blob": "x" * (1024 * 1024 + 1)}),
    ]
    async with Harness(agent, backend=MockLLMBackend()) as harness:
        report = await run_batch(harness, rows, RunOptions())
    first, second = report.rows
    assert first.passed
    assert second.status == "REFUSED"
    assert "metadata" in (second.error_message or "")
    assert "xxxx" not in (second.error_message or "")  # the input is never echoed


async def test_an_agent_over_the_timeout_is_a_timeout_not_a_lost_callback() -> None:
    """The harness waits past the server's deadline, so a slow agent is reported as timeout."""
    agent = load_asset("bad_agents").SlowAgent()
    async with Harness(agent, backend=MockLLMBackend(), rollout_timeout_s=0.3) as harness:
        report = await run_batch(harness, ROWS[:1], RunOptions(timeout_s=0.3))
    row = report.rows[0]
    assert row.finish_reason == "timeout"
    assert [f.code for f in row.findings] == []


async def test_a_server_that_goes_away_stops_the_batch() -> None:
    """When a --server dies mid-batch, the batch stops: one row says why, the rest are skipped."""

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "healthy", "agent_loop": "x"})

    app = Starlette(routes=[Route("/health", health, methods=["GET"])])
    stack = contextlib.ExitStack()
    url = stack.enter_context(serve_in_thread(app))
    async with Harness(server_url=url, backend=MockLLMBackend()) as harness:
        stack.close()  # the server is gone before the first row
        rows = [RowInput(index=i, messages=ROWS[0].messages) for i in range(1, 6)]
        report = await run_batch(harness, rows, RunOptions(concurrency=1))
    statuses = [r.status for r in report.rows]
    assert statuses == ["REFUSED", "SKIPPED", "SKIPPED", "SKIPPED", "SKIPPED"]
    assert "cannot reach the rollout server" in (report.stopped_early or "")


async def test_a_retried_turn_is_not_a_history_rewrite() -> None:
    """A chat retried with the same X-Request-Id (its reply was lost) replaces that turn."""
    import httpx2

    from osmosis_rollout.testing import MockTrainGate, ScriptedBackend

    gate = MockTrainGate(ScriptedBackend([{"content": "one"}, {"content": "two"}]))
    gate.expect("r-1")
    first = {"rollout_id": "r-1", "messages": [{"role": "user", "content": "hi"}]}
    async with httpx2.AsyncClient(transport=gate.transport(), base_url="http://g") as http:
        for _ in range(2):  # the same turn twice
            sent = await http.post(
                "/v1/chat/completions", json=first, headers={"X-Request-Id": "r-1:1"}
            )
            assert sent.status_code == 200
        second = {
            "rollout_id": "r-1",
            "messages": [*first["messages"], {"role": "assistant", "content": "one"}],
        }
        await http.post("/v1/chat/completions", json=second, headers={"X-Request-Id": "r-1:2"})
    record = gate.records["r-1"]
    assert record.findings == []
    assert record.request_ids == ["r-1:1", "r-1:2"]
    assert [r.message.content for r in record.replies] == ["one", "two"]


def test_the_testing_package_still_reaches_its_submodules_as_attributes() -> None:
    """Their names load on first use; ``import osmosis_rollout.evaluation`` then
    ``osmosis_rollout.evaluation.runner.run_batch`` (what mypy accepts) must work as it did when
    the package imported its submodules eagerly, in a fresh interpreter."""
    import subprocess
    import sys

    script = (
        "import osmosis_rollout.evaluation as e\n"
        "import osmosis_rollout.testing as t\n"
        "assert callable(e.runner.run_batch)\n"
        "assert t.harness.Harness is t.Harness\n"
        "assert e.replay.ReplayBackend is t.ReplayBackend\n"
        "for package in (t, e):\n"
        "    for missing in ('no_such_module', '_private'):\n"
        "        try:\n"
        "            getattr(package, missing)\n"
        "        except AttributeError as exc:\n"
        "            assert missing in str(exc), exc\n"
        "        else:\n"
        "            raise AssertionError(missing)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_every_public_testing_name_still_imports_from_the_testing_package() -> None:
    """What users import in their pytest keeps working where the engine moved out
    (``DatasetRow``, ``load_dataset``, ``read_cassette``, ``ReplayBackend``... now live in
    ``osmosis_rollout.evaluation``), and still lazily: importing the package, or the ``--jobs``
    pool's module, imports neither the server nor the engine's runner, in a fresh interpreter."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "import osmosis_rollout.testing as t\n"
        "import osmosis_rollout.evaluation.parallel\n"
        "heavy = {'osmosis_rollout.server', 'osmosis_rollout.evaluation.runner'}\n"
        "assert not heavy & set(sys.modules), heavy & set(sys.modules)\n"
        "for name in t.__all__:\n"
        "    exec(f'from osmosis_rollout.testing import {name}')\n"
        "import osmosis_rollout.evaluation as e\n"
        "for name in e.__all__:\n"
        "    exec(f'from osmosis_rollout.evaluation import {name}')\n"
        "from osmosis_rollout.testing import ScriptedBackend, MockLLMBackend\n"
        "assert ScriptedBackend.__module__ == MockLLMBackend.__module__\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
