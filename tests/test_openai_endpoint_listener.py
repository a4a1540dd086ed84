"""The loopback endpoint for harnesses in other processes (`ctx.openai_base_url`,
`ctx.openai_api_key`): per-rollout URLs and tokens on 127.0.0.1, 401/404 that never reach
TrainGate, void once the rollout ends; and a real subprocess harness run as a rollout."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx2
import pytest

from osmosis_rollout.evaluation import TestOptions, run_test
from osmosis_rollout.testing import Harness, ScriptedBackend

from .support import ROOT, load_asset, load_path
from .test_openai_endpoint import _trace_events

pytest.importorskip("openai")
pytestmark = pytest.mark.anyio

HARNESS = ROOT / "examples/harness"
HARNESS_AGENT = f"{HARNESS}/agent.py:HarnessAgent"


async def test_wrong_token_401_unknown_rollout_404_and_neither_reaches_traingate() -> None:
    agent = load_asset("byo_agents").ProbeAgent()
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    async with Harness(agent) as harness:
        outcome = await harness.run(messages)
    result = outcome.result
    assert result is not None
    assert result.status.value == "COMPLETED", result.error_message
    assert result.extra_fields["statuses"] == [401, 401, 404, 404, 200]
    wrong, unknown, responses = result.extra_fields["errors"]
    assert "wrong or missing API key" in wrong
    assert "no live rollout at this URL" in unknown
    assert "the Responses API is not supported" in responses
    assert len(outcome.record.chats) == 1  # only the right call reached the mock TrainGate
    assert result.extra_fields["url"].startswith("http://127.0.0.1:")
    assert result.extra_fields["key"] not in json.dumps(outcome.record.chats[0].model_dump())


async def test_the_token_stops_working_when_the_rollout_ends() -> None:
    agent = load_asset("byo_agents").ProbeAgent()
    async with Harness(agent) as harness:
        outcome = await harness.run([{"role": "user", "content": "hi"}])
        assert outcome.result is not None
        url, key = outcome.result.extra_fields["url"], outcome.result.extra_fields["key"]
        body = {"model": "p", "messages": [{"role": "user", "content": "hi"}]}
        async with httpx2.AsyncClient(timeout=10) as http:
            try:
                late = await http.post(
                    f"{url}/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}
                )
            except httpx2.ConnectError:
                status = None  # the last rollout ended: the listener closed
            else:
                status = late.status_code
    assert status in (None, 404)
    assert len(outcome.record.chats) == 1


async def test_grants_are_per_rollout_on_one_listener() -> None:
    """Two live rollouts share one listener; revoking one leaves the other working."""
    from osmosis_rollout.endpoint.listener import listener

    class Fake:
        async def handle(self, content: bytes) -> Any:
            from osmosis_rollout.endpoint.session import EndpointReply

            return EndpointReply(200, b'{"ok": true}')

    loop_listener = listener()
    first = loop_listener.grant(Fake())  # type: ignore[arg-type]
    second = loop_listener.grant(Fake())  # type: ignore[arg-type]
    assert listener() is loop_listener
    assert first.base_url != second.base_url
    assert first.token != second.token
    async with httpx2.AsyncClient(timeout=10) as http:

        async def post(grant: Any, token: str) -> int:
            reply = await http.post(
                f"{grant.base_url}/chat/completions",
                content=b"{}",
                headers={"authorization": f"Bearer {token}"},
            )
            return reply.status_code

        assert await post(first, first.token) == 200
        assert await post(first, second.token) == 401  # another rollout's token
        first.revoke()
        assert await post(first, first.token) == 404
        assert await post(second, second.token) == 200
    second.revoke()


async def test_a_subprocess_harness_passes_osmosis_test_offline() -> None:
    report = await run_test(
        # The mock answers all tools in one turn ("all"), then the final answer: two turns.
        TestOptions(
            target=HARNESS_AGENT, dataset=HARNESS / "dataset.jsonl", limit=2, mock_policy="all"
        )
    )
    assert report.summary["passed"] == 2, [(r.error_message, r.findings) for r in report.rows]
    assert report.summary["trainable"] is True
    assert all(row.turns == 2 for row in report.rows)


@pytest.mark.parametrize(("trim_after", "clean"), [("3", False), ("0", True)])
async def test_a_harness_that_trims_after_three_turns_is_reported(
    trim_after: str, clean: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HARNESS_TRIM_AFTER", trim_after)
    module = load_path(HARNESS / "agent.py", "harness_example_agent")
    call = {"function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
    script = ScriptedBackend(
        [*({"tool_calls": [{"id": f"c{i}", **call}]} for i in range(5)), {"content": "3"}]
    )
    messages = [{"role": "system", "content": "add"}, {"role": "user", "content": "1+2, 5x"}]
    async with Harness(module.HarnessAgent(), backend=script) as harness:
        outcome = await harness.run(messages, timeout_s=120)
    assert outcome.result is not None
    assert outcome.result.status.value == "COMPLETED", outcome.result.error_message
    found = [(f.code, f.turn) for f in outcome.findings]
    if clean:
        assert found == []
    else:
        assert found[0] == ("history_rewritten", 4)  # trimmed from turn 4 on, each turn
        assert {code for code, _ in found} == {"history_rewritten"}
        assert "turn 4 rewrote the history at message 1" in outcome.findings[0].message


def test_the_harness_example_knows_nothing_of_osmosis() -> None:
    assert "osmosis" not in (HARNESS / "harness.py").read_text().split('"""', 2)[2]


