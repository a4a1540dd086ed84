"""v1's server entry points and documentation examples, run with only their imports changed.

``create_app`` with v1's positional parameters and hooks, ``serve_agent_loop`` serving for real
on 127.0.0.1, the calculator example with typed tool classes, and the fake-LLM unit test.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest.mock import AsyncMock, MagicMock

import pytest

from osmosis_rollout.compat import (
    AgentLoopValidationError,
    RolloutAgentLoop,
    RolloutContext,
    RolloutMetrics,
    RolloutRequest,
    RolloutResult,
    ServeError,
    create_app,
    serve_agent_loop,
)
from osmosis_rollout.config import ServerSettings
from osmosis_rollout.testing import Harness, MockTrainGate, ScriptedBackend

from .processes import clean_env, stop_process, wait_healthy
from .support import ASSETS, free_port, load_asset, serve_in_thread

pytestmark = pytest.mark.anyio

CALCULATE = {
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {
                "name": "calculate",
                "arguments": '{"operation": "multiply", "a": 6, "b": 7}',
            },
        }
    ]
}
ANSWER = {"content": "42"}
QUESTION = [{"role": "user", "content": "What is 6 * 7?"}]


def settings_of(app: Any) -> ServerSettings:
    settings: ServerSettings = app.state.rollout_server.settings
    return settings


class Greeter(RolloutAgentLoop):
    name = "greeter"

    def get_tools(self, request: RolloutRequest) -> list[Any]:
        return []

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        result = await ctx.chat(list(ctx.request.messages))
        return ctx.complete([*ctx.request.messages, result.message])


# -- create_app --------------------------------------------------------------------------------


def test_create_app_takes_v1s_positional_parameters() -> None:
    app = create_app(Greeter(), 7, 120.0)
    assert (settings_of(app).max_concurrent, settings_of(app).record_ttl_s) == (7, 120.0)
    defaults = create_app(Greeter(), 0, None)  # v1: 0 or None mean the default
    assert settings_of(defaults).max_concurrent == 100
    assert settings_of(create_app(Greeter(), api_key="k")).api_key is not None
    assert settings_of(create_app(Greeter())).api_key is None  # v1: no key, no auth


def test_create_app_reads_v1_settings_and_ours() -> None:
    v1_settings = SimpleNamespace(
        server=SimpleNamespace(max_concurrent_rollouts=12, record_ttl_seconds=30.0)
    )
    assert settings_of(create_app(Greeter(), settings=v1_settings)).max_concurrent == 12
    assert settings_of(create_app(Greeter(), 3, settings=v1_settings)).max_concurrent == 3
    ours = ServerSettings(max_concurrent=9, rollout_timeout_s=5.0)
    resolved = settings_of(create_app(Greeter(), None, 45.0, ours))
    assert (resolved.max_concurrent, resolved.record_ttl_s, resolved.rollout_timeout_s) == (
        9,
        45.0,
        5.0,
    )


def test_registration_arguments_are_accepted_with_a_clear_warning() -> None:
    with pytest.warns(UserWarning, match="platform registration is not part of osmosis-rollout"):
        app = create_app(Greeter(), credentials=object(), server_host="1.2.3.4", server_port=9000)
    assert settings_of(app).max_concurrent == 100


async def test_on_startup_and_on_shutdown_hooks_are_awaited_around_serving() -> None:
    events: list[str] = []

    async def on_startup() -> None:
        events.append("startup")

    async def on_shutdown() -> None:
        events.append("shutdown")

    class Recorder(Greeter):
        async def run(self, ctx: RolloutContext) -> RolloutResult:
            events.append("rollout")
            return await super().run(ctx)

    gate = MockTrainGate(ScriptedBackend([{"content": "hello"}]))
    app = create_app(Recorder(), None, None, None, on_startup=on_startup, on_shutdown=on_shutdown)
    with serve_in_thread(app, lifespan="on") as url:
        async with Harness(server_url=url, gate=gate) as harness:
            outcome = await harness.run(QUESTION, rollout_id="hooks-1")
        assert outcome.result is not None
        assert outcome.result.status == "COMPLETED"
    assert events == ["startup", "rollout", "shutdown"]


# -- the calculator example (typed tool classes) ---------------------------------------------------


async def test_the_v1_calculator_example_serves_rollouts_unchanged() -> None:
    """The example module's own ``app = create_app(agent_loop)``, on a real socket."""
    example = load_asset("v1_calculator")
    gate = MockTrainGate(ScriptedBackend([CALCULATE, ANSWER]))
    with serve_in_thread(example.app, lifespan="on") as url:
        async with Harness(server_url=url, gate=gate) as harness:
            outcome = await harness.run(
                QUESTION, rollout_id="calc-1", completion_params={"temperature": 0.5}
            )
    assert outcome.init_status == 202
    [tool] = outcome.init_body["tools"]
    assert tool["function"]["parameters"]["properties"]["operation"]["enum"][0] == "add"
    assert outcome.findings == []
    assert outcome.result is not None
    assert outcome.result.status == "COMPLETED"
    assert outcome.result.final_messages[2] == {
        "role": "tool",
        "content": "42",
        "tool_call_id": "call_1",
    }
    assert outcome.result.metrics is not None
    assert outcome.result.metrics.num_tool_calls == 1


