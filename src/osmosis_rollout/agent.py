"""The agent API: ``RolloutAgentLoop`` (what users subclass) and ``RolloutContext`` (their door).

An agent sees TrainGate only through its context: ``await ctx.chat(messages)`` for each LLM turn,
then ``ctx.complete(...)`` or ``ctx.error(...)``. The context measures latency and tokens, and
guards the one rule that keeps training data sound: the history sent to the LLM only grows
(see ``protocol.md`` section 3). A violation is recorded and logged, never raised, so that
``osmosis test`` and ``validate`` can report it.
"""

from __future__ import annotations

import copy
import inspect
import json
import logging
import re
import time
from abc import ABCMeta, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, ValidationError

from .errors import AgentDefinitionError
from .protocol import (
    CompletionsRequest,
    CompletionsResponse,
    Message,
    OpenAIFunctionToolSchema,
    RolloutMetrics,
    RolloutRequest,
    RolloutStatus,
    describe_validation_error,
    first_divergence,
)

__all__ = [
    "TOOL_NAME_PATTERN",
    "ChatBackend",
    "CompletionsResult",
    "RolloutAgentLoop",
    "RolloutContext",
    "RolloutResult",
    "resolve_tools",
]

logger = logging.getLogger("osmosis_rollout.agent")

TOOL_NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
#: Keys an agent may not send per call: TrainGate knows the tools from the init response.
_NEVER_SENT = frozenset({"tools", "tool_choice", "messages", "rollout_id"})


class ChatBackend(Protocol):
    """What a context needs to run one LLM turn; ``client.RolloutChannel`` implements it."""

    async def chat_completions(
        self, request: CompletionsRequest, *, request_id: str
    ) -> CompletionsResponse: ...


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------


@dataclass
class RolloutResult:
    """How ``run()`` ended, as returned by ``ctx.complete(...)`` or ``ctx.error(...)``."""

    status: RolloutStatus
    final_messages: list[Message]
    finish_reason: str | None = None
    reward: float | None = None
    error_message: str | None = None
    extra_fields: dict[str, Any] = field(default_factory=dict)


@dataclass
class CompletionsResult:
    """One LLM reply, ready to append: ``messages.append(result.message)``."""

    message: Message
    finish_reason: str | None
    usage: dict[str, int]
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    prompt_token_ids: list[int] | None = None

    @property
    def content(self) -> str | None:
        """The assistant's text, or None when it only called tools."""
        content = self.message.get("content")
        return content if isinstance(content, str) else None

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        """The tool calls as OpenAI dicts (``{"id", "type", "function": {name, arguments}}``)."""
        return list(self.message.get("tool_calls") or [])

    @property
    def has_tool_calls(self) -> bool:
        """True when the model asked for at least one tool call."""
        return bool(self.message.get("tool_calls"))


# --------------------------------------------------------------------------------------------
# The base class
# --------------------------------------------------------------------------------------------


class _AgentMeta(ABCMeta):
    """Checks ``name`` once the class is complete (ABCMeta knows abstractness only then)."""

    def __new__(
        mcs, cls_name: str, bases: tuple[type, ...], namespace: dict[str, Any], **kwargs: Any
    ) -> _AgentMeta:
        cls = super().__new__(mcs, cls_name, bases, namespace, **kwargs)
        if bases and not getattr(cls, "__abstractmethods__", None):
            name = getattr(cls, "name", None)
            if not isinstance(name, str) or not name.strip():
                raise TypeError(
                    f"{cls.__module__}.{cls_name} must set a class attribute `name` to a "
                    f'non-empty string, e.g. `name = "{cls_name.lower()}"`'
                )
        return cls


class RolloutAgentLoop(metaclass=_AgentMeta):
    """Subclass this: set ``name``, return tools from ``get_tools``, drive turns in ``run``."""

    name: ClassVar[str]

    @abstractmethod
    def get_tools(self, request: RolloutRequest) -> Any:
        """Return this rollout's tools (OpenAI function tools, dicts or models); may be async."""

    @abstractmethod
    async def run(self, ctx: RolloutContext) -> RolloutResult:
        """Run one rollout; end with ``return ctx.complete(messages)`` or ``ctx.error(msg)``."""


