"""``osmosis test --launch CMD``: start a rollout server the way the platform does, then stop it.

Any Osmosis rollout server can be tested unchanged, whatever wrote it, because the platform
starts every one the same way: a command run in the project's folder with
``_OSMOSIS_ROLLOUT_PORT`` naming the port to serve on (some template mains read
``ROLLOUT_PORT``, so it is set too). Here the port is a free one on 127.0.0.1, the server's
output is kept (its last lines explain a server that dies), ``GET /health`` says when it is
ready (with ``LaunchSpec.echo``, ``--verbose``, each line is also copied to stderr as it
comes, so the server's own tracebacks are seen), and the server is always stopped: SIGTERM to
its process group, then SIGKILL after a bound, on every way out (a finished run, an error,
Ctrl-C).

A server that exits or never answers is a :class:`LaunchError` naming the command, its exit
code and its last lines of output: no traceback, no half-started run.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import queue
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.to_thread
import httpx2

from ..errors import LaunchError

__all__ = ["LaunchError", "LaunchSpec", "LaunchedServer", "launch", "split_command"]

#: The variables the platform sets for the server it starts (and one some template mains read).
PORT_VARIABLES = ("_OSMOSIS_ROLLOUT_PORT", "ROLLOUT_PORT")
INSTANCE_VARIABLE = "_OSMOSIS_ROLLOUT_INSTANCE_ID"
#: How many lines of the server's output are kept for an error message.
KEPT_LINES = 40
#: What starts each line of the server's output copied to stderr (``LaunchSpec.echo``).
ECHO_PREFIX = "server| "
#: How many of those lines may wait for a slow stderr before the next are dropped (a burst
#: of a server's start-up fits; at 500 characters a line, 5 MB at most).
ECHO_BACKLOG = 10_000


@dataclass(frozen=True)
class LaunchSpec:
    """What to start, where, and how long to wait for it and for its end."""

    command: str
    cwd: Path = field(default_factory=Path.cwd)
    env: Mapping[str, str] = field(default_factory=dict)
    startup_timeout_s: float = 120.0
    stop_timeout_s: float = 10.0
    #: Where the caller would have the server's dependencies, said when it dies of a missing
    #: module (``--config``: the rollout's ``.venv``); the generic advice stands without it.
    environment_hint: str | None = None
    #: Copy the server's output to stderr as it comes, each line after ``ECHO_PREFIX``
    #: (``osmosis test --launch CMD --verbose``): its tracebacks are the server's to print.
    echo: bool = False


@dataclass
class LaunchedServer:
    """A running launched server: where it listens, and what it has printed."""

    url: str
    port: int
    instance_id: str
    process: subprocess.Popen[bytes]
    output: collections.deque[str]

    def last_lines(self, count: int = 12) -> str:
        """The last ``count`` lines the server printed (for error messages)."""
        lines = list(self.output)[-count:]
        return "\n".join(lines) if lines else "(no output)"


def split_command(command: str) -> list[str]:
    """``command`` split like a shell would (no shell runs it); a clear error if it cannot."""
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise LaunchError(
            f"--launch {command!r} cannot be split like a shell line: {exc}"
        ) from None
    if not argv:
        raise LaunchError("--launch needs a command, e.g. --launch 'python main.py'")
    return argv


def free_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.asynccontextmanager
async def launch(spec: LaunchSpec) -> AsyncIterator[LaunchedServer]:
    """Start ``spec.command``, wait until it answers ``/health``, yield it, and stop it."""
    argv = split_command(spec.command)
    port = free_port()
    env = {**os.environ, **spec.env}
    env.update(dict.fromkeys(PORT_VARIABLES, str(port)))
    env.setdefault(INSTANCE_VARIABLE, f"osmosis-test-{secrets.token_hex(6)}")
    # Reached on 127.0.0.1 only: a main.py that binds the platform's 0.0.0.0 (ours, through
    # `osmosis serve`) binds loopback instead, so it may call the mock on 127.0.0.1 back.
    env.setdefault("OSMOSIS_HOST", "127.0.0.1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    process = _start(argv, spec, env)
    output: collections.deque[str] = collections.deque(maxlen=KEPT_LINES)
    echo = _Echo(_secret_values(env)) if spec.echo else None
    reader = threading.Thread(
        target=_collect, args=(process, output, echo), name="osmosis-launch-output", daemon=True
    )
    reader.start()
    url = f"http://127.0.0.1:{port}"
    server = LaunchedServer(url, port, env[INSTANCE_VARIABLE], process, output)
    try:
        await _wait_ready(server, spec)
        yield server
    finally:
        with anyio.CancelScope(shield=True):
            await stop(process, spec.stop_timeout_s)
        reader.join(timeout=1)
        if echo is not None:
            echo.close()


def _start(argv: list[str], spec: LaunchSpec, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """The server's process, in its own process group (stopped whole); output piped."""
    try:
        return subprocess.Popen(
            argv,
            cwd=spec.cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as exc:
        raise LaunchError(
            f"--launch {spec.command!r} could not start in {spec.cwd}: {exc.strerror or exc}"
        ) from None


def _collect(
    process: subprocess.Popen[bytes], output: collections.deque[str], echo: _Echo | None
) -> None:
    """Keep the server's last lines (its output is read so it never blocks on a full pipe),
    and hand each to ``echo``; runs on its own thread until the pipe closes."""
    assert process.stdout is not None
    with contextlib.suppress(OSError, ValueError), process.stdout:
        for line in process.stdout:
            text = line.decode("utf-8", "replace").rstrip("\r\n")[:500]
            output.append(text)
            if echo is not None:
                echo.put(text)


#: Names of the server's environment variables whose values are not echoed.
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)
#: Control characters (escapes, carriage returns) that would redraw the terminal.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def _secret_values(env: Mapping[str, str]) -> tuple[str, ...]:
    """The values of the server's key-like variables (``OPENAI_API_KEY``...), scrubbed from
    the lines echoed: a server that prints its settings does not put them in a CI log."""
    return tuple(v for k, v in env.items() if _SECRET_NAME.search(k) and len(v) >= 8)