# -- the fake-LLM unit test of v1's testing guide ------------------------------------------------


async def test_the_v1_fake_llm_unit_test_runs_as_written() -> None:
    # From v1's docs/rollout/testing.md "test_agent_run"; v1 marked it @pytest.mark.asyncio.
    MyAgentLoop = load_asset("v1_calculator").CalculatorAgent

    agent = MyAgentLoop()

    # Create mock context
    mock_llm = MagicMock()
    mock_llm.get_metrics.return_value = RolloutMetrics()
    mock_llm.chat_completions = AsyncMock(
        return_value=MagicMock(
            message={"role": "assistant", "content": "Hello!"},
            has_tool_calls=False,
        )
    )

    request = RolloutRequest(
        rollout_id="test",
        server_url="http://localhost",
        messages=[{"role": "user", "content": "Hi"}],
        completion_params={},
    )

    ctx = RolloutContext(
        request=request,
        tools=[],
        llm=mock_llm,
    )

    result = await agent.run(ctx)

    assert result.status == "COMPLETED"
    mock_llm.chat_completions.assert_awaited_once()
    assert result.final_messages[-1] == {"role": "assistant", "content": "Hello!"}


# -- serve_agent_loop ----------------------------------------------------------------------------


def test_serve_agent_loop_refuses_what_cannot_work_before_serving() -> None:
    with pytest.raises(ServeError, match="local_debug=True disables API key authentication"):
        serve_agent_loop(Greeter(), local_debug=True, api_key="k")
    with pytest.raises(ServeError, match="osmosis serve"):
        serve_agent_loop(Greeter(), reload=True, skip_register=True)

    class Broken(Greeter):
        name = "broken"

        def get_tools(self, request: RolloutRequest) -> list[Any]:
            return [{"function": {"name": ""}}]

    with pytest.raises(AgentLoopValidationError, match="validation failed"):
        serve_agent_loop(Broken(), host="127.0.0.1", port=free_port(), skip_register=True)


_API_KEY = re.compile(r"API Key: (osm_rollout_[A-Za-z0-9_-]+)")


@contextlib.contextmanager
def v1_served_example(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int, str, Path]]:
    """Run tests/assets/v1_serve_calculator.py on a free port; yield (process, port, key, log)
    once it is healthy and has printed its generated key; stop it (SIGTERM) on exit."""
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, str(ASSETS / "v1_serve_calculator.py"), str(port)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            env=clean_env(PYTHONPATH=str(ASSETS)),
            start_new_session=True,
        )
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc, log)
        deadline = time.monotonic() + 10
        while not (found := _API_KEY.search(log.read_text(errors="replace"))):
            assert time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.05)
        yield proc, port, found.group(1), log
    finally:
        stop_process(proc)


async def test_serve_agent_loop_serves_the_example_on_a_real_socket(tmp_path: Path) -> None:
    """``serve_agent_loop(agent, port=..., skip_register=True)`` as v1 documents it: a key is
    generated and printed, an init is answered, the rollout completes, SIGTERM stops it."""
    with v1_served_example(tmp_path) as (proc, port, key, log):
        url = f"http://127.0.0.1:{port}"
        gate = MockTrainGate(ScriptedBackend([CALCULATE, ANSWER]))
        async with Harness(server_url=url, gate=gate, server_key=key) as harness:
            outcome = await harness.run(QUESTION, rollout_id="served-1")
        assert outcome.init_status == 202
        assert outcome.findings == []
        assert outcome.result is not None
        assert outcome.result.status == "COMPLETED"
        assert outcome.result.final_messages[-1]["content"] == "42"
    output = log.read_text(errors="replace")
    assert proc.returncode == 0, output
    assert "Agent: calculator" in output
    assert f"Address: 127.0.0.1:{port}" in output
    assert "Registration: skipped" in output
