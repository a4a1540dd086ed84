"""The agent API: ``RolloutAgentLoop`` (what users subclass) and ``RolloutContext`` (their door).

An agent sees TrainGate only through its context: ``await ctx.chat(messages)`` for each LLM turn,
then ``ctx.complete(...)`` or ``ctx.error(...)``. The context measures latency and tokens, and
guards the one rule that keeps training data sound: the history sent to the LLM only grows
(see ``protocol.md`` section 3). A violation is recorded and logged, never raised, so that
``osmosis test`` and ``validate`` can report it.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import json
import logging
import re
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import anyio
from pydantic import BaseModel, TypeAdapter, ValidationError

from . import telemetry
from .append_only import first_divergence
from .errors import AgentDefinitionError
from .protocol import (
    CompletionsRequest,
    CompletionsResponse,
    Message,
    OpenAIFunctionSchema,
    OpenAIFunctionToolSchema,
    RolloutMetrics,
    RolloutRequest,
    RolloutStatus,
    describe_validation_error,
)
from .redaction import loggable

__all__ = [
    "TOOL_NAME_PATTERN",
    "ChatBackend",
    "CompletionsResult",
    "RolloutAgentLoop",
    "RolloutContext",
    "RolloutResult",
    "ToolSet",
    "resolve_tool_set",
    "resolve_tools",
]

logger = logging.getLogger("osmosis_rollout.agent")

TOOL_NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
#: Keys an agent may not send per call: TrainGate knows the tools from the init response.
_NEVER_SENT = frozenset({"tools", "tool_choice", "messages", "rollout_id"})


class TurnObserver(Protocol):
    """Told about each LLM turn and tool call as it ends (the server's Prometheus metrics)."""

    def turn(self, latency_s: float, prompt_tokens: int, completion_tokens: int) -> None: ...

    def tool(self, latency_s: float) -> None: ...


class ChatBackend(Protocol):
    """What a context needs to run one LLM turn; ``client.RolloutChannel`` implements it.

    The context tells a backend from a v1-style client (``chat_completions(messages, **kw)``)
    by the ``request_id`` parameter, so implementations must name it."""

    async def chat_completions(
        self, request: CompletionsRequest, *, request_id: str
    ) -> CompletionsResponse: ...


@runtime_checkable
class LLMClientProtocol(Protocol):
    """v1's LLM client contract, what ``ctx.llm`` offers and what fake LLMs in agents' unit
    tests implement: ``await chat_completions(messages, **params)`` and ``get_metrics()``."""

    async def chat_completions(self, messages: list[Message], **kwargs: Any) -> Any: ...

    def get_metrics(self) -> RolloutMetrics: ...


#: ``_is_chat_backend``'s answer per class-level ``chat_completions`` function: it cannot
#: change, and ``inspect.signature`` would cost ~0.05 ms once per rollout.
_BACKEND_METHODS: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def _is_chat_backend(llm: object) -> bool:
    """True for our backends (``chat_completions(request, *, request_id)``); False for a v1
    client or fake (``chat_completions(messages, **kw)``), which the context calls as v1 did."""
    method = getattr(type(llm), "chat_completions", None)
    own = getattr(llm, "__dict__", None)
    if not inspect.isfunction(method) or (own and "chat_completions" in own):
        return _signature_says_backend(llm)  # set on the instance, or not a plain method
    known = _BACKEND_METHODS.get(method)
    if known is None:
        known = _BACKEND_METHODS[method] = _signature_says_backend(llm)
    return known


def _signature_says_backend(llm: object) -> bool:
    try:
        parameters = inspect.signature(llm.chat_completions).parameters  # type: ignore[attr-defined]
    except (AttributeError, TypeError, ValueError):
        return False
    return "request_id" in parameters


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------


@dataclass
class RolloutResult:
    """How ``run()`` ended, as returned by ``ctx.complete(...)`` or ``ctx.error(...)``.

    The positional order is v1's: ``(status, final_messages, finish_reason, error_message,
    metrics, reward)``. ``metrics`` is the context's snapshot when the result was made; the
    server sends the final metrics of the rollout.
    """

    status: RolloutStatus
    final_messages: list[Message]
    finish_reason: str | None = None
    error_message: str | None = None
    metrics: RolloutMetrics | None = None
    reward: float | None = None
    extra_fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CompletionsResult:
    """One LLM reply, ready to append: ``messages.append(result.message)``.

    Positional order as in v1: ``(message, token_ids, logprobs, usage, finish_reason)``.
    """

    message: Message
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    usage: dict[str, int] = field(default_factory=dict)
    finish_reason: str | None = None
    prompt_token_ids: list[int] | None = None

    @classmethod
    def from_response(cls, response: CompletionsResponse) -> CompletionsResult:
        """The first choice of a chat completion, as a dict message plus token data."""
        choice = response.choices[0]
        return cls(
            message=choice.message.model_dump(mode="json", exclude_none=True),
            token_ids=response.token_ids,
            logprobs=response.logprobs,
            usage=response.usage.model_dump(),
            finish_reason=choice.finish_reason,
            prompt_token_ids=response.prompt_token_ids,
        )

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


def _is_abstract(cls: type) -> bool:
    """Whether ``cls`` still has abstract methods, computed as ABCMeta will once it finishes
    (``__init_subclass__`` runs before ABCMeta sets ``__abstractmethods__``)."""
    if any(getattr(v, "__isabstractmethod__", False) for v in vars(cls).values()):
        return True
    return any(
        getattr(getattr(cls, name, None), "__isabstractmethod__", False)
        for base in cls.__bases__
        for name in getattr(base, "__abstractmethods__", ())
    )


class RolloutAgentLoop(ABC):
    """Subclass this: set ``name``, return tools from ``get_tools``, drive turns in ``run``.

    A plain ``ABC`` (no metaclass of its own), so ``class MyAgent(RolloutAgentLoop,
    pydantic.BaseModel)`` works; declare ``name: ClassVar[str] = "..."`` there.
    """

    name: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if _is_abstract(cls):
            return
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not name.strip():
            raise TypeError(
                f"Agent loop class {cls.__module__}.{cls.__name__} must define a 'name' class "
                "attribute: set `name` to a non-empty string, e.g. "
                f'`name = "{cls.__name__.lower()}"`'
            )

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
    return list((await resolve_tool_set(agent, request)).tools)


@dataclass(frozen=True, slots=True)
class ToolSet:
    """One checked tool list: the models an agent sees and their JSON for the init's 202.

    Shared between rollouts whose ``get_tools`` returned the same tools, so treat the models
    as read-only (as the tool objects an agent returns each time already are)."""

    tools: tuple[OpenAIFunctionToolSchema, ...]
    json: bytes


_TOOLS_JSON = TypeAdapter(list[OpenAIFunctionToolSchema])


class _ToolSetCache:
    """The last few checked tool lists, by their JSON text, so that an agent returning the same
    tools for every rollout (the usual case) has them checked once, not per rollout.

    A hit needs the same JSON text *and* equal Python values (so ``{1: ...}`` is not taken for
    ``{"1": ...}``, nor ``1`` for ``1.0``); anything that does not round-trip through JSON is
    checked every time. A list that changes (per rollout, or in place) has another key."""

    __slots__ = ("_entries", "limit")

    def __init__(self, limit: int = 64) -> None:
        self.limit = limit
        self._entries: dict[str, tuple[list[Any], ToolSet]] = {}

    def get(self, key: str, items: list[Any]) -> ToolSet | None:
        found = self._entries.get(key)
        if found is None or found[0] != items:
            return None
        return found[1]

    def put(self, key: str, items: list[Any], tool_set: ToolSet) -> None:
        loaded = json.loads(key)
        if loaded != items:  # tuples, non-string keys...: not JSON data, never cached
            return
        if len(self._entries) >= self.limit:
            del self._entries[next(iter(self._entries))]  # the oldest
        self._entries[key] = (loaded, tool_set)


_tool_sets = _ToolSetCache()


async def resolve_tool_set(
    agent: RolloutAgentLoop, request: RolloutRequest, *, timeout_s: float | None = None
) -> ToolSet:
    """:func:`resolve_tools` with the tools' JSON, checked once per distinct tool list.

    ``timeout_s`` bounds an async ``get_tools`` (``TimeoutError``); a sync one cannot be
    interrupted, so it gets no cancel scope to pay for.
    """
    raw = agent.get_tools(request)
    if inspect.isawaitable(raw):
        with anyio.fail_after(timeout_s):
            raw = await raw
    if raw is None:
        return _NO_TOOLS
    if not isinstance(raw, list | tuple):
        raise AgentDefinitionError(
            f"get_tools() must return a list of tools, got {type(raw).__name__}"
        )
    items, key = _cache_key(raw)
    if key is not None:
        cached = _tool_sets.get(key, items)
        if cached is not None:
            return cached
    tools = _check_tools(raw)
    tool_set = ToolSet(tuple(tools), _TOOLS_JSON.dump_json(tools, exclude_none=True))
    if key is not None:
        _tool_sets.put(key, items, tool_set)
    return tool_set


def _cache_key(raw: list[Any] | tuple[Any, ...]) -> tuple[list[Any], str | None]:
    """What ``get_tools`` returned as JSON-like data (models dumped as the check dumps them)
    and its JSON text; no text (never cached) when it is not plain JSON."""
    try:
        items = [_plain_tool(item) if isinstance(item, BaseModel) else item for item in raw]
        return items, json.dumps(items, allow_nan=False, separators=(",", ":"))
    except Exception:  # the check names what is wrong
        return [], None


def _plain_tool(item: BaseModel) -> Any:
    """``item.model_dump(exclude_none=True)``, read straight off our own tool models (what a
    ``Toolbox`` returns): pydantic's dump of a schema costs ~20 us a tool, every rollout."""
    function = getattr(item, "function", None)
    if (
        type(item) is not OpenAIFunctionToolSchema
        or type(function) is not OpenAIFunctionSchema
        or item.model_extra
        or function.model_extra
    ):
        return item.model_dump(exclude_none=True)
    plain: dict[str, Any] = {"name": function.name}
    if function.description is not None:
        plain["description"] = function.description
    plain["parameters"] = function.parameters
    if function.strict is not None:
        plain["strict"] = function.strict
    return {"type": item.type, "function": plain}


def _check_tools(raw: list[Any] | tuple[Any, ...]) -> list[OpenAIFunctionToolSchema]:
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


_NO_TOOLS = ToolSet((), b"[]")


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


_ATOMS = (str, int, float, bool, type(None))


def _snapshot(value: Any) -> Any:
    """A deep copy of JSON-shaped data, a few times cheaper than :func:`copy.deepcopy` on a
    message; anything else is deep-copied. What the append-only check compares against."""
    kind = type(value)
    if kind is dict:
        return {key: _snapshot(item) for key, item in value.items()}
    if kind is list:
        return [_snapshot(item) for item in value]
    if kind in _ATOMS:
        return value
    return copy.deepcopy(value)


class _LLMView:
    """``ctx.llm`` over our backend, with v1's client contract: each call is a ``ctx.chat``
    turn (so it is measured and checked like one) and ``get_metrics()`` reports the LLM side."""

    def __init__(self, ctx: RolloutContext) -> None:
        self._ctx = ctx

    def __repr__(self) -> str:
        return f"<ctx.llm of rollout {self._ctx.request.rollout_id!r}>"

    def __getattr__(self, name: str) -> Any:
        # Anything else (``server_url``, ``client``...) is the backend's, as before this view.
        return getattr(self._ctx._backend, name)

    @property
    def rollout_id(self) -> str:
        """The rollout this client serves (v1's attribute)."""
        return self._ctx.request.rollout_id

    async def chat_completions(self, messages: Sequence[Any], **kwargs: Any) -> CompletionsResult:
        """One LLM turn; the same as ``await ctx.chat(messages, **kwargs)``."""
        return await self._ctx.chat(messages, **kwargs)

    def get_metrics(self) -> RolloutMetrics:
        """LLM latency, call count and tokens so far (the other fields are 0)."""
        ctx = self._ctx
        return RolloutMetrics(
            llm_latency_ms=round(ctx._llm_ms, 3),
            num_llm_calls=ctx._llm_calls,
            prompt_tokens=ctx._prompt_tokens,
            response_tokens=ctx._response_tokens,
        )


class RolloutContext:
    """One rollout's state, handed to ``run()``: request, tools, LLM access and metrics.

    ``llm`` is normally our backend. A v1-style client (``chat_completions(messages, **kw)``
    and ``get_metrics()``, e.g. a fake in an agent's unit test) also works: ``chat`` then calls
    it and returns its result unchanged, as v1 did. The underscored keywords are v1's: a
    monotonic start time, tool counters to start from, and a debug directory to write this
    rollout's events to (``<dir>/<rollout_id>.jsonl``).
    """

    def __init__(
        self,
        request: RolloutRequest,
        tools: Sequence[OpenAIFunctionToolSchema],
        llm: ChatBackend | LLMClientProtocol,
        *,
        trace: Callable[[dict[str, Any]], None] | None = None,
        observer: TurnObserver | None = None,
        _start_time: float | None = None,
        _tool_latency_ms: float = 0.0,
        _num_tool_calls: int = 0,
        _debug_dir: str | Path | None = None,
    ) -> None:
        self.request = request
        self.tools = list(tools)
        backend = _is_chat_backend(llm)
        self._backend: ChatBackend | None = llm if backend else None  # type: ignore[assignment]
        self._client: Any = None if backend else llm
        if trace is None and _debug_dir is not None:
            from .tracing import file_sink

            trace = file_sink(_debug_dir, request.rollout_id, secrets=[request.api_key_value])
        self._trace = trace
        self._observer = observer
        self._started: float | None = time.perf_counter()
        if _start_time is not None:  # v1: a time.monotonic() reading; 0 means "not measured"
            since = time.monotonic() - _start_time
            self._started = time.perf_counter() - since if _start_time > 0 else None
        self._finished: float | None = None
        self._llm_ms = 0.0
        self._tool_latency_ms = float(_tool_latency_ms)
        self._tool_wall_ms = float(_tool_latency_ms)
        self._tool_batches = 0  # > 0 while a Toolbox batch runs: its wall time is counted once
        self._llm_calls = 0
        self._num_tool_calls = int(_num_tool_calls)
        self._prompt_tokens = 0
        self._response_tokens = 0
        self._max_context = 0
        # Deep copies of the last history sent plus its reply: what the next call must start with.
        # Copies, so that an agent editing a message in place is caught too.
        self._sent: list[Message] | None = None
        self._turns_started = 0
        self._last_messages: list[Message] = list(request.messages)
        self.append_only_violations: list[dict[str, Any]] = []
        #: Each turn's ``finish_reason`` in order (``"length"``: cut by ``max_tokens``).
        self.finish_reasons: list[str | None] = []

    # -- LLM turns ---------------------------------------------------------------------------

    @property
    def llm(self) -> Any:
        """The LLM with v1's client contract: ``await ctx.llm.chat_completions(messages, **kw)``
        (a ``ctx.chat`` turn) and ``ctx.llm.get_metrics()``; a v1 client given to the
        constructor is returned as it is."""
        return self._client if self._client is not None else _LLMView(self)

    @property
    def debug_enabled(self) -> bool:
        """True when this rollout's events are written to a debug trace."""
        return self._trace is not None

    def _call_params(self, params: dict[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = {**self.request.completion_params}
        body.update({k: v for k, v in params.items() if k not in _NEVER_SENT})
        for key in _NEVER_SENT:
            body.pop(key, None)
        return body

    async def _chat_v1(self, messages: Sequence[Any], params: dict[str, Any]) -> Any:
        """A turn through a v1-style client: called as v1 did, its result returned unchanged."""
        self._turns_started += 1
        self._last_messages = [_as_message(m) for m in messages]
        started = time.perf_counter()
        try:
            result = await self._client.chat_completions(messages, **self._call_params(params))
        finally:
            self._llm_ms += (time.perf_counter() - started) * 1000
            self._llm_calls += 1
        reply = getattr(result, "message", None)
        if isinstance(reply, dict):
            self._last_messages = [*self._last_messages, reply]
        reason = getattr(result, "finish_reason", None)
        self.finish_reasons.append(reason if isinstance(reason, str) else None)
        return result

    async def chat_stream(self, messages: Sequence[Any], **params: Any) -> CompletionsResult:
        """v1's streaming turn. The protocol has no streaming, so it is :meth:`chat`; a v1-style
        client that has ``chat_completions_stream`` is called through that, as v1 did."""
        stream = getattr(self._client, "chat_completions_stream", None)
        if self._client is None or not callable(stream):
            return await self.chat(messages, **params)
        self._last_messages = [_as_message(m) for m in messages]
        return await stream(messages, **self._call_params(params))  # type: ignore[no-any-return]

    async def chat(self, messages: Sequence[Any], **params: Any) -> CompletionsResult:
        """Run one LLM turn on the full history ``messages``.

        ``request.completion_params`` are the defaults; ``params`` override them per call.
        """
        if self._backend is None:
            return await self._chat_v1(messages, params)  # type: ignore[no-any-return]
        history = [_as_message(m) for m in messages]
        kept = self._check_append_only(history)
        body = self._call_params(params)
        request = CompletionsRequest(rollout_id=self.request.rollout_id, messages=history, **body)
        self._turns_started += 1  # reserved before the await: concurrent calls get distinct ids
        turn = self._turns_started
        # What this turn added to the history: the trace stores deltas, not every full history.
        delta_from = len(kept)
        self._last_messages = list(history)
        started = time.perf_counter()
        try:
            with telemetry.llm_turn_span(self.request.rollout_id, turn) as span:
                response = await self._backend.chat_completions(
                    request, request_id=f"{self.request.rollout_id}:{turn}"
                )
                telemetry.end_turn(span, response.choices[0].finish_reason, response.usage)
        except BaseException as exc:
            self._llm_ms += (time.perf_counter() - started) * 1000
            self._llm_calls += 1
            if self._trace is not None:
                self._trace_turn(turn, history, delta_from, body, started, error=exc)
            raise
        self._llm_ms += (time.perf_counter() - started) * 1000
        self._llm_calls += 1
        result = CompletionsResult.from_response(response)
        reply = result.message
        usage = response.usage
        if self._trace is not None:
            self._trace_turn(turn, history, delta_from, body, started, response=response)
        if self._observer is not None:
            self._observer.turn(
                time.perf_counter() - started, usage.prompt_tokens, usage.completion_tokens
            )
        self._prompt_tokens += usage.prompt_tokens
        self._response_tokens += usage.completion_tokens
        self._max_context = max(self._max_context, usage.prompt_tokens)
        self._sent = [*kept, *_snapshot(history[len(kept) :]), _snapshot(reply)]
        self._last_messages = [*history, reply]
        self.finish_reasons.append(result.finish_reason)
        return result

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
            loggable(self.request.rollout_id),
            turn,
            index,
        )
        self.log_event("append_only_violation", **violation)
        return []

    # -- tools, events, results --------------------------------------------------------------

    def record_tool_call(self, latency_ms: float = 0.0) -> None:
        """Count one tool call and add its latency (``tools.execute_tool_calls`` does this)."""
        self._num_tool_calls += 1
        self._tool_latency_ms += max(0.0, float(latency_ms))
        if not self._tool_batches:  # alone, one call's latency is also wall time
            self._tool_wall_ms += max(0.0, float(latency_ms))
        if self._observer is not None:
            self._observer.tool(max(0.0, float(latency_ms)) / 1000)

    @contextlib.contextmanager
    def _tool_batch(self) -> Iterator[None]:
        """Time concurrent tool calls as the wall time they took together: four 10 ms calls run
        at once are 10 ms of the rollout's time, not 40 (``tool_latency_ms`` keeps the sum)."""
        self._tool_batches += 1
        started = time.perf_counter()
        try:
            yield
        finally:
            self._tool_batches -= 1
            if not self._tool_batches:
                self._tool_wall_ms += (time.perf_counter() - started) * 1000

    def log_event(self, event_type: str, **data: Any) -> None:
        """Append ``{"event": event_type, "rollout_id": ..., **data}`` to the debug trace, if
        any (a no-op otherwise; see ``debug_enabled``)."""
        if self._trace is not None:
            self._trace({"event": event_type, "rollout_id": self.request.rollout_id, **data})

    def complete(
        self,
        final_messages: Sequence[Any],
        finish_reason: str | None = None,
        reward: float | None = None,
    ) -> RolloutResult:
        """End the rollout successfully with its final conversation and optional reward.

        Without ``finish_reason`` it is ``"stop"``, or ``"length"`` when the last reply was cut
        by ``max_tokens``: a truncated answer must not pass for a finished one.
        """
        self._finished = time.perf_counter()
        if finish_reason is None:
            cut = bool(self.finish_reasons) and self.finish_reasons[-1] == "length"
            finish_reason = "length" if cut else "stop"
        return RolloutResult(
            status=RolloutStatus.COMPLETED,
            final_messages=[_as_message(m) for m in final_messages],
            finish_reason=finish_reason,
            metrics=self.metrics,
            reward=reward,
        )

    def error(
        self, error_message: str, final_messages: Sequence[Any] | None = None
    ) -> RolloutResult:
        """End the rollout as failed; the conversation so far is kept unless given."""
        self._finished = time.perf_counter()
        final = self._last_messages if final_messages is None else final_messages
        return RolloutResult(
            status=RolloutStatus.ERROR,
            final_messages=[_as_message(m) for m in final],
            finish_reason="error",
            error_message=error_message,
            metrics=self.metrics,
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
        if self._num_tool_calls:
            extra["tool_wall_ms"] = round(self._tool_wall_ms, 3)
        total = 0.0 if self._started is None else round((end - self._started) * 1000, 3)
        llm = self._client_metrics() or _LLMView(self).get_metrics()
        return RolloutMetrics(
            total_latency_ms=total,
            llm_latency_ms=llm.llm_latency_ms,
            tool_latency_ms=round(self._tool_latency_ms, 3),
            num_llm_calls=llm.num_llm_calls,
            num_tool_calls=self._num_tool_calls,
            prompt_tokens=llm.prompt_tokens,
            response_tokens=llm.response_tokens,
            max_context_tokens=self._max_context,
            **extra,
        )

    def _build_metrics(self) -> RolloutMetrics:
        """v1's name for :attr:`metrics`."""
        return self.metrics

    def _client_metrics(self) -> RolloutMetrics | None:
        """The LLM side as a v1 client reports it (``get_metrics()``), when it does."""
        get_metrics = getattr(self._client, "get_metrics", None)
        if self._client is None or not callable(get_metrics):
            return None
        reported = get_metrics()
        return reported if isinstance(reported, RolloutMetrics) else None