class _Echo:
    """The server's lines written to stderr on a thread of their own, through a bounded
    backlog: a stderr that blocks (a pipe nobody reads) drops lines, and never stops the
    reader draining the server's output (which would block the server on a full pipe)."""

    def __init__(self, secrets: tuple[str, ...]) -> None:
        self._lines: queue.Queue[str | None] = queue.Queue(maxsize=ECHO_BACKLOG)
        self._secrets = secrets
        self._dropped = 0
        self._closing = False
        self._thread = threading.Thread(target=self._write, name="osmosis-launch-echo")
        self._thread.daemon = True
        self._thread.start()

    def put(self, line: str) -> None:
        try:
            self._lines.put_nowait(line)
        except queue.Full:
            self._dropped += 1

    def close(self) -> None:
        """Let the lines already read reach stderr (for a moment at most), then stop; a
        stderr still blocked gets the rest when it frees, and then the thread ends."""
        self._closing = True
        with contextlib.suppress(queue.Full):
            self._lines.put_nowait(None)
        self._thread.join(timeout=1)

    def _write(self) -> None:
        from ..redaction import scrub

        while True:
            try:
                line = self._lines.get(timeout=0.5)
            except queue.Empty:
                if self._closing:
                    return
                continue
            if line is None:
                return
            if self._dropped:
                dropped, self._dropped = self._dropped, 0
                line = f"({dropped} lines not shown: stderr was too slow)\n{ECHO_PREFIX}{line}"
            for secret in self._secrets:
                line = scrub(line, secret)
            # sys.stderr as it is now: a progress bar on the terminal redirects it above itself.
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.write(f"{ECHO_PREFIX}{_CONTROL.sub('?', line)}\n")
                if self._lines.empty():  # a burst is flushed once, at its end
                    sys.stderr.flush()


#: A server's line saying where it listens ("Uvicorn running on http://127.0.0.1:9000").
_LISTENING = re.compile(
    r"\b(?:running|listening|serving)\s+(?:on|at)\s+(?:https?://)?[\w.\[\]:-]*?:(\d{1,5})\b",
    re.IGNORECASE,
)
#: How long a server that said it listens on another port gets before that is the error.
ELSEWHERE_GRACE_S = 5.0


