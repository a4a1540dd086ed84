"""Protocol v2 interop: our ``osmosis serve`` (a real subprocess on 127.0.0.1) driven by the mock
TrainGate's v2 controller, which follows the spec's §11; every callback body, status answer and
cancel disposition is checked, for success, an agent error, a timeout, a cancel while queued and
while running, 429 under a full server, and a duplicate init. Then ``osmosis test --protocol v2``
runs every template (through ``osmosis init``) and example agent unchanged, offline."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import pytest

from osmosis_rollout.protocol import RolloutRequest
from osmosis_rollout.scaffold import list_templates
from osmosis_rollout.testing import Harness, MockLLMBackend
from osmosis_rollout.testing.harness import MOCK_API_KEY, MOCK_CALLBACK_KEY, RolloutOutcome
from osmosis_rollout.testing.wire import HttpxCalls
from osmosis_rollout.testing.wire.v2 import start_body

from .processes import REPO, ServeProcess, clean_env, osmosis_serve

pytestmark = pytest.mark.anyio

AGENT = f"{REPO}/tests/assets/v2_interop_agent.py:InteropAgent"
SERVER_KEY = "interop-server-key-0123"
QUESTION = [{"role": "user", "content": "What is 3 + 4?"}]


@contextmanager
def _serve(log: Path) -> Iterator[ServeProcess]:
    """One slot and one queue place, so that two slow rollouts fill it (the 429 case)."""
    args = [AGENT, "--port", "0", "--max-concurrent", "1", "--max-queued", "1"]
    with osmosis_serve(log, *args, env=clean_env(OSMOSIS_API_KEY=SERVER_KEY)) as served:
        yield served


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """The server most cases share (each leaves nothing running)."""
    with _serve(tmp_path_factory.mktemp("v2-interop") / "serve.log") as served:
        yield served


@pytest.fixture
def fresh_server(tmp_path: Path) -> Iterator[ServeProcess]:
    """A server of its own, for the cases that fill its queue."""
    with _serve(tmp_path / "serve.log") as served:
        yield served


@asynccontextmanager
async def controller(server: ServeProcess) -> AsyncIterator[Harness]:
    harness = Harness(
        server_url=server.url,
        server_key=SERVER_KEY,
        backend=MockLLMBackend(seed=3),
        protocol="v2",
        v2_slack_s=3.0,
    )
    async with harness:
        yield harness


AUTH = {"Authorization": f"Bearer {SERVER_KEY}"}


async def status_of(harness: Harness, rollout_id: str) -> dict[str, Any]:
    assert harness.server_http is not None
    response = await harness.server_http.get(
        f"/rollout/{quote(rollout_id, safe='')}/status", headers=AUTH
    )
    assert response.status_code == 200, response.text
    return dict(response.json())


async def wait_status(harness: Harness, rollout_id: str, wanted: str) -> None:
    """Poll another process's state until the rollout's status is ``wanted`` (15 s at most)."""
    seen = None
    with anyio.move_on_after(15):
        while (seen := await status_of(harness, rollout_id))["status"] != wanted:  # noqa: ASYNC110
            await anyio.sleep(0.05)
        return
    health = await harness.server_http.get("/health")  # type: ignore[union-attr]
    raise AssertionError(f"{rollout_id}: never {wanted!r}, last {seen}; health {health.text}")


async def cancel(harness: Harness, *ids: str) -> dict[str, Any]:
    assert harness.server_http is not None
    response = await harness.server_http.post(
        "/rollout/cancel", json={"ids": list(ids)}, headers=AUTH
    )
    assert response.status_code == 200, response.text
    return dict(response.json())


def bodies(outcome: RolloutOutcome) -> tuple[dict[str, Any], dict[str, Any]]:
    """The one completion and the one grader callback, as the server sent them."""
    exchange = outcome.record.v2
    assert exchange is not None
    assert len(exchange.completions) == 1, exchange.completions
    assert len(exchange.graders) == 1, exchange.graders
    completion, grader = exchange.completions[0], exchange.graders[0]
    for body in (completion, grader):
        text = body.model_dump_json()
        assert MOCK_API_KEY not in text
        assert MOCK_CALLBACK_KEY not in text
        assert SERVER_KEY not in text
    sent_completion, sent_grader = completion.model_dump(), grader.model_dump()
    assert set(sent_completion) == {
        "status", "rollout_id", "extra_fields", "err_message", "err_category"
    }  # fmt: skip
    assert set(sent_grader) == {"status", "rollout_id", "sample", "err_message", "err_category"}
    if sent_grader["sample"] is not None:
        assert set(sent_grader["sample"]) == {
            "messages", "label", "reward", "remove_sample", "metrics", "extra_fields"
        }  # fmt: skip
    return sent_completion, sent_grader


def message(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


async def test_success(server: ServeProcess) -> None:
    async with controller(server) as harness:
        outcome = await harness.run(
            QUESTION, rollout_id="v2-ok", metadata={"ground_truth": "7"}, timeout_s=20
        )
        health = (await harness.server_http.get("/health")).json()  # type: ignore[union-attr]
    assert outcome.findings == []
    assert outcome.init_status == 202
    completion, grader = bodies(outcome)
    assert completion["status"] == "success"
    assert completion["rollout_id"] in ("v2-ok", None)
    assert (completion["err_message"], completion["err_category"]) == (None, None)
    assert grader["status"] == "success"
    assert grader["rollout_id"] in ("v2-ok", None)
    sample = grader["sample"]
    assert sample["reward"] == 1.0
    assert sample["label"] == "7"
    assert sample["remove_sample"] is False
    assert [m["role"] for m in sample["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert outcome.record.v2.status == (  # type: ignore[union-attr]
        200,
        {"rollout_id": "v2-ok", "status": "success", "reward": 1.0, "err_message": None},
    )
    assert outcome.result is not None
    assert outcome.result.status.value == "COMPLETED"
    assert "concurrency" in health
    assert "status" in health


async def test_agent_error(server: ServeProcess) -> None:
    async with controller(server) as harness:
        outcome = await harness.run(message("raise"), rollout_id="v2-raise", timeout_s=20)
    assert outcome.findings == []  # no reward_on_failure, grader after completion, ...
    completion, grader = bodies(outcome)
    assert completion["status"] == "failure"
    assert completion["err_category"] == "agent_error"
    assert "boom from the interop agent" in completion["err_message"]
    assert grader["status"] == "failure"
    assert grader["err_category"] == "agent_error"
    assert grader["sample"] is None or grader["sample"]["reward"] is None
    code, status = outcome.record.v2.status  # type: ignore[union-attr,misc]
    assert code == 200
    assert status["status"] == "failure"
    assert status["reward"] is None
    assert "boom from the interop agent" in status["err_message"]


async def test_timeout(server: ServeProcess) -> None:
    async with controller(server) as harness:
        outcome = await harness.run(
            message("sleep 10"), rollout_id="v2-slow", timeout_s=0.5, grader_timeout_s=1.0
        )
    assert outcome.findings == []
    completion, grader = bodies(outcome)
    assert completion["status"] == "failure"
    assert completion["err_category"] == "timeout"
    assert grader["status"] == "failure"
    assert grader["err_category"] == "timeout"
    assert outcome.record.v2.status[1]["status"] == "failure"  # type: ignore[union-attr,index]


async def test_cancel_while_running_and_while_queued(server: ServeProcess) -> None:
    """A slow rollout takes the one slot, a second waits in the queue: each cancel names its
    disposition, and each still ends in one completion (cancelled) and one grader callback
    (failure), and a ``cancelled`` status; cancelling again is ``not_found``."""
    outcomes: dict[str, RolloutOutcome] = {}
    async with controller(server) as harness:

        async def one(rollout_id: str) -> None:
            outcomes[rollout_id] = await harness.run(
                message("sleep 30"), rollout_id=rollout_id, timeout_s=60, grader_timeout_s=5
            )

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(one, "v2-running")
                await wait_status(harness, "v2-running", "running")
                tasks.start_soon(one, "v2-queued")
                await wait_status(harness, "v2-queued", "queued")
                assert await cancel(harness, "v2-queued") == {
                    "dispositions": {"v2-queued": "cancelled_queued"}
                }
                assert await cancel(harness, "v2-running") == {
                    "dispositions": {"v2-running": "cancelled_running"}
                }
            again = await cancel(harness, "v2-running", "never-seen")
    assert again == {"dispositions": {"v2-running": "not_found", "never-seen": "not_found"}}
    for rollout_id in ("v2-running", "v2-queued"):
        outcome = outcomes[rollout_id]
        assert outcome.findings == [], rollout_id
        completion, grader = bodies(outcome)
        assert completion["status"] == "cancelled"
        assert grader["status"] == "failure"
        assert outcome.record.v2.status[1]["status"] == "cancelled"  # type: ignore[union-attr,index]


async def test_429_under_a_full_server(fresh_server: ServeProcess) -> None:
    """Slot and queue taken: a third init is 429 with Retry-After; the controller waits what
    it says and resends the same body, until its own deadline; then the row is refused with
    the 429 and nothing was started."""
    outcomes: dict[str, RolloutOutcome] = {}
    async with controller(fresh_server) as harness:

        async def one(rollout_id: str) -> None:
            outcomes[rollout_id] = await harness.run(
                message("sleep 30"), rollout_id=rollout_id, timeout_s=60, grader_timeout_s=5
            )

        with anyio.fail_after(40):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(one, "v2-fill-1")
                await wait_status(harness, "v2-fill-1", "running")
                tasks.start_soon(one, "v2-fill-2")
                await wait_status(harness, "v2-fill-2", "queued")
                raw = await harness.server_http.post(  # type: ignore[union-attr]
                    "/rollout", json=_body("v2-raw-third"), headers=AUTH
                )
                assert raw.status_code == 429
                retry_after = float(raw.headers["retry-after"])
                assert retry_after > 0
                harness.v2_slack_s = retry_after + 1  # room for exactly one resend
                refused = await harness.run(
                    QUESTION, rollout_id="v2-third", timeout_s=0.2, grader_timeout_s=0.1
                )
                third = await status_of(harness, "v2-third")
                await cancel(harness, "v2-fill-1", "v2-fill-2")
    assert refused.init_status == 429
    assert refused.record.v2.throttled == 1  # type: ignore[union-attr]
    assert refused.wall_ms >= retry_after * 1000 * 0.95
    assert third["status"] == "unknown"
    for outcome in outcomes.values():
        bodies(outcome)  # the two that filled it still end in exactly one of each


async def test_a_rollout_cancelled_while_queued_frees_its_queue_place(
    fresh_server: ServeProcess,
) -> None:
    outcomes: dict[str, RolloutOutcome] = {}
    async with controller(fresh_server) as harness:

        async def one(rollout_id: str, text: str) -> None:
            outcomes[rollout_id] = await harness.run(
                message(text), rollout_id=rollout_id, timeout_s=60, grader_timeout_s=5
            )

        with anyio.fail_after(40):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(one, "v2-slot", "sleep 30")
                await wait_status(harness, "v2-slot", "running")
                tasks.start_soon(one, "v2-waits", "sleep 30")
                await wait_status(harness, "v2-waits", "queued")
                await cancel(harness, "v2-waits")
                await wait_status(harness, "v2-waits", "cancelled")
                again = await harness.server_http.post(  # type: ignore[union-attr]
                    "/rollout", json=_body("v2-next"), headers=AUTH
                )
                await cancel(harness, "v2-slot", "v2-next")
    assert again.status_code == 202, again.text


async def test_duplicate_init(server: ServeProcess) -> None:
    """The same body again: 202 and nothing new started (one chat history, one of each
    callback); the same id with another body: 409."""
    async with controller(server) as harness:
        request = _request("v2-dup")
        record, first = await harness.gate.v2.start(
            harness._server_post,  # type: ignore[arg-type]
            server.url,
            request,
            llm_key=MOCK_API_KEY,
            callback_key=MOCK_CALLBACK_KEY,
            agent_timeout_s=20,
            grader_timeout_s=20,
            server_key=SERVER_KEY,
        )
        content = _content(request, harness.gate.base_url)
        assert harness.server_http is not None
        again = await harness.server_http.post(
            "/rollout", content=content, headers={**AUTH, "Content-Type": "application/json"}
        )
        other = json.loads(content) | {"initial_messages": message("something else")}
        conflict = await harness.server_http.post("/rollout", json=other, headers=AUTH)
        calls = HttpxCalls(harness.server_http)
        await harness.gate.v2.finish(record, calls, server.url, wait_s=20, server_key=SERVER_KEY)
        await anyio.sleep(0.5)  # a second rollout's callbacks would have come by now
    assert first.status_code == 202
    assert again.status_code == 202
    assert conflict.status_code == 409
    assert record.findings == []
    exchange = record.v2
    assert exchange is not None
    assert len(exchange.completions) == 1
    assert len(exchange.graders) == 1
    assert len(record.chats) == 2  # one tool turn, one answer: a single run


def _request(rollout_id: str) -> RolloutRequest:
    return RolloutRequest(
        rollout_id=rollout_id,
        server_url="http://127.0.0.1:1",
        messages=QUESTION,
        completion_params={},
        metadata={"ground_truth": "7"},
        api_key=MOCK_API_KEY,
    )


def _content(request: RolloutRequest, base_url: str) -> bytes:
    body = start_body(
        request,
        base_url=base_url,
        llm_key=MOCK_API_KEY,
        callback_key=MOCK_CALLBACK_KEY,
        agent_timeout_s=20,
        grader_timeout_s=20,
    )
    return json.dumps(body, separators=(",", ":")).encode()


def _body(rollout_id: str) -> dict[str, Any]:
    return json.loads(_content(_request(rollout_id), "http://127.0.0.1:1"))


async def _status_after(server: ServeProcess, rollout_id: str) -> dict[str, Any]:
    async with controller(server) as harness:
        return await status_of(harness, rollout_id)


# -- every template and example, unchanged, offline ------------------------------------------

TEMPLATES = [info.name for info in list_templates()]


def _osmosis(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "osmosis_rollout", *args],
        cwd=cwd,
        env=clean_env(NO_COLOR="1"),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _template_on(
    template: str, base: Path, protocol: str = "v2"
) -> subprocess.CompletedProcess[str]:
    init = _osmosis("init", f"{protocol}-{template}", "-t", template, cwd=base)
    if init.returncode != 0:
        return init
    project = base / f"{protocol}-{template}"
    return _osmosis("test", "-d", "dataset.jsonl", "--protocol", protocol, "--json", cwd=project)


def _example_on(example: Path, protocol: str = "v2") -> subprocess.CompletedProcess[str]:
    agent = example / "agent.py"
    target = next(
        f"{agent}:{line.split()[1].split('(')[0]}"
        for line in agent.read_text().splitlines()
        if line.startswith("class ") and "RolloutAgentLoop" in line
    )
    return _osmosis(
        "test", target, "-d", str(example / "dataset.jsonl"), "--protocol", protocol, "--json",
        cwd=example,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["v2", "polling"])
def test_every_template_and_example_passes_on_v2_and_polling(tmp_path: Path, protocol: str) -> None:
    """Every template and example, unchanged, offline over v2 and over the polling wire."""
    examples = sorted(p for p in (REPO / "examples").iterdir() if (p / "agent.py").is_file())
    assert TEMPLATES
    assert examples
    with ThreadPoolExecutor(max_workers=4) as pool:
        runs = {
            **{
                f"template {t}": pool.submit(_template_on, t, tmp_path, protocol) for t in TEMPLATES
            },
            **{f"example {e.name}": pool.submit(_example_on, e, protocol) for e in examples},
        }
        done = {name: job.result() for name, job in runs.items()}
    for name, run in done.items():
        assert run.returncode == 0, f"{name}: exit {run.returncode}\n{run.stdout}\n{run.stderr}"
        summary = json.loads(run.stdout)
        assert summary["rows"] > 0, name
        assert summary["passed"] == summary["rows"], (name, summary)
        assert summary["findings"] == {}, (name, summary)


@pytest.mark.parametrize("protocol", ["v2", "polling"])
def test_osmosis_test_server_protocol_v2_or_polling_drives_osmosis_serve(
    server: ServeProcess, protocol: str
) -> None:
    """The command itself, against the running server: the same summary as on v1, over v2
    and over the polling wire (the same ``osmosis serve`` speaks both)."""
    from .commands import run_cli

    result = run_cli(
        "test", "--server", server.url, "--api-key", SERVER_KEY, "--protocol", protocol,
        "-d", str(REPO / "examples/calculator/dataset.jsonl"), "--limit", "3", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.stdout + result.stderr
    summary = json.loads(result.stdout)
    assert (summary["rows"], summary["passed"], summary["findings"]) == (3, 3, {})
    assert summary["mean_reward"] == 1.0