async def resolve_tools(
    agent: RolloutAgentLoop, request: RolloutRequest
) -> list[OpenAIFunctionToolSchema]:
    """Call ``get_tools`` (sync or async) and check what it returned.

    Raises ``AgentDefinitionError`` naming the offending entry, e.g. ``tools[2]``.
    """
    raw = agent.get_tools(request)
    if inspect.isawaitable(raw):
        raw = await raw
    if raw is None:
        return []
    if not isinstance(raw, list | tuple):
        raise AgentDefinitionError(
            f"get_tools() must return a list of tools, got {type(raw).__name__}"
        )
    tools: list[OpenAIFunctionToolSchema] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        try:
            tool = OpenAIFunctionToolSchema.model_validate(
                item.model_dump(exclude_none=True) if isinstance(item, BaseModel) else item
            )
            json.dumps(tool.model_dump(exclude_none=True), allow_nan=False)
        except (ValidationError, TypeError, ValueError) as exc:
            raise AgentDefinitionError(
                f"tools[{i}] is not a valid OpenAI function tool: {_first_error(exc)}"
            ) from None
        if not TOOL_NAME_PATTERN.match(tool.name):
            raise AgentDefinitionError(
                f"tools[{i}].function.name {tool.name!r} must match ^[a-zA-Z0-9_-]{{1,64}}$"
            )
        if tool.name in seen:
            raise AgentDefinitionError(f"tools[{i}].function.name {tool.name!r} is duplicated")
        seen.add(tool.name)
        tools.append(tool)
    return tools


def _first_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return describe_validation_error(exc, limit=1)
    return str(exc)


# --------------------------------------------------------------------------------------------
# The context
# --------------------------------------------------------------------------------------------


def _as_message(item: Any) -> Message:
    if isinstance(item, BaseModel):
        return item.model_dump(mode="json", exclude_none=True)
    if isinstance(item, dict):
        return item
    raise TypeError(f"messages must be dicts (OpenAI chat messages), got {type(item).__name__}")


