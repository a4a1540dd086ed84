"""``run_rollout``: one rollout's whole life, shared by the server, ``osmosis test`` and the REPL.

It builds the context, awaits ``agent.run(ctx)`` under a deadline and returns the
``RolloutResponse`` to send. Whatever happens inside the agent (an exception, a hang past the
deadline, a cancel at shutdown, a wrong return value) becomes an ``ERROR`` response that keeps the
conversation seen so far. This is the one deliberate catch-all of the core.
"""

from __future__ import annotations

import json
import logging
import math
import time
import traceback
from collections.abc import Sequence
from typing import Any

import anyio
import anyio.lowlevel
from pydantic import ValidationError
from pydantic_core import PydanticSerializationError

from . import telemetry
from .agent import (
    ChatBackend,
    RolloutAgentLoop,
    RolloutContext,
    TurnObserver,
    close_endpoint,
    tool_cut_since,
)
from .errors import OsmosisError, error_category
from .protocol import (
    Message,
    OpenAIFunctionToolSchema,
    RolloutRequest,
    RolloutResponse,
    RolloutStatus,
    describe_validation_error,
    wire_json,
)
from .redaction import loggable, scrub
from .results import RolloutResult
from .tools.tool_set import resolve_tools
from .tracing import Tracer

__all__ = ["RolloutControl", "run_rollout"]

logger = logging.getLogger("osmosis_rollout.rollout")


class RolloutControl:
    """Lets the owner of a running rollout cancel it; the rollout then ends ``cancelled``."""

    __slots__ = ("cancelled", "category", "context", "reason", "scope")

    def __init__(self) -> None:
        self.scope: anyio.CancelScope | None = None
        self.cancelled = False
        self.reason = "server shutting down"
        self.context: RolloutContext | None = None
        #: Why the agent failed, in protocol v2's ``err_category`` terms (``grading``), when
        #: an exception or a bad return value ended it.
        self.category: str | None = None

    def cancel(self, reason: str = "server shutting down") -> None:
        """Cancel the agent; ``run_rollout`` still returns its ``ERROR``/``cancelled`` response,
        whose ``error_message`` gives ``reason``."""
        self.cancelled = True
        self.reason = reason
        if self.scope is not None:
            self.scope.cancel()


async def run_rollout(
    agent: RolloutAgentLoop,
    request: RolloutRequest,
    llm: ChatBackend,
    *,
    tools: Sequence[OpenAIFunctionToolSchema] | None = None,
    deadline_s: float | None = None,
    tracer: Tracer | None = None,
    control: RolloutControl | None = None,
    observer: TurnObserver | None = None,
) -> RolloutResponse:
    """Run ``agent`` on ``request`` and return the one completion callback body to send.

    ``llm`` is usually ``TrainGateClient.channel(request)``. ``tools`` are the ones already
    returned at init (resolved here when omitted). Never raises for agent failures. With
    OpenTelemetry installed, the rollout is one span (see ``telemetry``).
    """
    with telemetry.rollout_span(request.rollout_id, agent.name) as span:
        control = control or RolloutControl()
        trace = tracer.sink(request.rollout_id, secrets=[request.api_key_value]) if tracer else None
        if tools is None:
            try:
                tools = await resolve_tools(agent, request)
            except Exception as exc:
                failed = _error_response(
                    request, list(request.messages), f"get_tools failed: {exc}"
                )
                _end_span(span, failed)
                return failed
        ctx = agent.context_class(request, tools, llm, trace=trace, observer=observer)
        control.context = ctx
        if trace is not None:
            ctx.log_event(
                "rollout_start",
                agent=agent.name,
                tools=[t.name for t in tools],
                max_turns=request.max_turns,
                completion_params=request.completion_params,
                metadata=request.metadata,
            )
        finish_reason = "error"
        error_message: str | None = None
        result: Any = None
        with anyio.CancelScope() as scope:
            control.scope = scope
            if control.cancelled:
                scope.cancel()
            deadline_at = math.inf
            if deadline_s is not None:
                scope.deadline = anyio.current_time() + deadline_s
                deadline_at = time.perf_counter() + deadline_s
            try:
                await anyio.lowlevel.checkpoint_if_cancelled()  # cancelled before start: no turn
                result = await agent.run(ctx)
            except OsmosisError as exc:
                control.category = error_category(exc)
                error_message = scrub(f"{type(exc).__name__}: {exc}", request.api_key_value)
                logger.warning("rollout %s failed: %s", loggable(request.rollout_id), error_message)
            except Exception as exc:
                control.category = error_category(exc)
                error_message = f"agent raised {type(exc).__name__}: {exc}"
                _log_agent_crash(request)
                ctx.log_event("agent_exception", traceback=traceback.format_exc(limit=20))
            finally:
                close_endpoint(ctx)  # its calls from now on are refused, its token void
        if scope.cancelled_caught or (scope.cancel_called and result is None and not error_message):
            if control.cancelled:
                finish_reason, error_message = "cancelled", f"rollout cancelled ({control.reason})"
            else:
                finish_reason = "timeout"
                error_message = _deadline_message(ctx, deadline_s, deadline_at)
            result = None
        if result is not None and not isinstance(result, RolloutResult):
            control.category = "validation_error"
            error_message = (
                f"run() returned {type(result).__name__}; it must return ctx.complete(messages) "
                "or ctx.error(message)"
            )
            result = None
        if isinstance(result, RolloutResult) and not _valid_reward(result.reward):
            control.category = "validation_error"
            error_message = f"reward must be a finite number or None, got {result.reward!r}"
            result = None
        if result is None and error_message is None:
            control.category = "validation_error"
            error_message = (
                "run() returned None; it must return ctx.complete(...) or ctx.error(...)"
            )

        metrics = ctx.metrics
        response: RolloutResponse | None = None
        if isinstance(result, RolloutResult):
            try:
                response = RolloutResponse(
                    rollout_id=request.rollout_id,
                    status=result.status,
                    final_messages=result.final_messages,
                    finish_reason=result.finish_reason,
                    # ctx.error(f"... {key}") must not carry the key into the callback or outbox.
                    error_message=(
                        scrub(result.error_message, request.api_key_value)
                        if result.error_message is not None
                        else None
                    ),
                    reward=result.reward,
                    metrics=metrics,
                    extra_fields=result.extra_fields,
                )
                wire_json(response)  # what cannot be serialised cannot be sent: fail it here
            except (ValidationError, PydanticSerializationError) as exc:
                detail = (
                    describe_validation_error(exc) if isinstance(exc, ValidationError) else str(exc)
                )
                error_message = f"run() returned a result that cannot be sent: {detail}"
                control.category = "validation_error"
                response = None
        if response is None:
            # A result that could not be sent keeps its own messages (made JSON-safe below).
            kept = result.final_messages if isinstance(result, RolloutResult) else None
            response = _error_response(
                request, kept or ctx.partial_messages, error_message or "", finish_reason, metrics
            )
        if trace is not None:
            seen = ctx.partial_messages if ctx.turns else []
            final_from, final_tail = _final_delta(seen, response.final_messages)
            ctx.log_event(
                "rollout_end",
                status=response.status.value,
                finish_reason=response.finish_reason,
                error_message=response.error_message,
                reward=response.reward,
                extra_fields=response.extra_fields,
                metrics=metrics.model_dump(),
                final_from=final_from,
                final_messages=final_tail,
            )
        _log_finished(response)
        _end_span(span, response)
        return response


