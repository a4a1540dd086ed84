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
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from pydantic import BaseModel

from . import telemetry
from .append_only import first_divergence
from .endpoint.door import OpenAIDoor
from .protocol import (
    EXTENSION_FIELD,
    CompletionsRequest,
    CompletionsResponse,
    Message,
    OpenAIFunctionToolSchema,
    RolloutMetrics,
    RolloutRequest,
    RolloutStatus,
)
from .redaction import loggable
from .results import CompletionsResult, RolloutResult, reply_message, result_extras

if TYPE_CHECKING:
    from .endpoint.tool_history import ObservedCall

__all__ = [
    "ChatBackend",
    "RolloutAgentLoop",
    "RolloutContext",
    "TurnObserver",
    "close_endpoint",
    "declared_tool",
    "record_tool_cut",
    "tool_batch",
    "tool_cut_since",
]

logger = logging.getLogger("osmosis_rollout.agent")

#: Keys an agent may not send per call: TrainGate knows the tools from the init response.
_NEVER_SENT = frozenset({"tools", "tool_choice", "messages", "rollout_id"})


class TurnObserver(Protocol):
    """Told about each LLM turn and tool call as it ends (the server's Prometheus metrics)."""

    def turn(self, latency_s: float, prompt_tokens: int, completion_tokens: int) -> None: ...

    def tool(self, latency_s: float) -> None: ...


class ChatBackend(Protocol):
    """What a context needs to run one LLM turn; ``client.RolloutChannel`` implements it.

    Name the ``request_id`` parameter so: ``compat`` tells a backend from a legacy-style client
    (``chat_completions(messages, **kw)``) by it."""

    async def chat_completions(
        self, request: CompletionsRequest, *, request_id: str
    ) -> CompletionsResponse: ...


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

    Optionally define ``async def grade(self, ctx, result) -> float``, the grader phase: once
    ``run()`` completed, its value is the reward (``grading.py``; docs/protocol-v2.md, section
    4). Without it, the reward ``run()`` returned is the grade.
    """

    name: ClassVar[str]
    #: What ``run`` is handed (``run_rollout`` builds it). A subclass of ``RolloutContext`` can
    #: add to it: ``compat.RolloutAgentLoop`` gives legacy agents the legacy context.
    context_class: ClassVar[type[RolloutContext]]

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


# --------------------------------------------------------------------------------------------
# The context
# --------------------------------------------------------------------------------------------


def _as_message(item: Any) -> Message:
    """A message as sent to TrainGate: the agent's dict as it is, nulls included (v1 and the
    official v2 SDK both send it so, and chat templates render ``"content": null`` and an
    absent ``content`` differently: docs/protocol.md, "Messages"); a model is dumped without
    its unset defaults' nulls, since no agent wrote those."""
    if isinstance(item, dict):
        return item
    if isinstance(item, BaseModel):
        return item.model_dump(mode="json", exclude_none=True)
    raise TypeError(f"messages must be dicts (OpenAI chat messages), got {type(item).__name__}")


# --------------------------------------------------------------------------------------------
# What a protocol v2 chat call carries of the agent's tools (docs/protocol-v2.md)
# --------------------------------------------------------------------------------------------
# v2 declares no tools at init: they travel with every chat call, and so does the agent's
# ``tool_choice`` when it gives one; ``RolloutContext.chat`` adds them when its backend
# ``sends_tools`` (``chat_v2.V2ChatChannel``). The JSON form of a tool list is made once per
# shared (checked, cached) list, not once per call: a v2 rollout must not cost much more than a
# v1 one (docs/benchmarks.md, section 19).

#: JSON tool lists by the shared list they come from; each entry holds its list, so its id
#: cannot be reused while it is here.
_DUMPED: dict[int, tuple[Sequence[OpenAIFunctionToolSchema], list[dict[str, Any]]]] = {}
_MAX_LISTS = 256