async def test_the_harness_gets_the_rollouts_url_in_its_environment(tmp_path: Path) -> None:
    """--debug-dir: the harness's calls are the rollout's traced turns."""
    report = await run_test(
        TestOptions(
            target=HARNESS_AGENT,
            dataset=HARNESS / "dataset.jsonl",
            limit=1,
            debug_dir=tmp_path,
            mock_policy="all",  # every tool in turn 1, then the answer: two turns
        )
    )
    assert report.summary["passed"] == 1
    turns = [e for e in _trace_events(tmp_path) if e["event"] == "turn"]
    assert [t["turn"] for t in turns] == [1, 2]


async def test_the_last_rollout_ending_closes_kept_alive_connections() -> None:
    """A harness's keep-alive connection ends with the listener, not at the loop's shutdown
    (where its cancelled handler used to print a CancelledError traceback)."""
    import asyncio

    from osmosis_rollout.endpoint.listener import listener
    from osmosis_rollout.endpoint.session import EndpointReply

    class Fake:
        async def handle(self, content: bytes) -> Any:
            return EndpointReply(200, b"{}")

    grant = listener().grant(Fake())  # type: ignore[arg-type]
    port = int(grant.base_url.split(":")[2].split("/")[0])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    path = grant.base_url.split(str(port), 1)[1]
    writer.write(
        f"POST {path}/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer "
        f"{grant.token}\r\ncontent-length: 2\r\n\r\n{{}}".encode()
    )
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK")
    assert b"connection: keep-alive" in head
    await reader.readexactly(2)
    grant.revoke()
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the listener
    writer.close()
    await writer.wait_closed()


@pytest.mark.slow
def test_a_harness_served_then_tested_with_server(tmp_path: Path) -> None:
    """`osmosis serve` of the harness example + `osmosis test --server`: the listener in a real
    server process, the harness a grandchild of it."""
    from .commands import run_cli_text
    from .processes import osmosis_serve

    with osmosis_serve(tmp_path / "serve.log", HARNESS_AGENT, "--port", "0", "--no-validate") as s:
        code, out, err = run_cli_text(
            "test", "--server", s.url, "-d", str(HARNESS / "dataset.jsonl"), "--limit", "2"
        )
    assert code == 0, out + err + s.output()
    assert "2/2" in out
    assert re.search(r"trainable\s+yes", out)


async def test_an_endpoint_failure_is_a_500_not_a_dropped_connection() -> None:
    from osmosis_rollout.endpoint.listener import listener

    class Broken:
        async def handle(self, content: bytes) -> Any:
            raise RuntimeError("a bug")

    grant = listener().grant(Broken())  # type: ignore[arg-type]
    try:
        async with httpx2.AsyncClient(timeout=10) as http:
            reply = await http.post(
                f"{grant.base_url}/chat/completions",
                content=b"{}",
                headers={"authorization": f"Bearer {grant.token}"},
            )
        assert reply.status_code == 500
        assert reply.json()["error"]["message"] == (
            "the rollout endpoint failed (RuntimeError); see the server's log"
        )
    finally:
        grant.revoke()


async def test_osmosis_test_counts_the_harness_tool_calls_from_the_history() -> None:
    """The harness runs its tools itself; each result comes back as a ``tool`` message in its
    next call, and that is where they are counted: calls per tool, marked as observed from
    the history, with their time in the tool share of the split."""
    report = await run_test(
        TestOptions(
            target=HARNESS_AGENT, dataset=HARNESS / "dataset.jsonl", limit=2, mock_policy="all"
        )
    )
    assert report.summary["passed"] == 2, [(r.error_message, r.findings) for r in report.rows]
    for row in report.rows:
        assert row.tool_calls > 0
        assert row.tool_calls_from_history == row.tool_calls
        assert sum(calls for calls, _, _ in row.tool_counts.values()) == row.tool_calls
        assert set(row.tool_counts) <= {"add", "multiply"}
        assert row.tool_ms > 0
    assert report.summary["tool_calls_from_history"] == report.summary["tool_calls"] > 0


async def test_a_harness_tool_error_is_counted_as_its_tool_message_says() -> None:
    """``"error: give numbers a and b"`` (the harness's answer to a bad call) is one failed
    ``add`` call; its latency runs from the reply that asked for it to the call carrying it."""
    module = load_path(HARNESS / "agent.py", "harness_example_errors")
    bad = {"id": "c1", "function": {"name": "add", "arguments": '{"a": 1}'}}
    good = {"id": "c2", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
    script = ScriptedBackend([{"tool_calls": [bad]}, {"tool_calls": [good]}, {"content": "3"}])
    async with Harness(module.HarnessAgent(), backend=script) as harness:
        outcome = await harness.run([{"role": "user", "content": "1+2"}], timeout_s=120)
    assert outcome.result is not None
    metrics = outcome.result.metrics
    assert metrics is not None
    extra = metrics.model_extra or {}
    assert metrics.num_tool_calls == 2
    assert extra["tool_counts"] == {"add": [2, 1, 0]}
    assert extra["tool_calls_from_history"] == 2
    assert metrics.tool_latency_ms > 0
