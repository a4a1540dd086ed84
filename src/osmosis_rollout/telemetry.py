"""OpenTelemetry spans, when ``opentelemetry-api`` is installed (``osmosis-rollout[otel]``).

A span per rollout (``osmosis.rollout``), per LLM turn (``osmosis.llm_turn``) and per tool call
(``osmosis.tool_call``), each with the rollout id; the W3C trace context (``traceparent``) goes
with every call to TrainGate, so the trainer's spans join the rollout's trace. Only the API is
used: the application chooses the SDK and exporter (or none, and every span is a no-op).

Without the package everything here is a no-op: the import is tried once, on first use, and then
each hook costs one function call. ``osmosis --help`` never imports OpenTelemetry.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, MutableMapping
from typing import Any

__all__ = ["available", "inject_context", "llm_turn_span", "rollout_span", "tool_span"]

_TRACER_NAME = "osmosis_rollout"
#: The installed API as ``(trace, propagate)``, None when missing, False until first checked.
_api: Any = False
#: Tests (and applications that keep their own provider) may set this instead of the global one.
tracer_provider: Any = None
#: The rollout whose span is open in this context: nested openings of the same one are skipped.
_open_rollout: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "osmosis_open_rollout", default=None
)


def _load() -> Any:
    global _api
    if _api is False:
        try:
            from opentelemetry import propagate, trace
        except ImportError:
            _api = None
        else:
            _api = (trace, propagate, (trace.ProxyTracerProvider, trace.NoOpTracerProvider))
    return _api


def _recording() -> Any:
    """The API when a span made now could be recorded, else None: without an SDK provider
    (none set, or a no-op one) every span is a no-op, and skipping it saves ~0.1 ms a rollout.
    Checked at each call, so a provider set after the server started is used at once."""
    api = _load()
    if api is None or tracer_provider is not None:
        return api
    if isinstance(api[0].get_tracer_provider(), api[2]):
        return None
    return api


def available() -> bool:
    """Whether ``opentelemetry-api`` is installed (spans are then made, if an SDK is set up)."""
    return _load() is not None


def _tracer(api: Any) -> Any:
    trace = api[0]
    if tracer_provider is not None:
        return tracer_provider.get_tracer(_TRACER_NAME)
    return trace.get_tracer(_TRACER_NAME)


@contextlib.contextmanager
def _span(api: Any, name: str, attributes: dict[str, Any]) -> Iterator[Any]:
    with _tracer(api).start_as_current_span(name, attributes=attributes) as span:
        yield span


#: What ``rollout_span`` returns without a recording provider: one shared no-op, because the
#: span is held for the whole rollout (a generator context per rollout is ~0.4 KB in flight).
_NO_SPAN: contextlib.nullcontext[None] = contextlib.nullcontext()


def rollout_span(rollout_id: str, agent: str) -> contextlib.AbstractContextManager[Any]:
    """The span of one rollout (yields it, or None); opened once even when nested."""
    api = _recording()
    if api is None:
        return _NO_SPAN
    return _rollout_span(api, rollout_id, agent)


@contextlib.contextmanager
def _rollout_span(api: Any, rollout_id: str, agent: str) -> Iterator[Any]:
    if _open_rollout.get() == rollout_id:  # the server's span, around the agent and callback
        yield api[0].get_current_span()
        return
    token = _open_rollout.set(rollout_id)
    try:
        attributes = {"osmosis.rollout_id": rollout_id, "osmosis.agent": agent}
        with _span(api, "osmosis.rollout", attributes) as span:
            yield span
    finally:
        _open_rollout.reset(token)


def llm_turn_span(rollout_id: str, turn: int) -> contextlib.AbstractContextManager[Any]:
    """The span of one LLM turn (the chat call to TrainGate and its retries)."""
    api = _recording()
    if api is None:
        return contextlib.nullcontext()
    return _span(api, "osmosis.llm_turn", {"osmosis.rollout_id": rollout_id, "osmosis.turn": turn})


def tool_span(
    rollout_id: str, tool: str | None, turn: int
) -> contextlib.AbstractContextManager[Any]:
    """The span of one tool call (``turn``: the LLM turn whose reply asked for it)."""
    api = _recording()
    if api is None:
        return contextlib.nullcontext()
    attributes = {
        "osmosis.rollout_id": rollout_id,
        "osmosis.tool": tool or "?",
        "osmosis.turn": turn,
    }
    return _span(api, "osmosis.tool_call", attributes)


def inject_context(headers: MutableMapping[str, str]) -> None:
    """Add ``traceparent`` (and ``tracestate``) for the current span to outgoing headers.

    Without an SDK provider there is no span to name (ours are skipped, see ``_recording``), so
    the propagator is not run at all: a few microseconds on every call to TrainGate."""
    api = _recording()
    if api is not None:
        api[1].inject(headers)


def end_rollout(span: Any, status: str, finish_reason: str | None, reward: float | None) -> None:
    """Record how the rollout ended on its span; an ERROR rollout marks the span as an error."""
    if span is None or not span.is_recording():
        return
    span.set_attribute("osmosis.status", status)
    if finish_reason is not None:
        span.set_attribute("osmosis.finish_reason", finish_reason)
    if reward is not None:
        span.set_attribute("osmosis.reward", reward)
    if status != "COMPLETED":
        api = _load()
        span.set_status(api[0].Status(api[0].StatusCode.ERROR, finish_reason or "error"))


def end_turn(span: Any, finish_reason: str | None, usage: Any) -> None:
    """Record a turn's finish reason and tokens (GenAI semantic-convention names)."""
    if span is None or not span.is_recording():
        return
    if finish_reason is not None:
        span.set_attribute("gen_ai.response.finish_reasons", [finish_reason])
    span.set_attribute("gen_ai.usage.input_tokens", usage.prompt_tokens)
    span.set_attribute("gen_ai.usage.output_tokens", usage.completion_tokens)
