"""One rollout of the REPL: starting it, showing its turns, cancelling it, reporting its end.

The rollout runs as a task beside the prompt loop; the :class:`SteppingBackend` posts each of
its turns on the event queue. :class:`RolloutDriver` owns that side (the harness, the stepper,
the queue) so the prompt loop only decides what to run and what each command does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from rich.markup import escape
from rich.rule import Rule

from ..agent import RolloutContext
from ..errors import OsmosisError
from ..evaluation.runner import RowResult, result_from_outcome
from ..evaluation.server_support import server_property
from ..protocol import Message, OpenAIFunctionToolSchema, RolloutMetrics
from ..testing.harness import Harness, RolloutOutcome
from ..testing.records import RolloutRecord
from ..testing.traingate import name_gate_urls
from .stepper import SteppingBackend, Turn, TurnTimes, Waiting
from .terminal import Terminal
from .views import metrics_table, outcome_view, turn_view

__all__ = ["FOREVER_S", "Active", "Ended", "Finished", "RolloutDriver", "Start"]

#: A paused rollout waits for a human: no deadline should end it behind their back.
FOREVER_S = 7 * 24 * 3600.0
#: How long leaving waits for a cancelled rollout's callback before giving up on it.
_QUIT_WAIT_S = 15.0


@dataclass(frozen=True)
class Start:
    """A rollout to start: its first messages and metadata, and how to name it."""

    messages: list[Message]
    metadata: dict[str, Any]
    label: str
    row: int | None = None
    #: The row's ``mock_replies``, for the mock LLM.
    replies: list[Any] | None = None


@dataclass(frozen=True)
class Ended:
    """Posted on the event queue when a rollout's ``Harness.run`` returns."""

    rollout_id: str


@dataclass
class Active:
    """The rollout being stepped through."""

    rollout_id: str
    label: str
    task: asyncio.Task[RolloutOutcome]
    cancel_requested: bool = False
    #: The cancel asked of a server in another process, while it is under way.
    remote_cancel: asyncio.Future[None] | None = None


@dataclass
class Finished:
    """The last rollout that ended, for ``messages``/``tools``/``metrics`` at the idle prompt."""

    row: RowResult
    tools: list[OpenAIFunctionToolSchema]
    times: TurnTimes = field(default_factory=TurnTimes)
    #: LLM calls that got their reply (the agent also counts a cancelled one, without tokens).
    answered: int | None = None


#: What the prompt loop does at a turn that waits: prompt until the reply is sent on.
OnPause = Callable[[Active, Turn], Awaitable[None]]