def _add_tools(
    body: dict[str, Any],
    params: dict[str, Any],
    shared: Sequence[OpenAIFunctionToolSchema],
    own: Sequence[OpenAIFunctionToolSchema] | None,
) -> None:
    """Put the tools (this call's own when the agent passed ``tools=`` to ``ctx.chat``, as
    the per-rollout endpoint does with each call's; else ``own``, the context's copies once
    the agent touched them, else ``shared``) and the agent's ``tool_choice`` into a chat body;
    no ``tools`` key for none."""
    per_call = params.get("tools")
    if per_call is not None:
        tools = [_as_tool(tool) for tool in per_call]
    else:
        tools = _dump(own) if own is not None else _dumped(shared)
    if tools:
        body["tools"] = tools
    if params.get("tool_choice") is not None:
        body["tool_choice"] = params["tool_choice"]


def _as_tool(tool: Any) -> Any:
    """A per-call tool as sent: a dict as it is, a model as its JSON."""
    if isinstance(tool, BaseModel):
        return tool.model_dump(mode="json", exclude_none=True)
    return tool


def _dump(tools: Sequence[OpenAIFunctionToolSchema]) -> list[dict[str, Any]]:
    return [tool.model_dump(mode="json", exclude_none=True) for tool in tools]


def _dumped(shared: Sequence[OpenAIFunctionToolSchema]) -> list[dict[str, Any]]:
    found = _DUMPED.get(id(shared))
    if found is None or found[0] is not shared:
        if len(_DUMPED) >= _MAX_LISTS:
            _DUMPED.clear()
        found = _DUMPED[id(shared)] = (shared, _dump(shared))
    return found[1]


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


