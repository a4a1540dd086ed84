"""The REPL loop behind ``osmosis test --interactive``: one rollout at a time, paused per turn.

Two things run side by side: the rollout (the harness's server, the agent, and the mock
TrainGate whose backend is a :class:`SteppingBackend`; driven by :mod:`.rollout`) and this
prompt loop, which decides what to run and what each command typed at its prompts does. The
backend posts each turn on ``events``; when a turn waits, the loop prompts until the user sends
the reply on. The loop talks only to the core (harness, mock TrainGate, runner helpers) and is
given its prompt session and console (:mod:`.terminal`), so tests drive it through a pipe.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from prompt_toolkit import PromptSession
from prompt_toolkit.history import InMemoryHistory
from rich.console import Console
from rich.markup import escape

from ..agent import RolloutAgentLoop
from ..errors import ToolError
from ..evaluation.runner import RowInput
from ..protocol import CompletionsResponse, Message, RolloutMetrics
from ..testing.harness import Harness
from ..testing.records import LLMBackend, completion_from_message
from .commands import Command, parse_command, parse_reply
from .rollout import FOREVER_S, Active, Ended, Finished, RolloutDriver, Start
from .stepper import SteppingBackend, Turn, Waiting
from .terminal import PipedTerminal, Terminal
from .views import (
    full_message_view,
    help_table,
    messages_view,
    metrics_table,
    rows_view,
    tools_view,
    turn_view,
)

__all__ = ["run_repl"]


async def run_repl(
    agent: RolloutAgentLoop | None,
    *,
    backend: LLMBackend,
    rows: list[RowInput],
    start_row: int | None = None,
    server_url: str | None = None,
    server_key: str | None = None,
    protocol: str = "v1",
    completion_params: dict[str, Any] | None = None,
    max_turns: int = 10,
    debug_dir: str | Path | None = None,
    session: PromptSession[str] | None = None,
    console: Console | None = None,
) -> int:
    """Step through rollouts of ``agent`` (or of the server at ``server_url``, authenticated
    with ``server_key`` when it has one) turn by turn, over the wire named ``protocol``.

    ``session`` and ``console`` default to the terminal; tests pass a pipe-input session and a
    console writing to a ``StringIO``. Returns the exit code (0).
    """
    console = console or Console(highlight=False)
    terminal: Terminal
    if session is None and not sys.stdin.isatty():
        terminal = PipedTerminal(console)  # commands piped in: read as lines, shown as typed
    else:
        in_terminal = session is None and sys.stdout.isatty()
        session = session or PromptSession(history=InMemoryHistory())
        terminal = Terminal(session, console, patch=in_terminal)
    events: asyncio.Queue[Turn | Waiting | Ended] = asyncio.Queue()
    stepper = SteppingBackend(backend, events.put_nowait, events.put_nowait)
    async with Harness(
        agent,
        backend=stepper,
        server_url=server_url,
        server_key=server_key,
        protocol=protocol,
        rollout_timeout_s=FOREVER_S,
        debug_dir=debug_dir,
    ) as harness:
        driver = RolloutDriver(
            harness,
            stepper,
            events,
            terminal,
            completion_params=completion_params or {},
            max_turns=max_turns,
        )
        repl = _Repl(driver, terminal, rows)
        target = agent.name if agent is not None else server_url
        await repl.run(start_row, target=str(target))
    return 0


class _Repl:
    """The session's state (leaving, the rollout queued next, the last one that ended) and
    what each command does at the idle prompt and at a paused turn."""

    def __init__(self, driver: RolloutDriver, terminal: Terminal, rows: list[RowInput]) -> None:
        self.driver = driver
        self.terminal = terminal
        self.console = terminal.console
        self.say = terminal.say
        self.prompt = terminal.prompt
        self.rows = rows
        self.quitting = False
        self.queued: Start | None = None
        self.last: Finished | None = None
        self.last_row: int | None = None

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

    async def first_start(self, start_row: int | None) -> Start | None:
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

    async def idle(self) -> Start | None:
        """One command at the prompt between rollouts; returns a rollout to start, if any."""
        try:
            line = await self.prompt("osmosis> ")
        except KeyboardInterrupt:
            self.say("[dim](Ctrl-C: nothing is running; q or Ctrl-D leaves)[/]")
            return None
        except EOFError:
            self.quitting = True
            return None
        cmd = _show_when_numbered(parse_command(line))
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
        elif cmd.name == "show":
            self.show_one(self.last.row.final_messages if self.last else None, None, cmd.arg)
        elif cmd.name in ("continue", "edit"):
            self.say(f"No rollout is paused; [bold]{cmd.name}[/] works at a turn prompt.")
        else:
            self.unknown(cmd)
        return None

    async def run_rollout(self, start: Start) -> None:
        finished = await self.driver.run(start, on_pause=self.paused, leaving=self.leaving)
        if finished is None:
            return
        self.last = finished
        if not self.quitting and self.queued is None:
            nxt = "Enter: next row, row N, " if self.rows else "Enter or new: another message, "
            self.say(f"[dim]{nxt}m: final messages, q: leave.[/]")

    def leaving(self) -> bool:
        return self.quitting

    # -- choosing what to run --------------------------------------------------------------------

    def row_start(self, arg: str) -> Start | None:
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
                label = f"row {index}"
                return Start(list(row.messages), dict(row.metadata), label, index, row.replies)
        first, last = self.rows[0].index, self.rows[-1].index
        self.say(f"[red]There is no row {index}[/]: the dataset has rows {first}-{last}.")
        return None

    def next_row_start(self) -> Start | None:
        if self.last_row is None:
            return self.row_start(str(self.rows[0].index))
        later = [row.index for row in self.rows if row.index > self.last_row]
        if not later:
            self.say("That was the last row; [bold]row N[/] picks another, [bold]q[/] leaves.")
            return None
        return self.row_start(str(later[0]))

    async def ask_message(self, text: str) -> Start | None:
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
        return Start([{"role": "user", "content": text.strip()}], {}, "your message")

    # -- a paused turn ---------------------------------------------------------------------------

    async def paused(self, active: Active, turn: Turn) -> None:
        while turn.waiting and not active.cancel_requested:
            try:
                line = await self.prompt(f"turn {turn.number}> ")
            except KeyboardInterrupt:
                self.driver.interrupt(active)
                return
            except EOFError:
                self.quitting = True
                self.driver.interrupt(active, reason="Ctrl-D at the REPL")
                return
            if turn.waiting:
                await self.paused_command(active, turn, _show_when_numbered(parse_command(line)))
            if self.quitting:  # `q`, or Ctrl-D at a prompt opened by `edit` or `new`
                self.driver.interrupt(active, reason="you left the REPL")
                return

    async def paused_command(self, active: Active, turn: Turn, cmd: Command) -> None:
        if cmd.name == "next":
            turn.release()
        elif cmd.name == "continue":
            self.driver.run_free(active)
            turn.release()
            self.say("[dim]Running to the end without pausing (Ctrl-C cancels).[/]")
        elif cmd.name == "messages":
            self.console.print(messages_view(turn.request.messages, pending=_message(turn)))
        elif cmd.name == "show":
            self.show_one(turn.request.messages, _message(turn), cmd.arg)
        elif cmd.name == "tools":
            self.console.print(tools_view(turn.record.tools))
        elif cmd.name == "metrics":
            self.driver.show_live_metrics(active, turn)
        elif cmd.name == "edit":
            await self.edit(turn, cmd.arg)
        elif cmd.name in ("row", "new"):
            start = (
                self.row_start(cmd.arg) if cmd.name == "row" else await self.ask_message(cmd.arg)
            )
            if start is not None:
                self.queued = start
                self.say(f"Cancelling this rollout to start {start.label}.")
                self.driver.interrupt(active, reason=f"you started {start.label}")
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

    # -- showing things --------------------------------------------------------------------------

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
                metrics_table(
                    metrics,
                    paused_ms=last.times.paused_ms,
                    model_ms=last.times.model_ms,
                    answered=last.answered,
                )
            )
        else:
            self.say("The last rollout reported no metrics.")

    def show_one(self, messages: list[Message] | None, pending: Message | None, arg: str) -> None:
        """``show N``: message N of the conversation (the last rollout's, between rollouts)."""
        if messages is None:
            self.say("No rollout has run yet; [bold]show N[/] shows its messages once it ends.")
            return
        try:
            index = int(arg)
        except ValueError:
            self.say(
                "[red]show needs a message number[/] (as [bold]m[/] numbers them), e.g. "
                "[bold]show 1[/]"
            )
            return
        self.console.print(full_message_view(messages, index, pending=pending))

    def unknown(self, cmd: Command) -> None:
        self.say(f"[red]Unknown command[/] {escape(cmd.word)!r}.")
        self.console.print(help_table())


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


def _show_when_numbered(cmd: Command) -> Command:
    """``m N`` (``messages N``) is ``show N``: the numbered message in full."""
    if cmd.name == "messages" and cmd.arg:
        return Command("show", cmd.arg, cmd.word)
    return cmd


def _message(turn: Turn) -> Message:
    return turn.reply.message.model_dump(mode="json", exclude_none=True)
