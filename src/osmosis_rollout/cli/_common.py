"""What every command shares: the consoles, the one async bridge, and error-to-exit mapping."""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Coroutine, Iterator
from typing import TYPE_CHECKING, Any, NoReturn, TextIO, TypeVar, cast

import typer
from rich.console import Console
from rich.markup import escape

if TYPE_CHECKING:
    import asyncio

T = TypeVar("T")

#: Exit codes: 0 ok, 1 problems found, 2 usage or configuration error, 130 interrupted.
EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def stdout_console() -> Console:
    """The console for results (stdout). Piped, its lines carry no trailing spaces (Rich pads
    table cells to the column width), so ``osmosis test ... | diff`` and ``grep 'x$'`` work."""
    if sys.stdout.isatty():
        return Console(highlight=False)
    return Console(highlight=False, file=cast(TextIO, _RstripLines(sys.stdout)))


class _RstripLines(io.TextIOBase):
    """A text stream that drops the spaces at the end of every line written through it."""

    def __init__(self, target: TextIO) -> None:
        self._target = target
        self._pending = ""

    def write(self, text: str) -> int:
        lines = (self._pending + text).split("\n")
        self._pending = lines.pop()
        if lines:
            self._target.write("".join(line.rstrip(" ") + "\n" for line in lines))
        return len(text)

    def flush(self) -> None:
        # Also called when this wrapper is garbage-collected (IOBase closes itself), which may be
        # after the stream under it was closed (a test runner's capture, a closed pipe).
        if getattr(self._target, "closed", False):
            self._pending = ""
            return
        if self._pending:
            self._target.write(self._pending)
            self._pending = ""
        self._target.flush()

    def isatty(self) -> bool:
        return False


def stderr_console() -> Console:
    """The console for progress, notes and errors (stderr), so stdout stays parseable."""
    return Console(stderr=True, highlight=False)


#: Whether the command line asked for ``--json``: then an error is also one JSON object on stdout
#: (docs/json.md), so a script reading stdout always gets JSON. Set by the group's ``main``.
JSON_ERRORS = {"on": False}


def fail(message: str, *, code: int = EXIT_USAGE, hint: str | None = None) -> NoReturn:
    """Print one clear error line (and an optional hint) on stderr and exit with ``code``;
    under ``--json``, the error as JSON on stdout instead."""
    print_error(message, hint=hint, code=code)
    raise typer.Exit(code)


def error_json(message: str, *, code: int, hint: str | None = None, kind: str = "error") -> str:
    """The JSON of an error (docs/json.md): ``{"version": 1, "error": {...}, "exit_code": N}``."""
    import json

    error = {"kind": kind, "message": message, "hint": hint}
    return json.dumps({"version": 1, "error": error, "exit_code": code})


def print_error(
    message: str, *, hint: str | None = None, code: int = EXIT_USAGE, kind: str = "error"
) -> None:
    """``Error: message`` and ``Hint: hint`` on stderr, the one error style of every command;
    under ``--json`` also :func:`error_json` on stdout (``code`` and ``kind`` are for it), so
    stdout stays JSON while a person still reads the error where errors go."""
    if JSON_ERRORS["on"]:
        sys.stdout.write(error_json(message, code=code, hint=hint, kind=kind) + "\n")
        sys.stdout.flush()
    err = stderr_console()
    # soft_wrap: one message stays one line (the terminal wraps it), so it greps and logs well.
    err.print(f"[bold red]Error:[/] {escape(message)}", soft_wrap=True)
    if hint:
        err.print(f"[dim]Hint:[/] {escape(hint)}", soft_wrap=True)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """The one bridge from the CLI into async code; Ctrl-C exits 130 without a traceback."""
    import asyncio  # here, not at the top: it costs ~30 ms of every `osmosis --help`

    from ..errors import OsmosisError

    try:
        with _sigterm_as_ctrl_c() as stop:
            return asyncio.run(stop.guard(coro))
    except KeyboardInterrupt:
        stderr_console().print("[yellow]Interrupted.[/]")
        sys.stderr.flush()
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except BaseExceptionGroup as group:
        # Concurrent rows can fail together with copies of one domain error; show the first
        # as the usual one-line message instead of a traceback of the whole group.
        matched, rest = group.split(OsmosisError)
        if matched is None or rest is not None:
            raise
        first: BaseException = matched
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None


#: What interrupted the current run: "Ctrl-C" or "SIGTERM" (for summaries that say why they
#: stop); reset as each run starts.
INTERRUPTED_BY = {"signal": "Ctrl-C"}


class _SigtermStop:
    """SIGTERM (``kill``, a CI timeout, a container stop) ends the run the way Ctrl-C does: the
    rows that finished are kept and summarised, instead of the process dying mid-write.

    It cancels the run's main task itself, as ``asyncio.run`` does on a first Ctrl-C, rather
    than re-raising SIGINT: a shell without job control (a script's or a CI job's ``cmd &``)
    starts background jobs with SIGINT ignored, and then a re-raised SIGINT does nothing. That
    ignored SIGINT is left alone on purpose: the shell ignores it so that a Ctrl-C meant for the
    foreground does not also stop the background jobs, and ``kill -TERM`` is how a script stops
    one. A second SIGTERM stops at once (``KeyboardInterrupt``), as a second Ctrl-C does.
    """

    def __init__(self) -> None:
        self.task: asyncio.Task[Any] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.requested = False

    async def guard(self, coro: Coroutine[Any, Any, T]) -> T:
        """``coro``, run as the task a SIGTERM cancels."""
        import asyncio

        self.loop, self.task = asyncio.get_running_loop(), asyncio.current_task()
        return await coro

    def on_sigterm(self, signum: int, frame: object) -> None:
        INTERRUPTED_BY["signal"] = "SIGTERM"
        first, self.requested = not self.requested, True
        if not first or self.task is None or self.task.done() or self.loop is None:
            raise KeyboardInterrupt  # a second SIGTERM, or no run to cancel (yet or any more)
        self.task.cancel()
        self.loop.call_soon_threadsafe(lambda: None)  # wake the loop if it sleeps in select()


@contextlib.contextmanager
def _sigterm_as_ctrl_c() -> Iterator[_SigtermStop]:
    """SIGTERM handled by a :class:`_SigtermStop` while the run lasts; a cancelled run that
    SIGTERM asked for ends as ``KeyboardInterrupt`` (exit 130), as after Ctrl-C."""
    import asyncio
    import signal

    INTERRUPTED_BY["signal"] = "Ctrl-C"  # this run's, not a previous run's in this process
    stop = _SigtermStop()
    try:
        previous = signal.signal(signal.SIGTERM, stop.on_sigterm)
    except ValueError:  # not the main thread: leave signals alone
        yield stop
        return
    try:
        yield stop
    except asyncio.CancelledError:
        if not stop.requested:
            raise
        raise KeyboardInterrupt from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    if stop.requested:  # the run swallowed the cancel and returned: still an interrupt
        raise KeyboardInterrupt
