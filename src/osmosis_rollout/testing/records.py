"""What the mock TrainGate records: each rollout's :class:`RolloutRecord` (on v2 with its
:class:`V2Exchange`), the findings it reports (:class:`Finding`; their codes:
:mod:`osmosis_rollout.findings`), :class:`LLMBackend`, the interface its backends answer, and,
when a trace of its side is kept, each call that crossed the wire with its time (:class:`WireLog`).

Kept apart from :mod:`.traingate` (the Starlette app) and the wires (:mod:`.wire`: the
handlers) so the backends, the runner and the REPL can use them without the app.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio

from ..errors import LLMBackendError
from ..protocol import (
    CompletionCallback,
    CompletionsRequest,
    CompletionsResponse,
    GraderCallback,
    OpenAIFunctionToolSchema,
    RolloutRequest,
    RolloutResponse,
)

__all__ = [
    "Finding",
    "LLMBackend",
    "RolloutRecord",
    "V2Exchange",
    "WireCall",
    "WireLog",
    "completion_from_message",
    "estimate_tokens",
]


@dataclass(frozen=True)
class Finding:
    """One protocol violation the mock TrainGate observed, with a stable ``code`` (ours are in
    :data:`osmosis_rollout.findings.FINDINGS`; a custom backend may add its own)."""

    code: str
    message: str
    rollout_id: str | None = None
    #: The LLM turn it was seen at (the number of chat calls so far), None before any.
    turn: int | None = None
    #: Structured facts for results files (e.g. a ``replay_diverged`` finding's field and diff).
    details: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form for results files."""
        data: dict[str, Any] = {
            "code": self.code,
            "message": self.message,
            "rollout_id": self.rollout_id,
            "turn": self.turn,
        }
        if self.details is not None:
            data["details"] = self.details
        return data


@dataclass
class V2Exchange:
    """A v2 rollout as its controller sees it: the callback key, the callbacks, the answers."""

    callback_key: str | None
    #: The tools the agent declares, where known (in process: its ``get_tools``): a chat call
    #: without ``tools`` is then a ``tools_not_sent`` finding.
    declared: list[OpenAIFunctionToolSchema] | None = None
    completions: list[CompletionCallback] = field(default_factory=list)
    graders: list[GraderCallback] = field(default_factory=list)
    terminal: anyio.Event = field(default_factory=anyio.Event)
    #: The answers read after the terminal event or at the deadline: (HTTP status, body).
    status: tuple[int, Any] | None = None
    cancel: tuple[int, Any] | None = None
    #: Inits answered 429 before the one that was accepted.
    throttled: int = 0
    #: Set once the controller gave up on the rollout (refused, or past its deadline): later
    #: callbacks are acknowledged quietly (spec 11.4).
    closed: bool = False


