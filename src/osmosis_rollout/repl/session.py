"""The REPL loop behind ``osmosis test --interactive``: one rollout at a time, paused per turn.

Two things run side by side: the rollout (the harness's server, the agent, and the mock
TrainGate whose backend is a :class:`SteppingBackend`) and this prompt loop. The backend posts
each turn on ``events``; the loop shows it and, when the turn waits, prompts until the user sends
the reply on. While a turn runs, a key watcher turns Ctrl-C into a clean cancel of that rollout.
The loop talks only to the core (harness, mock TrainGate, runner helpers) and is given its
prompt session and console, so tests drive it through a pipe.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prompt_toolkit import PromptSession
from prompt_toolkit.completion import DummyCompleter, WordCompleter
from prompt_toolkit.history import InMemoryHistory
from prompt_toolkit.input.typeahead import get_typeahead, store_typeahead
from prompt_toolkit.keys import Keys
from prompt_toolkit.patch_stdout import patch_stdout
from rich.console import Console
from rich.markup import escape
from rich.rule import Rule

from ..agent import RolloutAgentLoop, RolloutContext
from ..errors import OsmosisError, ToolError
from ..evaluation.runner import RowInput, RowResult, result_from_outcome
from ..protocol import CompletionsResponse, Message, OpenAIFunctionToolSchema, RolloutMetrics
from ..testing.harness import Harness, RolloutOutcome
from ..testing.records import LLMBackend, RolloutRecord, completion_from_message
from ..testing.traingate import name_gate_urls
from .commands import Command, completion_words, parse_command, parse_reply
from .stepper import SteppingBackend, Turn, TurnTimes, Waiting
from .views import (
    help_table,
    messages_view,
    metrics_table,
    outcome_view,
    rows_view,
    tools_view,
    turn_view,
)

__all__ = ["run_repl"]

#: A paused rollout waits for a human: no deadline should end it behind their back.
_FOREVER_S = 7 * 24 * 3600.0
#: How long leaving waits for a cancelled rollout's callback before giving up on it.
_QUIT_WAIT_S = 15.0
#: The "waiting for the model" line: updated every tick in a terminal; elsewhere printed once
#: the wait reaches the first mark, then again every line interval.
_WAIT_TICK_S = 0.5
_WAIT_FIRST_S = 1.0
_WAIT_LINE_S = 30.0


async def run_repl(
    agent: RolloutAgentLoop | None,
    *,
    backend: LLMBackend,
    rows: list[RowInput],
    start_row: int | None = None,
    server_url: str | None = None,
    server_key: str | None = None,
    completion_params: dict[str, Any] | None = None,
    max_turns: int = 10,
    debug_dir: str | Path | None = None,
    session: PromptSession[str] | None = None,
    console: Console | None = None,
) -> int:
    """Step through rollouts of ``agent`` (or of the server at ``server_url``, authenticated
    with ``server_key`` when it has one) turn by turn.

    ``session`` and ``console`` default to the terminal; tests pass a pipe-input session and a
    console writing to a ``StringIO``. Returns the exit code (0).
    """
    in_terminal = session is None and sys.stdout.isatty()
    if session is None:
        _accept_piped_input()
    session = session or PromptSession(history=InMemoryHistory())
    console = console or Console(highlight=False)
    events: asyncio.Queue[Turn | Waiting | _Ended] = asyncio.Queue()
    stepper = SteppingBackend(backend, events.put_nowait, events.put_nowait)
    async with Harness(
        agent,
        backend=stepper,
        server_url=server_url,
        server_key=server_key,
        rollout_timeout_s=_FOREVER_S,
        debug_dir=debug_dir,
    ) as harness:
        repl = _Repl(
            harness,
            stepper,
            events,
            rows,
            session=session,
            console=console,
            completion_params=completion_params or {},
            max_turns=max_turns,
            patch=in_terminal,
        )
        target = agent.name if agent is not None else server_url
        await repl.run(start_row, target=str(target))
    return 0


@dataclass(frozen=True)
class _Start:
    """A rollout to start: its first messages and metadata, and how to name it."""

    messages: list[Message]
    metadata: dict[str, Any]
    label: str
    row: int | None = None


@dataclass(frozen=True)
class _Ended:
    """Posted on the event queue when a rollout's ``Harness.run`` returns."""

    rollout_id: str


