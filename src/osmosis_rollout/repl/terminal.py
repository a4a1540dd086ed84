"""What the REPL reads from and writes to: the prompt, the key watcher and the waiting line.

Kept apart from the loop so that the loop never touches prompt_toolkit or Rich directly: it is
given a :class:`Terminal` over a prompt session and a console, which tests build over a pipe
and a ``StringIO``; or, for commands piped in, a :class:`PipedTerminal` that reads lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from prompt_toolkit import PromptSession
from prompt_toolkit.completion import DummyCompleter, WordCompleter
from prompt_toolkit.input.typeahead import get_typeahead, store_typeahead
from prompt_toolkit.keys import Keys
from prompt_toolkit.patch_stdout import patch_stdout
from rich.console import Console, RenderableType

from .commands import completion_words
from .stepper import Waiting

__all__ = ["PipedTerminal", "Terminal"]

#: The "waiting for the model" line: updated every tick in a terminal; elsewhere printed once
#: the wait reaches the first mark, then again every line interval.
_WAIT_TICK_S = 0.5
_WAIT_FIRST_S = 1.0
_WAIT_LINE_S = 30.0

_T = TypeVar("_T")


class Terminal:
    """The prompt session and console of one REPL; ``patch`` when prompting in a real terminal
    (output printed while a prompt is shown then goes above it)."""

    def __init__(self, session: PromptSession[str], console: Console, *, patch: bool) -> None:
        self.session = session
        self.console = console
        self.patch = patch
        self.completer = WordCompleter(completion_words(), ignore_case=True)

    def say(self, markup: str) -> None:
        self.console.print(markup)

    def show(self, renderable: RenderableType) -> None:
        self.console.print(renderable)

    async def prompt(self, message: str, *, commands: bool = True) -> str:
        """One line typed at ``message`` (with the commands completed when ``commands``)."""
        completer = self.completer if commands else DummyCompleter()
        if not self.patch:
            return await self.session.prompt_async(message, completer=completer)
        with patch_stdout(raw=True):
            return await self.session.prompt_async(message, completer=completer)

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

    async def get_showing_wait(self, queue: asyncio.Queue[_T], waiting: Waiting) -> _T:
        """The next item of ``queue``; meanwhile say that turn ``waiting`` is with the model,
        with the seconds waited (a live line in a terminal, a line every ``_WAIT_LINE_S``
        otherwise)."""
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
                    return await asyncio.wait_for(queue.get(), _WAIT_TICK_S)
                except TimeoutError:
                    continue


class PipedTerminal(Terminal):
    """Commands piped in (``printf 'n\\nq\\n' | osmosis test -i``: a script, a coding agent's
    tool call, a docs test): each line read from ``stream`` is printed after its prompt, so the
    output reads as a transcript. prompt_toolkit would redraw its prompt with a terminal's
    control codes whenever ``TERM`` names one (``turn 1> n`` came out twice, padded with
    spaces and blank lines) and read the pipe ahead as typeahead. There are no keys to watch:
    Ctrl-C is the terminal's SIGINT."""

    def __init__(self, console: Console, stream: Any = None) -> None:
        self.console = console
        self.patch = False
        self.completer = WordCompleter(completion_words(), ignore_case=True)
        self.stream = stream if stream is not None else sys.stdin
        self._lines: asyncio.Queue[str | None] | None = None

    async def prompt(self, message: str, *, commands: bool = True) -> str:
        """The next line piped in, shown after ``message``; ``EOFError`` at the end of input."""
        if self._lines is None:
            self._lines = asyncio.Queue()
            loop = asyncio.get_running_loop()
            reader = threading.Thread(
                target=self._read, args=(loop, self._lines), name="osmosis-repl-input", daemon=True
            )  # a daemon: a pipe left open never keeps the process from exiting
            reader.start()
        line = await self._lines.get()
        if line is None:
            self._lines.put_nowait(None)  # every later prompt ends too
            raise EOFError
        self.console.print(f"{message}{line}", markup=False, highlight=False)
        return line

    def _read(self, loop: asyncio.AbstractEventLoop, lines: asyncio.Queue[str | None]) -> None:
        """In the reader thread: each line of the stream, then None at its end."""
        try:
            for raw in iter(self.stream.readline, ""):
                loop.call_soon_threadsafe(lines.put_nowait, raw.rstrip("\r\n"))
        except (OSError, ValueError):  # the stream closed under us: the input has ended
            pass
        with contextlib.suppress(RuntimeError):  # the loop has already closed
            loop.call_soon_threadsafe(lines.put_nowait, None)

    @contextlib.contextmanager
    def watch_interrupt(self, on_interrupt: Callable[[], None]) -> Iterator[None]:
        yield
