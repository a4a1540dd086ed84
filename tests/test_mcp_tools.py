"""MCP tool sets (`tools.mcp`): a real MCP server (tests/assets/mcp_server.py, written with the
mcp package's server API) started over stdio and over streamable HTTP; its tools become the
agent's, checked by `osmosis validate`, run by `osmosis test`, with the toolbox's timeouts."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from osmosis_rollout.errors import ToolError
from osmosis_rollout.evaluation import TestOptions, run_test
from osmosis_rollout.testing import Harness, ScriptedBackend
from osmosis_rollout.tools.mcp import McpTools, StdioServer

from .commands import run_cli_text
from .processes import stop_process
from .support import ASSETS, DATASET, free_port, load_asset

pytest.importorskip("mcp")
pytestmark = pytest.mark.anyio

SERVER = str(ASSETS / "mcp_server.py")
AGENT = f"{ASSETS}/mcp_agents.py:McpAgent"
QUESTION = [{"role": "user", "content": "What is 2 + 3?"}]


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {"tool_calls": [{"id": f"call_{name}", "type": "function", "function": function}]}


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[str]:
    """The MCP server over streamable HTTP on 127.0.0.1; its /mcp URL."""
    port = free_port()
    log = tmp_path / "mcp.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, SERVER, "http", str(port)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx2.get(url, timeout=1)
                break
            except httpx2.TransportError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(log.read_text(errors="replace")) from None
                time.sleep(0.1)
        yield url
    finally:
        stop_process(proc)


async def test_schemas_are_the_servers_input_schemas() -> None:
    tools = McpTools(StdioServer(sys.executable, [SERVER, "stdio"]))
    schemas = {s.name: s.function for s in await tools.schemas()}
    assert set(schemas) == {"add", "multiply", "slow", "fail"}
    assert schemas["add"].description == "Add two numbers."
    assert schemas["add"].parameters["required"] == ["a", "b"]
    assert schemas["add"].parameters["properties"]["a"]["type"] == "number"


async def test_calls_reach_the_server_over_stdio_with_the_toolboxs_checks() -> None:
    """A result, the server's own error, a schema violation caught before the server, and
    the toolbox's timeout: each a tool message the model can read."""
    script = ScriptedBackend(
        [
            _call("add", a=2, b=3),
            _call("fail", reason="testing"),
            _call("add", a="two", b=3),
            _call("slow", seconds=30),
            {"content": "5"},
        ]
    )
    async with Harness(load_asset("mcp_agents").McpAgent(), backend=script) as harness:
        outcome = await harness.run(QUESTION, timeout_s=120)
    result = outcome.result
    assert result is not None
    assert result.status.value == "COMPLETED", result.error_message
    tools = [m["content"] for m in result.final_messages if m["role"] == "tool"]
    assert float(tools[0]) == 5.0
    assert tools[1].startswith("Error: ")
    assert "failed on purpose: testing" in tools[1]
    assert tools[2].startswith("Error: invalid arguments for tool 'add'")
    assert tools[3] == "Error: tool 'slow' timed out after 2 s"
    assert outcome.findings == []
    assert result.metrics is not None
    assert result.metrics.num_tool_calls == 4


async def test_calls_reach_the_server_over_streamable_http(
    http_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MCP_TEST_URL", http_server)
    script = ScriptedBackend([_call("multiply", a=6, b=7), {"content": "42"}])
    async with Harness(load_asset("mcp_agents").McpAgent(), backend=script) as harness:
        outcome = await harness.run(QUESTION, timeout_s=60)
    assert outcome.result is not None
    assert outcome.result.status.value == "COMPLETED", outcome.result.error_message
    assert float(outcome.result.final_messages[2]["content"]) == 42.0


async def test_an_unreachable_server_is_one_clear_error() -> None:
    tools = McpTools(f"http://127.0.0.1:{free_port()}/mcp")
    with pytest.raises(ToolError, match=r"cannot list the tools of the MCP server http://127"):
        await tools.schemas()


@pytest.mark.slow
def test_osmosis_validate_checks_the_served_schemas() -> None:
    code, out, err = run_cli_text("validate", AGENT)
    assert code == 0, out + err
    assert "4 tool(s)" in out


@pytest.mark.slow
async def test_an_mcp_tool_set_runs_in_osmosis_test() -> None:
    report = await run_test(TestOptions(target=AGENT, dataset=DATASET, limit=2))
    assert report.summary["passed"] == 2, [(r.error_message, r.findings) for r in report.rows]
    assert report.summary["tool_calls"] > 0