@dataclass
class _Active:
    """The rollout being stepped through."""

    rollout_id: str
    label: str
    task: asyncio.Task[RolloutOutcome]
    cancel_requested: bool = False


@dataclass
class _Finished:
    """The last rollout that ended, for ``messages``/``tools``/``metrics`` at the idle prompt."""

    row: RowResult
    tools: list[OpenAIFunctionToolSchema]
    times: TurnTimes = field(default_factory=TurnTimes)


class _Repl:
    def __init__(
        self,
        harness: Harness,
        stepper: SteppingBackend,
        events: asyncio.Queue[Turn | Waiting | _Ended],
        rows: list[RowInput],
        *,
        session: PromptSession[str],
        console: Console,
        completion_params: dict[str, Any],
        max_turns: int,
        patch: bool,
    ) -> None:
        self.harness = harness
        self.stepper = stepper
        self.events = events
        self.rows = rows
        self.session = session
        self.console = console
        self.completion_params = completion_params
        self.max_turns = max_turns
        self.patch = patch
        self.completer = WordCompleter(completion_words(), ignore_case=True)
        self.quitting = False
        self.queued: _Start | None = None
        self.last: _Finished | None = None
        self.last_row: int | None = None
        #: The active rollout's turn that is with the model now, for the "waiting" line.
        self.waiting: Waiting | None = None

    # -- the top level ---------------------------------------------------------------------------

    async def run(self, start_row: int | None, *, target: str) -> None:
        self.say(
            f"[bold]osmosis test --interactive[/]: {escape(target)}. Each LLM turn pauses: "
            "[bold]Enter[/] next, [bold]c[/] continue, [bold]m[/] messages, [bold]t[/] tools, "
            "[bold]edit[/], [bold]help[/]; Ctrl-C cancels the rollout, [bold]q[/] leaves."
        )
        start = await self.first_start(start_row)
        while not self.quitting:
            if start is not None:
                await self.run_rollout(start)
                start, self.queued = self.queued, None
            else:
                start = await self.idle()
        self.say("[dim]bye[/]")

    async def first_start(self, start_row: int | None) -> _Start | None:
        if start_row is not None:
            return self.row_start(str(start_row))
        if self.rows:
            self.console.print(rows_view(self.rows))
            self.say(
                f"Type [bold]row N[/] to start one, or press Enter for row {self.rows[0].index}."
            )
            return None
        self.say("No dataset: type the first user message (empty line for the command prompt).")
        return await self.ask_message("")

    async def idle(self) -> _Start | None:
        """One command at the prompt between rollouts; returns a rollout to start, if any."""
        try:
            line = await self.prompt("osmosis> ")
        except KeyboardInterrupt:
            self.say("[dim](Ctrl-C: nothing is running; q or Ctrl-D leaves)[/]")
            return None
        except EOFError:
            self.quitting = True
            return None
        cmd = parse_command(line)
        if cmd.name == "next":
            return self.next_row_start() if self.rows else await self.ask_message("")
        if cmd.name == "row":
            return self.row_start(cmd.arg)
        if cmd.name == "new":
            return await self.ask_message(cmd.arg)
        if cmd.name == "quit":
            self.quitting = True
        elif cmd.name == "help":
            self.console.print(help_table())
        elif cmd.name in ("messages", "tools", "metrics"):
            self.show_last(cmd.name)
        elif cmd.name in ("continue", "edit"):
            self.say(f"No rollout is paused; [bold]{cmd.name}[/] works at a turn prompt.")
        else:
            self.unknown(cmd)
        return None

    # -- choosing what to run --------------------------------------------------------------------

    def row_start(self, arg: str) -> _Start | None:
        if not self.rows:
            self.say("[red]No dataset loaded[/]: pass --dataset FILE, or use [bold]new[/].")
            return None
        if not arg:
            self.console.print(rows_view(self.rows))
            return None
        try:
            index = int(arg)
        except ValueError:
            self.say(f"[red]row needs a row number[/], e.g. [bold]row {self.rows[0].index}[/]")
            return None
        for row in self.rows:
            if row.index == index:
                self.last_row = index
                return _Start(list(row.messages), dict(row.metadata), f"row {index}", index)
        first, last = self.rows[0].index, self.rows[-1].index
        self.say(f"[red]There is no row {index}[/]: the dataset has rows {first}-{last}.")
        return None

    def next_row_start(self) -> _Start | None:
        if self.last_row is None:
            return self.row_start(str(self.rows[0].index))
        later = [row.index for row in self.rows if row.index > self.last_row]
        if not later:
            self.say("That was the last row; [bold]row N[/] picks another, [bold]q[/] leaves.")
            return None
        return self.row_start(str(later[0]))

    async def ask_message(self, text: str) -> _Start | None:
        if not text:
            try:
                text = await self.prompt("message> ", commands=False)
            except KeyboardInterrupt:
                text = ""
            except EOFError:
                self.quitting = True
                return None
        if not text.strip():
            self.say("[dim]No message; nothing started. [bold]new[/] asks again.[/]")
            return None
        return _Start([{"role": "user", "content": text.strip()}], {}, "your message")

    # -- one rollout -----------------------------------------------------------------------------

    async def run_rollout(self, start: _Start) -> None:
        tag = f"row{start.row}" if start.row is not None else "msg"
        rid = f"repl-{tag}-{uuid.uuid4().hex[:6]}"
        self.stepper.active = rid
        task = asyncio.create_task(
            self.harness.run(
                start.messages,
                rollout_id=rid,
                completion_params=self.completion_params,
                metadata=start.metadata,
                max_turns=self.max_turns,
                timeout_s=_FOREVER_S,
            )
        )
        task.add_done_callback(lambda _: self.events.put_nowait(_Ended(rid)))
        active = _Active(rid, start.label, task)
        self.console.print(Rule(f"rollout {rid} | {start.label}", style="bold blue"))
        try:
            await self.drive(active)
        finally:
            self.stepper.active = None
            self.waiting = None
            if not task.done():
                task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self.report(active, start)

    async def drive(self, active: _Active) -> None:
        """Show each turn of ``active`` and prompt at those that wait, until it ends."""
        while True:
            event = await self.next_event(active)
            if event is None or (
                isinstance(event, _Ended) and event.rollout_id == active.rollout_id
            ):
                return
            if isinstance(event, _Ended):
                continue
            if isinstance(event, Waiting):
                if event.rollout_id == active.rollout_id:
                    self.waiting = event
                continue
            if event.rollout_id != active.rollout_id:
                event.release()
                continue
            self.waiting = None
            self.console.print(turn_view(event, title=active.label))
            if event.waiting:
                await self.paused(active, event)

    async def next_event(self, active: _Active) -> Turn | Waiting | _Ended | None:
        """The next event, with Ctrl-C watched; None when leaving and the rollout will not end."""
        with self.watch_interrupt(lambda: self.interrupt(active)):
            if not self.quitting:
                return await self.next_event_showing_wait()
            try:
                return await asyncio.wait_for(self.events.get(), _QUIT_WAIT_S)
            except TimeoutError:
                self.say(f"[yellow]Gave up waiting for rollout {active.rollout_id} to end.[/]")
                return None

    async def next_event_showing_wait(self) -> Turn | Waiting | _Ended:
        """The next event; meanwhile, while a turn is with the model, say so with the seconds
        waited (a live line in a terminal, a line every ``_WAIT_LINE_S`` otherwise)."""
        waiting = self.waiting
        if waiting is None:
            return await self.events.get()
        live = self.console.is_terminal
        status = self.console.status("") if live else contextlib.nullcontext()
        printed_at = -_WAIT_LINE_S
        with status as shown:
            while True:
                waited = time.monotonic() - waiting.since
                line = f"waiting for the model (turn {waiting.number}), {waited:.0f} s"
                if shown is not None:
                    shown.update(f"{line}; Ctrl-C cancels")
                elif waited >= _WAIT_FIRST_S and waited - printed_at >= _WAIT_LINE_S:
                    self.say(f"[dim]{line}...[/]")
                    printed_at = waited
                try:
                    return await asyncio.wait_for(self.events.get(), _WAIT_TICK_S)
                except TimeoutError:
                    continue

    def report(self, active: _Active, start: _Start) -> None:
        task = active.task
        if task.cancelled():
            self.say(
                f"[yellow]Stopped waiting for rollout {active.rollout_id}[/]; a remote server "
                "may still finish it."
            )
            return
        exc = task.exception()
        if isinstance(exc, OsmosisError):
            message = name_gate_urls(str(exc), self.harness.gate.base_url) or ""
            self.say(f"[bold red]Error:[/] {escape(message)}")
            return
        if exc is not None:
            raise exc
        outcome = task.result()
        row = result_from_outcome(start.row or 0, outcome, gate_url=self.harness.gate.base_url)
        times = self.stepper.times.pop(active.rollout_id, TurnTimes())
        self.last = _Finished(row, list(outcome.record.tools), times)
        self.console.print(outcome_view(row, paused_ms=times.paused_ms, model_ms=times.model_ms))
        if not self.quitting and self.queued is None:
            nxt = "Enter: next row, row N, " if self.rows else "Enter or new: another message, "
            self.say(f"[dim]{nxt}m: final messages, q: leave.[/]")

    # -- a paused turn ---------------------------------------------------------------------------

    async def paused(self, active: _Active, turn: Turn) -> None:
        while turn.waiting and not active.cancel_requested:
            try:
                line = await self.prompt(f"turn {turn.number}> ")
            except KeyboardInterrupt:
                self.interrupt(active)
                return
            except EOFError:
                self.quitting = True
                self.interrupt(active, reason="Ctrl-D at the REPL")
                return
            if turn.waiting:
                await self.paused_command(active, turn, parse_command(line))
            if self.quitting:  # `q`, or Ctrl-D at a prompt opened by `edit` or `new`
                self.interrupt(active, reason="you left the REPL")
                return

    async def paused_command(self, active: _Active, turn: Turn, cmd: Command) -> None:
        if cmd.name == "next":
            turn.release()
        elif cmd.name == "continue":
            self.stepper.run_free(active.rollout_id)
            turn.release()
            self.say("[dim]Running to the end without pausing (Ctrl-C cancels).[/]")
        elif cmd.name == "messages":
            self.console.print(messages_view(turn.request.messages, pending=_message(turn)))
        elif cmd.name == "tools":
            self.console.print(tools_view(turn.record.tools))
        elif cmd.name == "metrics":
            self.show_live_metrics(active, turn)
        elif cmd.name == "edit":
            await self.edit(turn, cmd.arg)
        elif cmd.name in ("row", "new"):
            start = (
                self.row_start(cmd.arg) if cmd.name == "row" else await self.ask_message(cmd.arg)
            )
            if start is not None:
                self.queued = start
                self.say(f"Cancelling this rollout to start {start.label}.")
                self.interrupt(active, reason=f"you started {start.label}")
        elif cmd.name == "quit":
            self.quitting = True
        elif cmd.name == "help":
            self.console.print(help_table())
        else:
            self.unknown(cmd)

    async def edit(self, turn: Turn, text: str) -> None:
        if not text:
            self.say(
                'Type the reply: text, or a tool call as JSON {"name": ..., "arguments": {...}} '
                "(or a list of them); an empty line keeps the reply."
            )
            try:
                text = await self.prompt("reply> ", commands=False)
            except KeyboardInterrupt:
                text = ""
            except EOFError:
                self.quitting = True
                return
        if not text.strip():
            self.say("[dim]Edit cancelled; the reply is unchanged.[/]")
            return
        try:
            edited = parse_reply(text, turn.record.tools, turn=turn.number)
        except ToolError as exc:
            self.say(f"[bold red]Cannot use this reply:[/] {escape(str(exc))}")
            return
        for warning in edited.warnings:
            self.say(f"[yellow]Warning:[/] {escape(warning)}")
        turn.reply = _edited_reply(turn, edited.message)
        turn.edited = True
        self.console.print(turn_view(turn, title="edited"))
        self.say("[dim]The agent gets this reply when you go on (Enter or c).[/]")

    # -- cancelling ------------------------------------------------------------------------------

    def interrupt(self, active: _Active, reason: str = "Ctrl-C at the REPL") -> None:
        """Ctrl-C (or ``q``, Ctrl-D, ``row``/``new``): cancel the rollout, saying why in its
        ERROR/cancelled result; a second Ctrl-C stops waiting for it."""
        if active.task.done():
            return
        if active.cancel_requested:
            self.say("[yellow]Ctrl-C again: no longer waiting for this rollout.[/]")
            active.task.cancel()
            return
        active.cancel_requested = True
        if self.harness.cancel(active.rollout_id, reason=reason):
            self.say(
                f"[yellow]Cancelling rollout {active.rollout_id}[/]; the server sends its "
                "ERROR/cancelled callback."
            )
            return
        self.stepper.abandon(active.rollout_id)
        self.say(
            f"[yellow]Rollout {active.rollout_id} runs on a remote server[/], which cannot be "
            "cancelled from here: its LLM turns are now refused, so it ends with an error. "
            "Ctrl-C again stops waiting."
        )

    @contextlib.contextmanager
    def watch_interrupt(self, on_interrupt: Callable[[], None]) -> Iterator[None]:
        """Read keys while no prompt is shown: Ctrl-C calls ``on_interrupt``; other keys are
        kept as typeahead for the next prompt. Raw mode turns Ctrl-C into a key, not SIGINT."""
        inp = self.session.input

        def take(keys: list[Any]) -> None:
            if any(key.key == Keys.ControlC for key in keys):
                on_interrupt()
            store_typeahead(inp, [key for key in keys if key.key != Keys.ControlC])

        take(get_typeahead(inp))
        with contextlib.ExitStack() as stack:
            if not inp.closed:
                try:
                    stack.enter_context(inp.raw_mode())
                    stack.enter_context(inp.attach(lambda: take(inp.read_keys())))
                except EOFError:  # an input that cannot be watched (/dev/null): no Ctrl-C
                    pass
            yield

    # -- showing things --------------------------------------------------------------------------

    def show_live_metrics(self, active: _Active, turn: Turn) -> None:
        context = self.context(active.rollout_id)
        metrics = context.metrics if context is not None else _metrics_from(turn.record)
        times = self.stepper.times.get(active.rollout_id, TurnTimes())
        paused_ms = times.paused_now_ms()
        in_flight = turn.model_ms + paused_ms - times.paused_ms if context is not None else 0.0
        self.console.print(
            metrics_table(
                metrics,
                paused_ms=paused_ms,
                model_ms=times.model_ms,
                in_flight_ms=in_flight,
                title="Metrics so far",
            )
        )

    def context(self, rollout_id: str) -> RolloutContext | None:
        """The running rollout's context, when the server runs in this process."""
        server = self.harness.rollout_server
        entry = server.registry.by_id.get(rollout_id) if server is not None else None
        return entry.control.context if entry is not None else None

    def show_last(self, what: str) -> None:
        last = self.last
        if last is None:
            self.say(f"No rollout has run yet; [bold]{what}[/] shows the last one once it ends.")
            return
        if what == "messages":
            self.console.print(messages_view(last.row.final_messages))
        elif what == "tools":
            self.console.print(tools_view(last.tools))
        elif last.row.metrics:
            metrics = RolloutMetrics.model_validate(last.row.metrics)
            self.console.print(
                metrics_table(metrics, paused_ms=last.times.paused_ms, model_ms=last.times.model_ms)
            )
        else:
            self.say("The last rollout reported no metrics.")

    def unknown(self, cmd: Command) -> None:
        self.say(f"[red]Unknown command[/] {escape(cmd.word)!r}.")
        self.console.print(help_table())

    def say(self, markup: str) -> None:
        self.console.print(markup)

    async def prompt(self, message: str, *, commands: bool = True) -> str:
        completer = self.completer if commands else DummyCompleter()
        if not self.patch:
            return await self.session.prompt_async(message, completer=completer)
        with patch_stdout(raw=True):
            return await self.session.prompt_async(message, completer=completer)


