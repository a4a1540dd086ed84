"""OpenTelemetry: spans per rollout, turn and tool call, ``traceparent`` on the calls to TrainGate,
and nothing at all when the package is not installed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from osmosis_rollout import telemetry
from osmosis_rollout.client import TrainGateClient
from osmosis_rollout.protocol import RolloutRequest
from osmosis_rollout.rollout import run_rollout
from osmosis_rollout.testing import MockTrainGate

from .gates import CHAT, COMPLETED
from .serving import init_body, serving
from .support import load_asset

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
mixed = load_asset("trajectory_agents")


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """An SDK provider with an in-memory exporter, for osmosis_rollout's spans only."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.tracer_provider = provider
    try:
        yield exporter
    finally:
        telemetry.tracer_provider = None
        provider.shutdown()


def by_name(finished: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in finished if s.name == name]


def traceparent(headers: dict[str, str]) -> tuple[str, str]:
    """(trace id, parent span id) of a W3C ``traceparent`` header, as hex."""
    version, trace_id, span_id, _flags = headers["traceparent"].split("-")
    assert version == "00"
    return trace_id, span_id


async def test_rollout_turn_and_tool_spans_and_traceparent_to_traingate(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    """A served two-turn tool rollout is one trace: the rollout span holds both turns and the
    tool call; each chat call carries its turn's span, the callback the rollout's."""
    async with serving(mixed.MixedAgent(), tmp_path) as s:
        assert (await s.init(init_body("r-1", metadata={"reward": 0.5}))).status_code == 202
        await s.settle()
        chats = s.raw.calls_to(CHAT)
        callbacks = s.raw.calls_to(COMPLETED)

    finished = spans.get_finished_spans()
    (rollout,) = by_name(finished, "osmosis.rollout")
    turns = by_name(finished, "osmosis.llm_turn")
    (tool,) = by_name(finished, "osmosis.tool_call")
    assert rollout.context is not None
    trace_id = rollout.context.trace_id
    assert rollout.attributes is not None
    assert rollout.attributes["osmosis.rollout_id"] == "r-1"
    assert rollout.attributes["osmosis.agent"] == "mixed"
    assert rollout.attributes["osmosis.status"] == "COMPLETED"
    assert rollout.attributes["osmosis.finish_reason"] == "stop"
    assert rollout.attributes["osmosis.reward"] == 0.5
    assert [t.attributes["osmosis.turn"] for t in turns if t.attributes] == [1, 2]
    for span in [*turns, tool]:
        assert span.context is not None
        assert span.context.trace_id == trace_id
        assert span.parent is not None
        assert span.parent.span_id == rollout.context.span_id
        assert span.attributes is not None
        assert span.attributes["osmosis.rollout_id"] == "r-1"
    assert tool.attributes is not None
    assert (tool.attributes["osmosis.tool"], tool.attributes["osmosis.turn"]) == ("add", 1)
    assert turns[0].attributes is not None
    assert turns[0].attributes["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert turns[0].attributes["gen_ai.usage.input_tokens"] > 0

    # W3C trace context on every call to TrainGate
    assert [traceparent(c.headers) for c in chats] == [
        (f"{trace_id:032x}", f"{t.context.span_id:016x}") for t in turns if t.context
    ]
    (callback,) = callbacks
    assert traceparent(callback.headers) == (f"{trace_id:032x}", f"{rollout.context.span_id:016x}")


async def test_a_failed_rollout_marks_its_span_as_an_error(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    async with serving(mixed.MixedAgent(), tmp_path) as s:
        await s.init(init_body("bad", metadata={"kind": "error"}))
        await s.settle()
    (rollout,) = by_name(spans.get_finished_spans(), "osmosis.rollout")
    assert rollout.status.status_code is StatusCode.ERROR
    assert rollout.attributes is not None
    assert rollout.attributes["osmosis.status"] == "ERROR"


async def test_run_rollout_alone_makes_its_own_rollout_span(
    spans: InMemorySpanExporter, mock_client: tuple[MockTrainGate, TrainGateClient]
) -> None:
    """Without the server around it, run_rollout still opens exactly one rollout span."""
    gate, client = mock_client
    request = RolloutRequest(
        rollout_id="alone",
        server_url="http://traingate.test",
        messages=[{"role": "user", "content": "hi"}],
        completion_params={},
    )
    gate.expect("alone")
    await run_rollout(mixed.MixedAgent(), request, client.channel(request))
    finished = spans.get_finished_spans()
    assert len(by_name(finished, "osmosis.rollout")) == 1
    assert len(by_name(finished, "osmosis.llm_turn")) >= 1


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )


def test_without_opentelemetry_rollouts_run_and_nothing_is_imported() -> None:
    """With the package missing (its import blocked), a served tool rollout completes, no span
    or header is made, and no opentelemetry module is loaded."""
    done = run_python(
        """
        import sys
        sys.modules["opentelemetry"] = None  # as if not installed: every import of it fails
        import anyio
        from osmosis_rollout import telemetry
        from osmosis_rollout.testing import Harness, ScriptedBackend
        sys.path.insert(0, "tests/assets")
        from trajectory_agents import MixedAgent

        CALL = {"tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]}

        async def main():
            backend = ScriptedBackend([CALL, {"content": "3"}])
            async with Harness(MixedAgent(), backend=backend) as h:
                outcome = await h.run([{"role": "user", "content": "1 + 2?"}])
            assert outcome.result.status == "COMPLETED", outcome.result
            assert outcome.result.metrics.num_tool_calls == 1
            headers = {}
            telemetry.inject_context(headers)
            assert headers == {}
            assert telemetry.available() is False
            loaded = [m for m, v in sys.modules.items() if m.startswith("opentelemetry") and v]
            assert loaded == [], loaded
            print("ok")

        anyio.run(main)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_opentelemetry_is_imported_only_when_a_rollout_runs() -> None:
    """Installed, it is still not imported by `osmosis --help` or by importing the library."""
    done = run_python(
        """
        import sys
        import osmosis_rollout.agent, osmosis_rollout.client, osmosis_rollout.server
        import osmosis_rollout.cli
        assert not [m for m in sys.modules if m.startswith("opentelemetry")]
        from osmosis_rollout import telemetry
        assert telemetry.available() is True
        print("ok")
        """
    )
    assert done.returncode == 0, done.stderr


def test_with_the_api_but_no_sdk_spans_start_once_a_provider_is_set() -> None:
    """API installed, no SDK: no span, no header; a provider set up later is used at once."""
    done = run_python(
        """
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from osmosis_rollout import telemetry

        with telemetry.rollout_span("r", "a") as span:
            headers = {}
            telemetry.inject_context(headers)
        assert span is None and headers == {}, (span, headers)
        trace.set_tracer_provider(TracerProvider())
        with telemetry.rollout_span("r", "a") as span:
            telemetry.inject_context(headers)
            assert span is not None and span.is_recording()
        assert headers["traceparent"].startswith("00-"), headers
        print("ok")
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