class RolloutContext:
    """One rollout's state, handed to ``run()``: request, tools, LLM access and metrics.

    Agents written for the ``openai`` client reach the same turns through
    ``openai_client()`` or ``openai_base_url``/``openai_api_key`` (the rollout's
    ``endpoint.door.OpenAIDoor``, made on first use).

    ``backend`` runs the LLM turns (``client.RolloutChannel`` when served); ``trace`` receives
    this rollout's debug events and ``observer`` each turn's and tool call's cost.
    """

    def __init__(
        self,
        request: RolloutRequest,
        tools: Sequence[OpenAIFunctionToolSchema],
        backend: ChatBackend,
        *,
        trace: Callable[[dict[str, Any]], None] | None = None,
        observer: TurnObserver | None = None,
    ) -> None:
        self.request = request
        self._shared_tools = tools
        self._tools: list[OpenAIFunctionToolSchema] | None = None
        self._backend = backend
        self._trace = trace
        self._observer = observer
        self._started: float | None = time.perf_counter()
        self._finished: float | None = None
        self._llm_ms = 0.0
        self._tool_latency_ms = 0.0
        self._tool_wall_ms = 0.0
        self._tool_batches = 0  # > 0 while a Toolbox batch runs: its wall time is counted once
        # The longest-running Toolbox call a cancellation cut, as (name, seconds run, cut at).
        self._tool_cut: tuple[str, float, float] | None = None
        self._llm_calls = 0
        self._num_tool_calls = 0
        self._tool_counts: dict[str, list[int]] = {}  # name: [calls, errors, timeouts]
        # name: the errors among them that were the agent's schema, not the model (``"schema"``)
        self._tool_schema_errors: dict[str, int] = {}
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

    @property
    def tools(self) -> list[OpenAIFunctionToolSchema]:
        """This rollout's tools: its own copies, made on first read, because the checked tool
        models are shared by every rollout whose ``get_tools`` returned the same list."""
        if self._tools is None:
            self._tools = copy.deepcopy(list(self._shared_tools))
        return self._tools

    @tools.setter
    def tools(self, value: list[OpenAIFunctionToolSchema]) -> None:
        self._tools = value

    # -- LLM turns ---------------------------------------------------------------------------

    @property
    def llm(self) -> Any:
        """The backend this context's turns go through (its ``client`` and ``server_url`` when
        served); run turns with :meth:`chat`, which measures and checks them."""
        return self._backend

    @property
    def debug_enabled(self) -> bool:
        """True when this rollout's events are written to a debug trace."""
        return self._trace is not None

    def _call_params(self, params: dict[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = {**self.request.completion_params}
        body.update({k: v for k, v in params.items() if k not in _NEVER_SENT})
        extensions = body.pop(EXTENSION_FIELD, None)
        if isinstance(extensions, dict):  # sent as top-level fields, never over a named one
            for key, value in extensions.items():
                body.setdefault(key, value)
        for key in _NEVER_SENT:
            body.pop(key, None)
        if getattr(self._backend, "sends_tools", False):  # protocol v2: see _add_tools
            _add_tools(body, params, self._shared_tools, self._tools)
        return body

    async def chat(self, messages: Sequence[Any], **params: Any) -> CompletionsResult:
        """Run one LLM turn on the full history ``messages``.

        ``request.completion_params`` are the defaults; ``params`` override them per call.
        """
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
        self._tools_at_turn = self._num_tool_calls
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
            "params": {k: v for k, v in params.items() if k != "tools"},  # v2: every call
            "latency_ms": round((time.perf_counter() - started) * 1000, 3),
        }
        if response is not None:
            choice = response.choices[0]
            event["reply"] = reply_message(choice.message)  # as the agent appends it
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

    def record_tool_call(
        self, latency_ms: float = 0.0, *, tool: str | None = None, error: str | None = None
    ) -> None:
        """Count one tool call and add its latency (``tools.execute_tool_calls`` does this);
        ``tool`` and how it failed (``error``: ``"raised"``, ``"timeout"``, or ``"schema"``: its
        function refused arguments that the schema ``get_tools`` declared allows) go to the
        metrics' ``tool_counts`` (and ``tool_schema_errors``), so a failing tool shows in
        ``osmosis test``, not only to the model."""
        self._num_tool_calls += 1
        if tool is not None:
            counts = self._tool_counts.setdefault(tool, [0, 0, 0])
            counts[0] += 1
            if error is not None:
                counts[1] += 1
                counts[2] += error == "timeout"
                if error == "schema":
                    self._tool_schema_errors[tool] = self._tool_schema_errors.get(tool, 0) + 1
        self._tool_latency_ms += max(0.0, float(latency_ms))
        if not self._tool_batches:  # alone, one call's latency is also wall time
            self._tool_wall_ms += max(0.0, float(latency_ms))
        if self._observer is not None:
            self._observer.tool(max(0.0, float(latency_ms)) / 1000)

    # -- the OpenAI-compatible endpoint (endpoint/door.py) ------------------------------------

    #: The rollout's endpoint door, made on first use (most agents never ask for it).
    _door: OpenAIDoor | None = None
    #: ``num_tool_calls`` when the last turn ended, and how many of them were seen in a
    #: harness's history (``observe_tool_calls``); class defaults, so most rollouts never set them.
    _tools_at_turn = 0
    _tools_from_history = 0

    def _openai_door(self) -> OpenAIDoor:
        if self._door is None:
            self._door = OpenAIDoor(self, observe_tools=partial(observe_tool_calls, self))
        return self._door

    @property
    def openai_base_url(self) -> str:
        """The rollout's OpenAI base URL on 127.0.0.1 (``.../v1``), for a harness in another
        process: ``OPENAI_BASE_URL``. It answers only while the rollout runs."""
        return self._openai_door().grant().base_url

    @property
    def openai_api_key(self) -> str:
        """The bearer token of :attr:`openai_base_url` (``OPENAI_API_KEY``): this rollout's
        only, void once it ends. Not TrainGate's key."""
        return self._openai_door().grant().token

    def openai_client(self, **options: Any) -> Any:
        """An ``openai.AsyncOpenAI`` whose every call is one turn of this rollout, in process
        (no socket); needs ``pip install 'osmosis-rollout[openai]'``. Without ``options`` the
        same client each time (building one costs about a millisecond)."""
        return self._openai_door().client(**options)

    @property
    def ended(self) -> bool:
        """Whether the rollout was ended by ``complete`` or ``error``."""
        return self._finished is not None

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
        *,
        reward_components: Mapping[str, float] | None = None,
        extra_fields: Mapping[str, Any] | None = None,
    ) -> RolloutResult:
        """End the rollout successfully with its final conversation and optional reward, its
        named parts (``reward_components``) and ``extra_fields`` for the trainer's records.

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
            extra_fields=result_extras(extra_fields, reward_components),
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
        if self._door is not None:
            self._door.add_findings(extra)
        if self._tool_counts:
            extra["tool_counts"] = {name: list(c) for name, c in self._tool_counts.items()}
        if self._tool_schema_errors:
            extra["tool_schema_errors"] = dict(self._tool_schema_errors)
        if self._tools_from_history:
            extra["tool_calls_from_history"] = self._tools_from_history
        total = 0.0 if self._started is None else round((end - self._started) * 1000, 3)
        llm = self._llm_metrics()
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

    def _llm_metrics(self) -> RolloutMetrics:
        """The LLM side of :attr:`metrics`: latency, call count and tokens so far."""
        return RolloutMetrics(
            llm_latency_ms=round(self._llm_ms, 3),
            num_llm_calls=self._llm_calls,
            prompt_tokens=self._prompt_tokens,
            response_tokens=self._response_tokens,
        )


RolloutAgentLoop.context_class = RolloutContext


# --------------------------------------------------------------------------------------------
# What the toolkit (the rollout runner, the toolbox) does to a context, beside the agent's API
# --------------------------------------------------------------------------------------------


def close_endpoint(ctx: RolloutContext) -> None:
    """The rollout ended: its endpoint refuses further calls, its loopback token is void."""
    if ctx._door is not None:
        ctx._door.close()


def declared_tool(ctx: RolloutContext, name: str) -> OpenAIFunctionToolSchema | None:
    """The tool named ``name`` as this rollout declared it (``get_tools``, or what the agent set
    ``ctx.tools`` to), read without the copy ``ctx.tools`` makes; None when none is."""
    own = getattr(ctx, "_tools", None)  # a context of another kind (a test's stub): none
    tools = own if own is not None else getattr(ctx, "_shared_tools", ())
    for tool in tools or ():
        if isinstance(tool, OpenAIFunctionToolSchema) and tool.function.name == name:
            return tool
    return None


@contextlib.contextmanager
def tool_batch(ctx: RolloutContext) -> Iterator[None]:
    """Time concurrent tool calls as the wall time they took together: four 10 ms calls run
    at once are 10 ms of the rollout's time, not 40 (``tool_latency_ms`` keeps the sum)."""
    ctx._tool_batches += 1
    started = time.perf_counter()
    try:
        yield
    finally:
        ctx._tool_batches -= 1
        if not ctx._tool_batches:
            ctx._tool_wall_ms += (time.perf_counter() - started) * 1000


