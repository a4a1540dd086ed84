"""``RolloutAgentLoop`` and ``RolloutContext`` with the legacy SDK's contract.

A legacy agent subclasses this module's ``RolloutAgentLoop``, so ``run_rollout`` hands it this
module's ``RolloutContext``: the core context plus what legacy code reaches for, namely ``ctx.llm``
as a legacy client (``chat_completions(messages, **kw)``, ``get_metrics()``), ``chat_stream``,
``_build_metrics()``, and a constructor that takes a legacy-style client (a fake LLM in an agent's
unit test) and the legacy underscored keywords. The core (``agent.py``) knows none of this.
"""

from __future__ import annotations

import copy
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .. import agent as core
from ..agent import ChatBackend, TurnObserver
from ..protocol import (
    CompletionsRequest,
    Message,
    OpenAIFunctionToolSchema,
    RolloutMetrics,
    RolloutRequest,
)
from ..results import CompletionsResult
from . import schemas

__all__ = ["LLMClientProtocol", "RolloutAgentLoop", "RolloutContext", "known_params"]

logger = logging.getLogger("osmosis_rollout.compat")

#: The keywords a chat turn sends to TrainGate (the legacy SDK dropped others: ``request_timeout``).
_SENT = frozenset(CompletionsRequest.model_fields) - {"rollout_id", "messages"}
_DROPPED: set[str] = set()  # each one warned about once per process