class RolloutContext:
    """One rollout's state, handed to ``run()``: request, tools, LLM access and metrics."""

    def __init__(
        self,
        request: RolloutRequest,
        tools: Sequence[OpenAIFunctionToolSchema],
        llm: ChatBackend,
        *,
        trace: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.request = request
        self.tools = list(tools)
        self.llm = llm
        self._trace = trace
        self._started = time.perf_counter()
        self._finished: float | None = None
        self._llm_ms = 0.0
        self._tool_ms = 0.0
        self._llm_calls = 0
        self._tool_calls = 0
        self._prompt_tokens = 0
        self._response_tokens = 0
        self._max_context = 0
        # Deep copies of the last history sent plus its reply: what the next call must start with.
        # Copies, so that an agent editing a message in place is caught too.
        self._sent: list[Message] | None = None
        self._turns_started = 0
        self._last_messages: list[Message] = list(request.messages)
        self.append_only_violations: list[dict[str, Any]] = []

    # -- LLM turns ---------------------------------------------------------------------------

    async def chat(self, messages: Sequence[Any], **params: Any) -> CompletionsResult:
        """Run one LLM turn on the full history ``messages``.

        ``request.completion_params`` are the defaults; ``params`` override them per call.
        """
        history = [_as_message(m) for m in messages]
        kept = self._check_append_only(history)
        body: dict[str, Any] = {**self.request.completion_params}
        body.update({k: v for k, v in params.items() if k not in _NEVER_SENT})
        for key in _NEVER_SENT:
            body.pop(key, None)
        request = CompletionsRequest(rollout_id=self.request.rollout_id, messages=history, **body)
        self._turns_started += 1  # reserved before the await: concurrent calls get distinct ids
        turn = self._turns_started
        # What this turn added to the history: the trace stores deltas, not every full history.
        delta_from = len(kept)
        self._last_messages = list(history)
        started = time.perf_counter()
        try:
            response = await self.llm.chat_completions(
                request, request_id=f"{self.request.rollout_id}:{turn}"
            )
        except BaseException as exc:
            self._llm_ms += (time.perf_counter() - started) * 1000
            self._llm_calls += 1
            if self._trace is not None:
                self._trace_turn(turn, history, delta_from, body, started, error=exc)
            raise
        self._llm_ms += (time.perf_counter() - started) * 1000
        self._llm_calls += 1
        choice = response.choices[0]
        reply = choice.message.model_dump(mode="json", exclude_none=True)
        usage = response.usage
        if self._trace is not None:
            self._trace_turn(turn, history, delta_from, body, started, response=response)
        self._prompt_tokens += usage.prompt_tokens
        self._response_tokens += usage.completion_tokens
        self._max_context = max(self._max_context, usage.prompt_tokens)
        self._sent = [*kept, *copy.deepcopy(history[len(kept) :]), copy.deepcopy(reply)]
        self._last_messages = [*history, reply]
        return CompletionsResult(
            message=reply,
            finish_reason=choice.finish_reason,
            usage=usage.model_dump(),
            token_ids=response.token_ids,
            logprobs=response.logprobs,
            prompt_token_ids=response.prompt_token_ids,
        )

    def _trace_turn(
        self,
        turn: int,
        history: list[Message],
        delta_from: int,
        params: dict[str, Any],
        started: float,
        *,
        response: CompletionsResponse | None = None,
        error: BaseException | None = None,
    ) -> None:
        """Record one LLM turn: the messages it added, the reply (or the error) and its cost."""
        event: dict[str, Any] = {
            "turn": turn,
            "delta_from": delta_from,
            "messages": history[delta_from:],
            "params": params,
            "latency_ms": round((time.perf_counter() - started) * 1000, 3),
        }
        if response is not None:
            choice = response.choices[0]
            event["reply"] = choice.message.model_dump(mode="json", exclude_none=True)
            event["finish_reason"] = choice.finish_reason
            event["usage"] = response.usage.model_dump()
        if error is not None:
            name = type(error).__name__
            event["error"] = f"{name}: {error}" if str(error) else name
        self.log_event("turn", **event)

    def _check_append_only(self, history: list[Message]) -> list[Message]:
        """Record a violation if ``history`` does not start with what was sent before; return
        the verified prefix of snapshots to keep (empty after a violation)."""
        previous = self._sent
        if previous is None:
            return []
        index = first_divergence(previous, history)
        if index is None:
            return previous
        turn = self._llm_calls + 1
        violation = {"turn": turn, "index": index}
        self.append_only_violations.append(violation)
        logger.warning(
            "rollout %s: turn %d rewrote the history at message %d; the history sent to the "
            "LLM must only grow (append the reply and tool results, never edit or drop)",
            self.request.rollout_id,
            turn,
            index,
        )
        self.log_event("append_only_violation", **violation)
        return []

    # -- tools, events, results --------------------------------------------------------------

    def record_tool_call(self, latency_ms: float = 0.0) -> None:
        """Count one tool call and add its latency (``tools.execute_tool_calls`` does this)."""
        self._tool_calls += 1
        self._tool_ms += max(0.0, float(latency_ms))

    def log_event(self, type: str, **data: Any) -> None:
        """Append ``{"event": type, "rollout_id": ..., **data}`` to the debug trace, if any."""
        if self._trace is not None:
            self._trace({"event": type, "rollout_id": self.request.rollout_id, **data})

    def complete(
        self,
        messages: Sequence[Any],
        finish_reason: str = "stop",
        reward: float | None = None,
    ) -> RolloutResult:
        """End the rollout successfully with its final conversation and optional reward."""
        self._finished = time.perf_counter()
        return RolloutResult(
            status=RolloutStatus.COMPLETED,
            final_messages=[_as_message(m) for m in messages],
            finish_reason=finish_reason,
            reward=reward,
        )

    def error(self, message: str, final_messages: Sequence[Any] | None = None) -> RolloutResult:
        """End the rollout as failed; the conversation so far is kept unless given."""
        self._finished = time.perf_counter()
        final = self._last_messages if final_messages is None else final_messages
        return RolloutResult(
            status=RolloutStatus.ERROR,
            final_messages=[_as_message(m) for m in final],
            finish_reason="error",
            error_message=message,
        )

    @property
    def partial_messages(self) -> list[Message]:
        """The longest conversation seen so far: the last history sent plus its reply."""
        return list(self._last_messages)

    @property
    def turns(self) -> int:
        """How many LLM turns have been run."""
        return self._llm_calls

    @property
    def metrics(self) -> RolloutMetrics:
        """A snapshot of this rollout's metrics (total latency up to now or to the end)."""
        end = self._finished if self._finished is not None else time.perf_counter()
        extra: dict[str, Any] = {}
        if self.append_only_violations:
            extra["append_only_violations"] = len(self.append_only_violations)
        return RolloutMetrics(
            total_latency_ms=round((end - self._started) * 1000, 3),
            llm_latency_ms=round(self._llm_ms, 3),
            tool_latency_ms=round(self._tool_ms, 3),
            num_llm_calls=self._llm_calls,
            num_tool_calls=self._tool_calls,
            prompt_tokens=self._prompt_tokens,
            response_tokens=self._response_tokens,
            max_context_tokens=self._max_context,
            **extra,
        )