def observe_tool_calls(ctx: RolloutContext, calls: Sequence[ObservedCall]) -> None:
    """Count tool calls a harness ran itself, seen answered in the history of its next
    endpoint call (``endpoint/tool_history.py``), as a ``Toolbox`` would have recorded them:
    calls, errors and latency per tool, the calls answered together counted once in the wall
    time. Skipped when the agent recorded tool calls itself since the last turn: those
    results are already counted."""
    if ctx._num_tool_calls > ctx._tools_at_turn:
        return
    ctx._tool_batches += 1
    try:
        for call in calls:
            ctx.record_tool_call(
                call.latency_ms, tool=call.tool, error="raised" if call.failed else None
            )
    finally:
        ctx._tool_batches -= 1
    if not ctx._tool_batches:
        ctx._tool_wall_ms += max(call.latency_ms for call in calls)
    ctx._tools_from_history += len(calls)
    ctx._tools_at_turn = ctx._num_tool_calls


def record_tool_cut(ctx: RolloutContext, name: str, started: float) -> None:
    """Note that a cancellation (the rollout's deadline, say) stopped tool ``name``, started
    at ``started`` (``perf_counter``); of several cut together, the longest-running is kept.
    Only the cancelled path pays: a call that returns records nothing."""
    now = time.perf_counter()
    ran = now - started
    cut = ctx._tool_cut
    if cut is None or cut[2] < now - 0.05 or ran > cut[1]:
        ctx._tool_cut = (name, ran, now)


def tool_cut_since(ctx: RolloutContext, moment: float) -> tuple[str, float] | None:
    """``(name, seconds)`` of the tool a cancellation stopped at or after ``moment``."""
    cut = ctx._tool_cut
    if cut is None or cut[2] < moment:
        return None
    return cut[0], cut[1]
