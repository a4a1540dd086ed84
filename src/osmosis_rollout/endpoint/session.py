"""One rollout's OpenAI-compatible endpoint: each call becomes one ``ctx.chat`` turn.

Every call goes through the rollout's own context, so it is checked, traced, measured,
recorded and replayed exactly like a turn of a ``ctx.chat`` agent, on whatever wire the
rollout came in on. What such an agent can do that ``ctx.chat`` never did (change its tools,
ask for several choices, call in parallel, call after it completed) is recorded here as an
endpoint finding; the completion callback carries them (``metrics.endpoint_findings``) to the
mock TrainGate, which reports them with its own.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import ValidationError

from ..errors import OsmosisError
from ..findings import (
    CALL_AFTER_COMPLETION,
    N_GREATER_THAN_ONE,
    PARALLEL_CALLS,
    TOOL_CHOICE_DROPPED,
    TOOLS_CHANGED,
)
from ..protocol import describe_validation_error
from ..redaction import loggable, scrub
from .tool_history import ObservedCall, ToolHistory
from .translate import BadRequest, ChatCall, completion_body, error_body, parse_call, sse_events

if TYPE_CHECKING:
    from ..protocol import OpenAIFunctionToolSchema, RolloutRequest
    from ..results import CompletionsResult

__all__ = ["EndpointContext", "EndpointReply", "RolloutEndpoint"]

logger = logging.getLogger("osmosis_rollout.endpoint")


@dataclass(slots=True)
class EndpointReply:
    """An HTTP answer, whole: the in-process transport and the loopback listener send it."""

    status: int
    body: bytes
    content_type: str = "application/json"


def _tool_key(tool: Any) -> tuple[str, str] | None:
    """A tool as (name, its schema as canonical JSON), for comparing declared and sent tools."""
    if not isinstance(tool, dict):
        return None
    function = tool.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        return None
    params = function.get("parameters") or {"type": "object", "properties": {}}
    return function["name"], json.dumps(params, sort_keys=True, separators=(",", ":"))


class EndpointContext(Protocol):
    """What the endpoint needs of a rollout's context (``agent.RolloutContext`` is one): typed
    here, so the endpoint knows the context by what it uses and ``agent`` is free to import the
    endpoint, never the other way round."""

    @property
    def request(self) -> RolloutRequest:
        """The rollout's request (its id, its secret)."""
        ...

    @property
    def tools(self) -> list[OpenAIFunctionToolSchema]:
        """The tools the agent declared."""
        ...

    @property
    def turns(self) -> int:
        """How many LLM turns have been run."""
        ...

    @property
    def llm(self) -> Any:
        """The backend the turns go through (``sends_tools``: protocol v2's chat channel)."""
        ...

    @property
    def ended(self) -> bool:
        """Whether the agent completed the rollout (``complete`` or ``error``)."""
        ...

    def log_event(self, event_type: str, **data: Any) -> None:
        """Add an event to the rollout's debug trace."""
        ...

    async def chat(self, messages: Sequence[Any], **params: Any) -> CompletionsResult:
        """Run one LLM turn."""
        ...