class RolloutDriver:
    """Runs one rollout at a time through ``harness``, whose LLM backend is ``stepper``."""

    def __init__(
        self,
        harness: Harness,
        stepper: SteppingBackend,
        events: asyncio.Queue[Turn | Waiting | Ended],
        terminal: Terminal,
        *,
        completion_params: dict[str, Any],
        max_turns: int,
    ) -> None:
        self.harness = harness
        self.stepper = stepper
        self.events = events
        self.terminal = terminal
        self.completion_params = completion_params
        self.max_turns = max_turns
        #: The active rollout's turn that is with the model now, for the "waiting" line.
        self.waiting: Waiting | None = None

    async def run(
        self, start: Start, *, on_pause: OnPause, leaving: Callable[[], bool]
    ) -> Finished | None:
        """Run ``start`` to its end, calling ``on_pause`` at each turn that waits; the finished
        rollout once its outcome is shown, or None when it failed or was given up on.
        ``leaving`` says whether the user is leaving the REPL (then the end is awaited briefly)."""
        tag = f"row{start.row}" if start.row is not None else "msg"
        rid = f"repl-{tag}-{uuid.uuid4().hex[:6]}"
        self.stepper.active = rid
        bind = getattr(self.stepper.inner, "bind_rollout", None)
        if bind is not None:  # the mock's replies: the row's, as a batch run gives them
            bind(rid, str(start.row) if start.row is not None else "msg", start.replies)
        task = asyncio.create_task(
            self.harness.run(
                start.messages,
                rollout_id=rid,
                completion_params=self.completion_params,
                metadata=start.metadata,
                max_turns=self.max_turns,
                timeout_s=FOREVER_S,
            )
        )
        task.add_done_callback(lambda _: self.events.put_nowait(Ended(rid)))
        active = Active(rid, start.label, task)
        self.terminal.show(Rule(f"rollout {rid} | {start.label}", style="bold blue"))
        try:
            await self._drive(active, on_pause, leaving)
        finally:
            self.stepper.active = None
            self.waiting = None
            if not task.done():
                task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            if active.remote_cancel is not None:
                await asyncio.gather(active.remote_cancel, return_exceptions=True)
        return self._report(active, start)

    async def _drive(self, active: Active, on_pause: OnPause, leaving: Callable[[], bool]) -> None:
        """Show each turn of ``active`` and prompt at those that wait, until it ends."""
        while True:
            event = await self._next_event(active, leaving)
            if event is None or (
                isinstance(event, Ended) and event.rollout_id == active.rollout_id
            ):
                return
            if isinstance(event, Ended):
                continue
            if isinstance(event, Waiting):
                if event.rollout_id == active.rollout_id:
                    self.waiting = event
                continue
            if event.rollout_id != active.rollout_id:
                event.release()
                continue
            self.waiting = None
            self.terminal.show(turn_view(event, title=active.label))
            if event.waiting:
                await on_pause(active, event)

    async def _next_event(
        self, active: Active, leaving: Callable[[], bool]
    ) -> Turn | Waiting | Ended | None:
        """The next event, with Ctrl-C watched; None when leaving and the rollout will not end."""
        with self.terminal.watch_interrupt(lambda: self.interrupt(active)):
            if not leaving():
                if self.waiting is None:
                    return await self.events.get()
                return await self.terminal.get_showing_wait(self.events, self.waiting)
            try:
                return await asyncio.wait_for(self.events.get(), _QUIT_WAIT_S)
            except TimeoutError:
                self.terminal.say(
                    f"[yellow]Gave up waiting for rollout {active.rollout_id} to end.[/]"
                )
                return None

    def _report(self, active: Active, start: Start) -> Finished | None:
        task = active.task
        say = self.terminal.say
        if task.cancelled():
            say(
                f"[yellow]Stopped waiting for rollout {active.rollout_id}[/]; a remote server "
                "may still finish it."
            )
            return None
        exc = task.exception()
        if isinstance(exc, OsmosisError):
            message = name_gate_urls(str(exc), self.harness.gate.base_url) or ""
            say(f"[bold red]Error:[/] {escape(message)}")
            return None
        if exc is not None:
            raise exc
        outcome = task.result()
        row = result_from_outcome(start.row or 0, outcome, gate_url=self.harness.gate.base_url)
        # What the server is (no status route, no key), not what this rollout did: said apart.
        server_notes = [
            dataclasses.replace(f, code=code)
            for f in row.findings
            if (code := server_property(f)) is not None
        ]
        row.findings = [f for f in row.findings if server_property(f) is None]
        seen = self.harness.rollout_server is None and _fill_untold_metrics(row, outcome)
        times = self.stepper.times.pop(active.rollout_id, TurnTimes())
        answered = len(outcome.record.replies)
        self.terminal.show(
            outcome_view(
                row,
                paused_ms=times.paused_ms,
                model_ms=times.model_ms,
                answered=answered,
                server_notes=server_notes,
                metrics_title="Metrics, as the mock TrainGate served them" if seen else "Metrics",
            )
        )
        return Finished(row, list(outcome.record.tools), times, answered)

    def run_free(self, active: Active) -> None:
        """Let ``active`` run to its end without pausing at its turns."""
        self.stepper.run_free(active.rollout_id)

    def interrupt(self, active: Active, reason: str = "Ctrl-C at the REPL") -> None:
        """Ctrl-C (or ``q``, Ctrl-D, ``row``/``new``): cancel the rollout, saying why in its
        ERROR/cancelled result; a second Ctrl-C stops waiting for it."""
        if active.task.done():
            return
        say = self.terminal.say
        if active.cancel_requested:
            say("[yellow]Ctrl-C again: no longer waiting for this rollout.[/]")
            active.task.cancel()
            return
        active.cancel_requested = True
        if self.harness.cancel(active.rollout_id, reason=reason):
            say(
                f"[yellow]Cancelling rollout {active.rollout_id}[/]; the server sends its "
                "ERROR/cancelled callback."
            )
            return
        # In another process: ask its server to cancel it (so a server that can ends it as
        # cancelled), then refuse its further turns, the paused one included.
        active.remote_cancel = asyncio.ensure_future(self._cancel_remote(active))
        say(
            f"[yellow]Cancelling rollout {active.rollout_id} on the server[/] (POST cancel). "
            "Ctrl-C again stops waiting."
        )

    async def _cancel_remote(self, active: Active) -> None:
        """The server's answer to the cancel, said: a server without a working cancel (as
        osmosis-ai 0.3's ``LocalBackend``) ends the rollout with an error instead."""
        cancelled = await self.harness.cancel_remote(active.rollout_id)
        self.stepper.abandon(active.rollout_id)
        if cancelled:
            self.terminal.say("[yellow]The server cancelled it; its cancelled result follows.[/]")
        else:
            self.terminal.say(
                "[yellow]The server did not cancel it[/] (no such disposition in its answer): "
                "its LLM turns are refused now, so it ends with an error."
            )

    def show_live_metrics(self, active: Active, turn: Turn) -> None:
        """The metrics of ``active`` so far, paused at ``turn``."""
        context = self._context(active.rollout_id)
        metrics = context.metrics if context is not None else _metrics_from(turn.record)
        times = self.stepper.times.get(active.rollout_id, TurnTimes())
        paused_ms = times.paused_now_ms()
        in_flight = turn.model_ms + paused_ms - times.paused_ms if context is not None else 0.0
        self.terminal.show(
            metrics_table(
                metrics,
                paused_ms=paused_ms,
                model_ms=times.model_ms,
                in_flight_ms=in_flight,
                title="Metrics so far",
            )
        )

    def _context(self, rollout_id: str) -> RolloutContext | None:
        """The running rollout's context, when the server runs in this process."""
        server = self.harness.rollout_server
        entry = server.registry.by_id.get(rollout_id) if server is not None else None
        return entry.control.context if entry is not None else None