def _deadline_message(ctx: RolloutContext, deadline_s: float | None, deadline_at: float) -> str:
    """The timeout's error message; it names the tool call the deadline cut, if one was running
    (a hung tool is the usual cause, and the one the agent's code does not show)."""
    message = f"rollout exceeded its deadline of {deadline_s:g} s"
    # The deadline is set on anyio's clock; this one, a little apart, allows for the difference.
    cut = tool_cut_since(ctx, deadline_at - 0.05)
    if cut is not None:
        name, seconds = cut
        message += f"; tool {name!r} had been running for {seconds:.1f} s of it"
    return message


def _end_span(span: Any, response: RolloutResponse) -> None:
    telemetry.end_rollout(span, response.status.value, response.finish_reason, response.reward)


def _log_finished(response: RolloutResponse) -> None:
    """One line per finished rollout: what an operator watching ``osmosis serve`` needs (id,
    status, finish reason, turns, time) and, for an ``ERROR``, why."""
    metrics = response.metrics
    turns = metrics.num_llm_calls if metrics is not None else 0
    seconds = (metrics.total_latency_ms if metrics is not None else 0.0) / 1000
    line = (
        f"rollout {loggable(response.rollout_id)} {response.status.value} "
        f"({response.finish_reason}), {turns} turn{'s' if turns != 1 else ''}, {seconds:.2f} s"
    )
    # INFO, not WARNING, even for an ERROR: `osmosis serve` shows it at its default level, and
    # `osmosis test -i`, which reports the outcome itself, does not get it twice.
    if response.status is RolloutStatus.ERROR:
        line = f"{line}: {response.error_message}"
    logger.info("%s", line)


def _final_delta(seen: list[Message], final: list[Message]) -> tuple[int, list[Message]]:
    """The final messages as ``(index, tail)`` after what the last turn already traced (the
    history and reply), or ``(0, everything)`` when the agent returned something else."""
    if len(final) >= len(seen) and final[: len(seen)] == seen:
        return len(seen), final[len(seen) :]
    return 0, final


def _log_agent_crash(request: RolloutRequest) -> None:
    """Log the agent's traceback (with exc_info, which ``validate`` reads) unless it holds the
    api_key; then only the scrubbed text is logged."""
    text = traceback.format_exc()
    scrubbed = scrub(text, request.api_key_value)
    rollout_id = loggable(request.rollout_id)
    if scrubbed != text:
        logger.error("rollout %s: the agent raised\n%s", rollout_id, scrubbed)
    else:
        logger.exception("rollout %s: the agent raised", rollout_id)


def _valid_reward(reward: object) -> bool:
    if reward is None:
        return True
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        return False
    return math.isfinite(reward)


def _error_response(
    request: RolloutRequest,
    messages: list[Message],
    message: str,
    finish_reason: str = "error",
    metrics: Any = None,
) -> RolloutResponse:
    response = RolloutResponse(
        rollout_id=request.rollout_id,
        status=RolloutStatus.ERROR,
        final_messages=messages,
        finish_reason=finish_reason,
        error_message=scrub(message, request.api_key_value),
        metrics=metrics,
    )
    try:
        wire_json(response)
    except PydanticSerializationError:
        # The agent put something that is not JSON in its messages: keep them, as text.
        safe = json.loads(json.dumps(messages, default=repr))
        response = response.model_copy(update={"final_messages": safe})
    return response