def known_params(
    params: dict[str, Any], where: str, trainer: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """``params`` without the keywords the legacy SDK dropped (not a field of TrainGate's chat
    request), with one warning per keyword naming it. Keys of the ``trainer``'s
    ``completion_params`` are kept: TrainGate asked for them (``**ctx.request.completion_params``
    passes them)."""
    unknown = [key for key in params if key not in _SENT and key not in (trainer or {})]
    for key in unknown:
        if key not in _DROPPED:
            _DROPPED.add(key)
            logger.warning(
                "%s: keyword %r is not sent to TrainGate (not a chat request field; the "
                "original SDK dropped it too); sampling keys: %s",
                where,
                key,
                ", ".join(sorted(_SENT)),
            )
    return {key: value for key, value in params.items() if key not in unknown}


@runtime_checkable
class LLMClientProtocol(Protocol):
    """The legacy LLM client contract, what ``ctx.llm`` offers and what fake LLMs in agents' unit
    tests implement: ``await chat_completions(messages, **params)`` and ``get_metrics()``."""

    async def chat_completions(self, messages: list[Message], **kwargs: Any) -> Any: ...

    def get_metrics(self) -> RolloutMetrics: ...


def _is_chat_backend(llm: object) -> bool:
    """True for our backends (``chat_completions(request, *, request_id)``); False for a legacy
    client or fake (``chat_completions(messages, **kw)``), which the context calls the legacy way.

    Asked once per legacy context (~14 µs); the per-class memo it had was dropped as not worth its
    lines (3% of a one-turn rollout's server CPU, and only for legacy agents)."""
    try:
        parameters = inspect.signature(llm.chat_completions).parameters  # type: ignore[attr-defined]
    except (AttributeError, TypeError, ValueError):
        return False
    return "request_id" in parameters


class RolloutContext(core.RolloutContext):
    """The legacy context: ``llm`` is our backend or a legacy-style client
    (``chat_completions(messages, **kw)`` and ``get_metrics()``); with a client, ``chat`` calls it
    and returns its result unchanged, as the legacy SDK did. The underscored keywords are the legacy
    SDK's: a monotonic start time, tool counters to start from, and a debug directory for this
    rollout's events (``<dir>/<rollout_id>.jsonl``).
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
        if trace is None and _debug_dir is not None:
            from ..tracing import file_sink

            trace = file_sink(_debug_dir, request.rollout_id, secrets=[request.api_key_value])
        backend = _is_chat_backend(llm)
        # The core wants a backend; a legacy client stands in for it but is only ever called by
        # ``_chat_legacy`` (``chat`` and ``chat_stream`` route to it).
        super().__init__(request, tools, llm, trace=trace, observer=observer)  # type: ignore[arg-type]
        self._client: Any = None if backend else llm
        if _start_time is not None:  # a time.monotonic() reading; 0 means "not measured"
            since = time.monotonic() - _start_time
            self._started = time.perf_counter() - since if _start_time > 0 else None
        self._tool_latency_ms = self._tool_wall_ms = float(_tool_latency_ms)
        self._num_tool_calls = int(_num_tool_calls)

    @property
    def tools(self) -> list[OpenAIFunctionToolSchema]:
        """The rollout's tools (copies, made on first read) as the legacy models: ``parameters``
        also read as attributes (``tool.function.parameters.properties``)."""
        if self._tools is None:
            self._tools = [_as_legacy_tool(tool) for tool in self._shared_tools]
        return self._tools

    @tools.setter
    def tools(self, value: list[OpenAIFunctionToolSchema]) -> None:
        self._tools = value

    @property
    def llm(self) -> Any:
        """The LLM with the legacy client contract:
        ``await ctx.llm.chat_completions(messages, **kw)`` (a ``ctx.chat`` turn) and
        ``ctx.llm.get_metrics()``; a legacy client given to the constructor is returned as it is."""
        return self._client if self._client is not None else _LLMView(self)

    async def chat(self, messages: Sequence[Any], **params: Any) -> CompletionsResult:
        """One LLM turn (see the core's ``chat``); through a legacy client, its result unchanged."""
        if self._client is None:
            known = known_params(params, "ctx.chat", self.request.completion_params)
            return await super().chat(messages, **known)
        return await self._chat_legacy(messages, params, self._client.chat_completions)  # type: ignore[no-any-return]

    async def chat_stream(self, messages: Sequence[Any], **params: Any) -> CompletionsResult:
        """The legacy streaming turn. The protocol has no streaming, so it is :meth:`chat`; a
        legacy-style client that has ``chat_completions_stream`` is called through that, as the
        legacy SDK did, with the same bookkeeping as any turn (counted, timed, its ``finish_reason``
        kept)."""
        stream = getattr(self._client, "chat_completions_stream", None)
        if self._client is None or not callable(stream):
            return await self.chat(messages, **params)
        return await self._chat_legacy(messages, params, stream)  # type: ignore[no-any-return]

    async def _chat_legacy(
        self, messages: Sequence[Any], params: dict[str, Any], call: Callable[..., Awaitable[Any]]
    ) -> Any:
        """A turn through a legacy-style client, called the legacy way; its result unchanged."""
        self._turns_started += 1
        self._last_messages = [core._as_message(m) for m in messages]
        started = time.perf_counter()
        try:
            result = await call(messages, **self._call_params(params))
        finally:
            self._llm_ms += (time.perf_counter() - started) * 1000
            self._llm_calls += 1
        reply = getattr(result, "message", None)
        if isinstance(reply, dict):
            self._last_messages = [*self._last_messages, core._as_message(reply)]
        reason = getattr(result, "finish_reason", None)
        self.finish_reasons.append(reason if isinstance(reason, str) else None)
        return result

    def _llm_metrics(self) -> RolloutMetrics:
        """The LLM side as a legacy client reports it (``get_metrics()``), when it does."""
        get_metrics = getattr(self._client, "get_metrics", None)
        if self._client is not None and callable(get_metrics):
            reported = get_metrics()
            if isinstance(reported, RolloutMetrics):
                return reported
        return super()._llm_metrics()

    def _build_metrics(self) -> RolloutMetrics:
        """The legacy name for :attr:`metrics`."""
        return self.metrics


def _as_legacy_tool(tool: Any) -> Any:
    if isinstance(tool, OpenAIFunctionToolSchema):
        return schemas.OpenAIFunctionToolSchema.model_validate(tool.model_dump(exclude_none=True))
    return copy.deepcopy(tool)


class _LLMView:
    """``ctx.llm`` over our backend, with the legacy client contract: each call is a ``ctx.chat``
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
        """The rollout this client serves (the legacy attribute)."""
        return self._ctx.request.rollout_id

    async def chat_completions(self, messages: Sequence[Any], **kwargs: Any) -> CompletionsResult:
        """One LLM turn; the same as ``await ctx.chat(messages, **kwargs)``."""
        return await self._ctx.chat(messages, **kwargs)

    def get_metrics(self) -> RolloutMetrics:
        """LLM latency, call count and tokens so far (the other fields are 0)."""
        return core.RolloutContext._llm_metrics(self._ctx)


class RolloutAgentLoop(core.RolloutAgentLoop):
    """The legacy base class: the core's, whose ``run`` gets the legacy :class:`RolloutContext`."""

    context_class = RolloutContext