def listening_elsewhere(server: LaunchedServer) -> str | None:
    """The line in which the server says it listens on a port other than the one it was
    given, if it printed one (a ``--port`` in the command, or a main that ignores
    ``_OSMOSIS_ROLLOUT_PORT``)."""
    for line in server.output:
        found = _LISTENING.search(line)
        if found is not None and int(found.group(1)) != server.port:
            return line.strip()
    return None


#: A Python server's last words when its environment lacks a dependency.
_MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '([^']+)'")


def missing_module_hint(server: LaunchedServer, spec: LaunchSpec) -> str:
    """For a server that died of a ``ModuleNotFoundError``: which Python ran it, and how to run
    it in the rollout's own environment instead (a workspace's rollout is often started with
    a Python that lacks its SDK); ``""`` otherwise."""
    module = None
    for line in reversed(server.output):
        found = _MISSING_MODULE.search(line)
        if found is not None:
            module = found.group(1)
            break
    if module is None:
        return ""
    argv = split_command(spec.command)
    program = shutil.which(argv[0], path=os.environ.get("PATH")) or argv[0]
    if not Path(argv[0]).name.startswith("python"):
        ran = f"the command {program!r}"
        script = "main.py"
    else:
        ran = f"the Python {program}"
        script = shlex.join(argv[1:]) or "main.py"
    hint = (
        f"\nHint: {ran} has no module {module!r}: run the server in the rollout's own "
        f'environment, e.g. --launch "<its venv>/bin/python {script}" or --launch '
        f'"uv run python {script}"'
    )
    return hint + (f"; {spec.environment_hint}" if spec.environment_hint else "")


async def _wait_ready(server: LaunchedServer, spec: LaunchSpec) -> None:
    """Until ``GET /health`` answers 2xx; a ``LaunchError`` if the server exits, says it
    listens on another port, or the time runs out."""
    deadline = time.monotonic() + spec.startup_timeout_s
    elsewhere_since: float | None = None
    async with httpx2.AsyncClient(timeout=2.0) as http:
        while True:
            code = server.process.poll()
            if code is not None:
                await anyio.sleep(0.2)  # its last words reach the reader
                raise LaunchError(
                    f"the server started by --launch {spec.command!r} exited with code "
                    f"{code} before it answered /health; its last lines:\n"
                    f"{server.last_lines()}" + missing_module_hint(server, spec)
                )
            with contextlib.suppress(httpx2.HTTPError):
                reply = await http.get(f"{server.url}/health")
                if 200 <= reply.status_code < 300:
                    return
            said = listening_elsewhere(server)
            if said is not None:
                elsewhere_since = elsewhere_since or time.monotonic()
                if time.monotonic() - elsewhere_since > ELSEWHERE_GRACE_S:
                    raise LaunchError(
                        f"the server started by --launch {spec.command!r} listens on another "
                        f"port than the {server.port} it was given in _OSMOSIS_ROLLOUT_PORT: "
                        f"{said!r}. Drop a fixed port from the command (a --port flag wins "
                        "over the variable), or have the server read _OSMOSIS_ROLLOUT_PORT"
                    )
            if time.monotonic() > deadline:
                raise LaunchError(
                    f"the server started by --launch {spec.command!r} did not answer "
                    f"GET {server.url}/health within {spec.startup_timeout_s:g} s (does it "
                    "read _OSMOSIS_ROLLOUT_PORT?); its last lines:\n"
                    f"{server.last_lines()}"
                )
            await anyio.sleep(0.1)


async def stop(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM to the server's process group, SIGKILL after ``timeout_s``; returns once it is
    reaped, and whatever it started is gone too. Safe to call twice."""
    if process.poll() is None:
        _signal_group(process, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            await anyio.to_thread.run_sync(functools.partial(process.wait, timeout_s))
    _signal_group(process, signal.SIGKILL)  # the leader if still there, and what it left
    if process.poll() is None:
        await anyio.to_thread.run_sync(process.wait)


def _signal_group(process: subprocess.Popen[bytes], which: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, which)