class RolloutEndpoint:
    """The endpoint of one rollout, bound to its context (``door.OpenAIDoor`` makes it)."""

    def __init__(
        self,
        ctx: EndpointContext,
        *,
        observe_tools: Callable[[Sequence[ObservedCall]], None] | None = None,
    ) -> None:
        self.ctx = ctx
        #: Told the tool calls the agent ran itself, seen answered in a later call's history.
        self.observe_tools = observe_tools
        self._tool_history = ToolHistory()
        self.findings: list[dict[str, Any]] = []
        self.closed = False
        self._in_flight = 0
        self._declared: set[tuple[str, str]] | None = None
        self._seen: set[str] = set()
        self._last_call: list[Any] | None = None  # the previous call's history

    # -- findings ------------------------------------------------------------------------

    def add_finding(self, code: str, message: str, **details: Any) -> None:
        """Record one endpoint finding (once per code and turn), log it, trace it."""
        turn = self.ctx.turns + 1
        key = f"{code}:{turn}"
        if key in self._seen:
            return
        self._seen.add(key)
        finding = {"code": code, "message": message, "turn": turn, **details}
        self.findings.append(finding)
        logger.warning("rollout %s: %s", loggable(self.ctx.request.rollout_id), message)
        self.ctx.log_event("endpoint_finding", **finding)

    def _declared_tools(self) -> set[tuple[str, str]]:
        if self._declared is None:
            keys = (_tool_key(t.model_dump(mode="json", exclude_none=True)) for t in self.ctx.tools)
            self._declared = {k for k in keys if k is not None}
        return self._declared

    def _check_call(self, call: ChatCall, *, per_call_tools: bool) -> None:
        """The endpoint findings of one call; ``per_call_tools``: the wire carries each call's
        own tools and ``tool_choice`` (protocol v2), so neither is lost, only different."""
        turn = self.ctx.turns + 1
        if call.tools is not None:
            sent = {k for k in (_tool_key(t) for t in call.tools) if k is not None}
            declared = self._declared_tools()
            if sent != declared:
                added = sorted({n for n, _ in sent} - {n for n, _ in declared})
                dropped = sorted({n for n, _ in declared} - {n for n, _ in sent})
                changed = sorted({n for n, _ in sent ^ declared} - set(added) - set(dropped))
                parts = [
                    f"{label} {names}"
                    for label, names in (("added", added), ("dropped", dropped))
                    if names
                ]
                if changed:
                    parts.append(f"schema changed {changed}")
                if per_call_tools:
                    why = (
                        "the call carries its own tools to the trainer (protocol v2), but "
                        "osmosis validate, the dry run and the rollout's records know the "
                        "declared ones"
                    )
                else:
                    why = "TrainGate trains on the declared tools"
                self.add_finding(
                    TOOLS_CHANGED,
                    f"turn {turn} sent tools that differ from those declared at init "
                    f"({'; '.join(parts)}): {why}; return every tool from get_tools and send "
                    "the same list each call",
                    added=added,
                    dropped=dropped,
                    changed=changed,
                )
        elif self._declared_tools():
            prompted = (
                "the call went without tools (protocol v2 carries each call's own), so the "
                "model saw none"
                if per_call_tools
                else "the model is prompted with them all the same"
            )
            self.add_finding(
                TOOLS_CHANGED,
                f"turn {turn} sent no tools, but tools were declared at init: {prompted}; "
                "send the declared tools each call",
                added=[],
                dropped=sorted(n for n, _ in self._declared_tools()),
                changed=[],
            )
        if call.tool_choice not in (None, "auto") and not per_call_tools:
            self.add_finding(
                TOOL_CHOICE_DROPPED,
                f"turn {turn} asked for tool_choice {call.tool_choice!r}, which TrainGate's v1 "
                "wire cannot carry: the model chose freely ('auto')",
            )

    # -- a call ---------------------------------------------------------------------------

    async def handle(self, content: bytes) -> EndpointReply:
        """Answer one ``POST .../chat/completions`` body."""
        if self.closed or self.ctx.ended:
            self.add_finding(
                CALL_AFTER_COMPLETION,
                "a chat call arrived after the rollout had completed (ctx.complete or ctx.error "
                "was called, or run() returned): it was refused and never reached TrainGate; "
                "stop the agent before ending the rollout",
            )
            return EndpointReply(
                409,
                error_body("this rollout has already completed", "invalid_request_error"),
            )
        try:
            call = parse_call(content)
        except BadRequest as exc:
            return EndpointReply(400, error_body(str(exc), "invalid_request_error"))
        if call.n > 1:
            self.add_finding(
                N_GREATER_THAN_ONE,
                f"turn {self.ctx.turns + 1} asked for n={call.n} choices: a rollout's turn has "
                "one reply (ask for n=1 and run more rollouts instead)",
            )
            return EndpointReply(
                400,
                error_body(
                    f"n={call.n} is not supported: one rollout's turn has one reply; send n=1",
                    "invalid_request_error",
                    "n_not_supported",
                ),
            )
        per_call_tools = bool(getattr(self.ctx.llm, "sends_tools", False))
        self._check_call(call, per_call_tools=per_call_tools)
        sibling = self._last_call is not None and call.messages == self._last_call
        self._last_call = call.messages
        if self._in_flight or sibling:
            self.add_finding(
                PARALLEL_CALLS,
                f"turn {self.ctx.turns + 1} was sent alongside another call of the same rollout "
                "(while it ran, or with its history and without its reply): parallel calls "
                "branch the history, which does not train as one trajectory; await each call "
                "and append its reply before the next",
            )
        if self.observe_tools is not None:
            observed = self._tool_history.answered(call.messages)
            if observed:
                self.observe_tools(observed)
        params = call.params
        if per_call_tools:  # protocol v2: this call's tools and tool_choice, as it sent them
            params = {**params, "tools": call.tools or [], "tool_choice": call.tool_choice}
        self._in_flight += 1
        try:
            result = await self.ctx.chat(call.messages, **params)
        except ValidationError as exc:  # a sampling parameter of the wrong type, say
            message = f"this request cannot be sent: {describe_validation_error(exc)}"
            return EndpointReply(400, error_body(message, "invalid_request_error"))
        except OsmosisError as exc:
            message = scrub(f"{type(exc).__name__}: {exc}", self.ctx.request.api_key_value)
            return EndpointReply(502, error_body(message, "upstream_error"))
        finally:
            self._in_flight -= 1
        if self.observe_tools is not None and result.tool_calls:
            self._tool_history.replied(result.tool_calls)
        turn_id = f"{self.ctx.turns}"
        if call.stream:
            body = sse_events(result, turn_id, call.model, include_usage=call.include_usage)
            return EndpointReply(200, body, "text/event-stream")
        return EndpointReply(200, completion_body(result, turn_id, call.model))