def _edited_reply(turn: Turn, message: Message) -> CompletionsResponse:
    """The reply typed at ``edit``: its prompt is the one the model saw, so the prompt's real
    token counts and ids stay; only the completion's are estimated (no model sampled it)."""
    original = turn.reply
    edited = completion_from_message(turn.request, message, turn=turn.number - 1)
    prompt = original.usage.prompt_tokens
    usage = edited.usage.model_copy(
        update={"prompt_tokens": prompt, "total_tokens": prompt + edited.usage.completion_tokens}
    )
    return edited.model_copy(
        update={
            "id": original.id,
            "model": original.model,
            "usage": usage,
            "prompt_token_ids": original.prompt_token_ids,
        }
    )


def _message(turn: Turn) -> Message:
    return turn.reply.message.model_dump(mode="json", exclude_none=True)


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


def _accept_piped_input() -> None:
    """Commands piped in (``printf 'n\\nq\\n' | osmosis test -i``: a script, a docs test) are
    supported, so prompt_toolkit's "Input is not a terminal" warning is not printed for them."""
    with contextlib.suppress(Exception):  # prompt_toolkit internals: never fail the session
        from prompt_toolkit.input.vt100 import Vt100Input

        if not sys.stdin.isatty():
            Vt100Input._fds_not_a_terminal.add(sys.stdin.fileno())
