"""``SteppingBackend``: the LLM backend that pauses each turn until the REPL's user decides.

It wraps the backend the mock TrainGate would have used. For each chat turn it gets the real
reply, hands a :class:`Turn` to the REPL (through ``listener``) and, unless the rollout runs
free (``continue``), holds the reply back until the REPL resolves ``Turn.decision``, possibly
with an edited reply. The agent never notices: it simply waits for TrainGate to answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import LLMBackendError
from ..protocol import CompletionsRequest, CompletionsResponse, Message, RolloutResponse
from ..testing.records import LLMBackend, RolloutRecord

__all__ = ["SteppingBackend", "Turn", "TurnTimes", "Waiting"]


@dataclass(frozen=True)
class Waiting:
    """A turn was sent to the model and has no reply yet (real models can take minutes)."""

    rollout_id: str
    number: int
    since: float  # time.monotonic() when the request went out


@dataclass
class Turn:
    """One LLM turn as the REPL shows it; ``decision`` is set when the rollout waits for it."""

    rollout_id: str
    number: int
    request: CompletionsRequest
    record: RolloutRecord
    new_messages: list[Message]
    reply: CompletionsResponse
    model_ms: float
    decision: asyncio.Future[CompletionsResponse] | None = None
    edited: bool = False

    @property
    def waiting(self) -> bool:
        """Whether the agent is still waiting for this turn's reply."""
        return self.decision is not None and not self.decision.done()

    def release(self) -> None:
        """Send the (possibly edited) reply to the agent."""
        if self.waiting:
            assert self.decision is not None
            self.decision.set_result(self.reply)


@dataclass
class TurnTimes:
    """Where one rollout's LLM time went: the model itself, and the user at the prompt."""

    model_ms: float = 0.0
    paused_ms: float = 0.0
    paused_since: float | None = field(default=None, repr=False)

    def paused_now_ms(self) -> float:
        """Paused time so far, including a pause still in progress."""
        extra = 0.0
        if self.paused_since is not None:
            extra = (time.perf_counter() - self.paused_since) * 1000
        return self.paused_ms + extra


class SteppingBackend:
    """An :class:`LLMBackend` that reports each turn and waits for a decision on the active one.

    Only the rollout named ``active`` pauses; a rollout in ``run_free`` or any other rollout
    (say, one abandoned on a remote server) gets its replies at once.
    """

    def __init__(
        self,
        inner: LLMBackend,
        listener: Callable[[Turn], None],
        on_wait: Callable[[Waiting], None] | None = None,
    ) -> None:
        self.inner = inner
        self.listener = listener
        self.on_wait = on_wait
        self.active: str | None = None
        self.times: dict[str, TurnTimes] = {}
        self._free: set[str] = set()
        self._abandoned: set[str] = set()
        self._waiting: dict[str, Turn] = {}

    def run_free(self, rollout_id: str) -> None:
        """Stop pausing this rollout (``continue``)."""
        self._free.add(rollout_id)

    def abandon(self, rollout_id: str) -> None:
        """Fail this rollout's pending and future turns: the way to stop a rollout that runs on
        a remote server, which the REPL cannot cancel directly."""
        self._abandoned.add(rollout_id)
        turn = self._waiting.pop(rollout_id, None)
        if turn is not None and turn.waiting:
            assert turn.decision is not None
            turn.decision.set_exception(_abandoned_error())

    def rollout_completed(self, record: RolloutRecord, response: RolloutResponse) -> None:
        """Hand the completion on to a wrapped backend that checks results (a replay)."""
        observe = getattr(self.inner, "rollout_completed", None)
        if observe is not None:
            observe(record, response)

    async def complete(
        self, request: CompletionsRequest, record: RolloutRecord
    ) -> CompletionsResponse:
        """Get the wrapped backend's reply, report it, and wait for the user if stepping."""
        rid = record.rollout_id
        if rid in self._abandoned:
            raise _abandoned_error()
        times = self.times.setdefault(rid, TurnTimes())
        started = time.perf_counter()
        if self.on_wait is not None:
            self.on_wait(Waiting(rid, len(record.replies) + 1, time.monotonic()))
        reply = await self.inner.complete(request, record)
        model_ms = (time.perf_counter() - started) * 1000
        times.model_ms += model_ms
        pause = rid == self.active and rid not in self._free
        turn = Turn(
            rollout_id=rid,
            number=len(record.replies) + 1,
            request=request,
            record=record,
            new_messages=_new_messages(request, record),
            reply=reply,
            model_ms=model_ms,
            decision=asyncio.get_running_loop().create_future() if pause else None,
        )
        self.listener(turn)
        if turn.decision is None:
            return reply
        self._waiting[rid] = turn
        times.paused_since = time.perf_counter()
        try:
            return await turn.decision
        finally:
            times.paused_ms = times.paused_now_ms()
            times.paused_since = None
            self._waiting.pop(rid, None)


def _new_messages(request: CompletionsRequest, record: RolloutRecord) -> list[Message]:
    """The messages added since the previous reply (tool results), or the whole first prompt.

    The mock TrainGate appends ``request`` to ``record.chats`` before asking the backend.
    """
    if len(record.chats) < 2:
        return list(request.messages)
    previous = record.chats[-2]
    return list(request.messages[len(previous.messages) + 1 :])


def _abandoned_error() -> LLMBackendError:
    return LLMBackendError(
        "the rollout was cancelled at the REPL (Ctrl-C); TrainGate refuses its further turns",
        kind="http",
        status_code=499,
    )