@dataclass
class RolloutRecord:
    """Everything the mock saw for one rollout."""

    rollout_id: str
    api_key: str | None = None
    #: The init this mock sent (None for a rollout registered with :meth:`MockTrainGate.expect`).
    request: RolloutRequest | None = None
    tools: list[OpenAIFunctionToolSchema] = field(default_factory=list)
    #: Whether ``tools`` is what the server declared (from an init or ``expect(tools=...)``);
    #: only then are undeclared tool calls reported.
    tools_known: bool = False
    #: ``tools`` as the init's JSON had them, when they came from an init (a replay compares
    #: them with its recording without dumping every tool again).
    tools_wire: list[Any] | None = None
    chats: list[CompletionsRequest] = field(default_factory=list)
    replies: list[CompletionsResponse] = field(default_factory=list)
    #: The backend's time for each of ``replies`` (ms): the model time of a row as the mock
    #: served it, whatever the server reports (a server we did not write may report none).
    served_ms: list[float] = field(default_factory=list)
    completions: list[RolloutResponse] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    request_ids: list[str] = field(default_factory=list)
    backend_error: LLMBackendError | None = None
    #: How the served chat template renders tool calls, when the backend learnt it (llama.cpp's
    #: ``/props``): ``text_tool_calls.TAGS``, else None. It decides a text call's advice.
    template_tool_format: str | None = None
    done: anyio.Event = field(default_factory=anyio.Event)
    #: Set once ``tools`` is final: at once for :meth:`MockTrainGate.expect`, and when the init
    #: answer arrived for :meth:`MockTrainGate.init_rollout`. A chat call waits for it, since a
    #: server may start the agent (and its first turn) before its 202 reaches us.
    tools_ready: anyio.Event = field(default_factory=anyio.Event)
    #: What the rollout's wire keeps beyond the chat turns and the result (None on v1; on v2
    #: a :class:`V2Exchange`: its ``completions`` then hold one result built from the
    #: completion and grader callbacks, once both came). A wire keeps its own type here.
    exchange: Any = None

    @property
    def v2(self) -> V2Exchange | None:
        """The v2 exchange, on a protocol v2 rollout (None otherwise)."""
        exchange = self.exchange
        return exchange if isinstance(exchange, V2Exchange) else None

    @property
    def result(self) -> RolloutResponse | None:
        """The first completion callback, if it arrived."""
        return self.completions[0] if self.completions else None

    @property
    def tool_names(self) -> set[str]:
        """Names of the tools the server declared at init."""
        return {t.name for t in self.tools}

    def add(
        self,
        code: str,
        message: str,
        *,
        turn: int | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        """Record a finding for this rollout, at ``turn`` (default: the last chat turn)."""
        turn = turn if turn is not None else len(self.chats) or None
        self.findings.append(Finding(code, message, self.rollout_id, turn, details))


@dataclass(frozen=True)
class WireCall:
    """One call that crossed the wire for a rollout, as the mock TrainGate saw it: ``kind``
    ``"chat"`` (a chat turn the server asked for), ``"callback"`` (a result the server sent) or
    ``"server"`` (a call the mock made: the start, a status, a cancel, a result poll); ``ts``
    the wall-clock time it was answered, ``latency_ms`` how long it took. ``data`` holds the
    models as they were read (not copied: a call costs one small object until it is written)."""

    kind: str
    ts: float
    latency_ms: float
    data: dict[str, Any]


class WireLog:
    """The calls of each rollout, kept only while a trace of the mock's side is wanted
    (``osmosis test --server/--launch --debug-dir``: ``testing.gate_trace``); the wires add to
    it where the gate has one, the trace writer takes a rollout's calls once it ended."""

    def __init__(self) -> None:
        self._calls: dict[str, list[WireCall]] = {}

    def add(self, rollout_id: str, kind: str, started: float, **data: Any) -> None:
        """Record one call of ``rollout_id`` begun at ``started`` (``time.perf_counter()``)."""
        latency = (time.perf_counter() - started) * 1000
        call = WireCall(kind, time.time(), round(latency, 3), data)
        self._calls.setdefault(rollout_id, []).append(call)

    def take(self, rollout_id: str) -> list[WireCall]:
        """The calls of ``rollout_id`` so far, in the order they were answered; forgotten here."""
        return self._calls.pop(rollout_id, [])


class LLMBackend(Protocol):
    """Answers one chat turn for the mock; see ``testing.backends`` and ``testing.openai_backend``
    for the built-in ones.

    A backend may also define ``rollout_completed(record, response)``: the mock calls it with
    each rollout's first completion callback, before the rollout counts as done, so it can add
    findings about the result (the replay backend compares it with the recording).
    """

    async def complete(
        self, request: CompletionsRequest, record: RolloutRecord
    ) -> CompletionsResponse: ...


def completion_from_message(
    request: CompletionsRequest, message: dict[str, Any], *, turn: int = 0
) -> CompletionsResponse:
    """Wrap an assistant message in a full completion with consistent usage numbers."""
    msg = {"role": "assistant", **message}
    prompt_tokens = estimate_tokens(request.messages)
    completion_tokens = max(1, estimate_tokens([msg]))
    reason = "tool_calls" if msg.get("tool_calls") else "stop"
    return CompletionsResponse.model_validate(
        {
            "id": f"mock-{request.rollout_id}-{turn}",
            "created": 0,
            "model": request.model,
            "choices": [{"index": 0, "message": msg, "finish_reason": reason}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
            "token_ids": [(turn * 1000 + i) % 50000 for i in range(completion_tokens)],
            "logprobs": [-0.01 * ((i % 7) + 1) for i in range(completion_tokens)],
            "prompt_token_ids": [i % 50000 for i in range(prompt_tokens)],
        }
    )


def estimate_tokens(messages: list[dict[str, Any]]) -> int:
    """A deterministic token estimate (about four characters a token) for mock usage."""
    text = json.dumps(messages, sort_keys=True, separators=(",", ":"))
    return max(1, len(text) // 4)