def _fill_untold_metrics(row: RowResult, outcome: RolloutOutcome) -> bool:
    """Give ``row.metrics`` the mock's figures for what a server in another process did not
    report (the official SDK's server sends ``{}``); True when any came from the mock."""
    result = outcome.result
    reported = result.metrics if result is not None else None
    told = reported.model_fields_set if reported is not None else set()
    if "num_llm_calls" in told or not outcome.record.replies:
        return False
    seen = _metrics_from(outcome.record).model_dump()
    seen.update(total_latency_ms=row.latency_ms, llm_latency_ms=row.llm_ms)
    if reported is not None:
        seen.update(reported.model_dump(include=told))
    row.metrics = seen
    return True


def _metrics_from(record: RolloutRecord) -> RolloutMetrics:
    """Metrics as TrainGate sees them, for a server in another process (no latency split)."""
    usages = [reply.usage for reply in record.replies]
    tool_results = sum(
        1 for m in (record.chats[-1].messages if record.chats else []) if m.get("role") == "tool"
    )
    return RolloutMetrics(
        num_llm_calls=len(record.replies),
        num_tool_calls=tool_results,
        prompt_tokens=sum(u.prompt_tokens for u in usages),
        response_tokens=sum(u.completion_tokens for u in usages),
        max_context_tokens=max((u.prompt_tokens for u in usages), default=0),
    )
