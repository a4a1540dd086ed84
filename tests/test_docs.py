"""Every fenced code block in README.md and docs/*.md is run or checked, so the docs cannot rot.

A page's blocks run in order, in a fresh sandbox folder (the page's "project"), with the
installed ``osmosis``/``python`` first on PATH, HOME inside the sandbox, no ``OSMOSIS_*`` or
``OPENAI_API_KEY`` from the caller, ``COLUMNS=100`` and ``NO_COLOR=1``. The sandbox starts with:

- ``examples/`` (a copy of this repository's), so ``examples/calculator/agent.py:CalculatorAgent``
  works;
- ``agent.py`` defining ``MyAgent`` (one ``add`` tool) and ``rows.jsonl`` (three rows), the names
  the docs use for "your agent" and "your dataset" (tests/assets/docs_sandbox/).

What happens to a block depends on its language and on an optional marker, an HTML comment on the
line before the fence (blank lines between are allowed): ``<!-- docs-test: MODE ARGS -->``.

| language | default | what the default does |
|---|---|---|
| ``python`` | ``run`` | executed as a script in the sandbox; top-level ``await`` is allowed |
| ``bash``, ``sh``, ``shell`` | ``run`` | run with ``bash -euo pipefail``; must exit 0 |
| ``console`` | ``output`` | each ``$ command`` is run; its output must match the lines below it |
| ``json``, ``toml`` | ``parse`` | must parse |
| anything else, or none | none | the block must carry a marker |

Modes a marker may give:

- ``run [exit=N]``: run it (``exit=N``: the exit status the block must end with; bash only).
- ``file PATH``: write the block to ``PATH`` in the sandbox for later blocks. A ``test_*.py`` file
  is then run with pytest; another ``.py`` file is imported as a module.
- ``background [port=N]``: a bash block that serves (``osmosis serve ...``) runs in the
  background until the page ends; the test waits until it listens on port N (default 9000). A
  ``console`` block with one ``$ command`` works the same, and what the command printed by the
  end of the page (after SIGTERM) must match the lines under it.
- ``output [loose] [stdin="..."]``: ``stdin`` is what the console's commands read, as a user
  would type it (``osmosis test -i``; Python string escapes). ``loose`` compares output whose
  values are random (the mock model's arguments, ids, token counts): every number and hex id
  counts as ``#`` and runs of spaces or of rule characters as one. ``$ cd DIR`` in a console
  block moves the page's working folder for the blocks after it.
- ``synopsis``: a usage summary with ``[optional]`` parts: every ``--option`` of each ``osmosis
  COMMAND`` line must be an option of that command.
- ``transcript``: output, a session or input shown for reading, not run. Prefer an ``output``
  console block where the session can be run.
- ``skip REASON``: not run; the reason is required (e.g. it needs a GPU or runs this suite).
- ``needs PROGRAM`` (a marker of its own, beside the mode's): the block runs a program besides
  Python (``redis-server``, ``curl``). Where it is not on PATH the block is left out and the
  page's test skips, naming it (tests/programs.py; CI's ``TESTS_REQUIRE_PROGRAMS=1`` fails it).

Rules for running: the literal ports ``9000`` (the serve default) to ``9009`` are each replaced by
a free port in every command run and replaced back in the output (``OSMOSIS_PORT`` is set to the
one for 9000).
``pip install`` is never executed (the tests run in an installed venv): the shim checks that each
requirement is this project (``.``, ``osmosis-rollout``) with extras that exist. Console output is
compared line by line after stripping trailing spaces and replacing every duration (``17 ms``,
``5.68 s``) with ``<time>``; in the expected output a line ``...`` stands for any lines and
``...`` inside a line for any text.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .processes import stop_process
from .programs import missing_reason, skip_or_fail
from .support import free_port

ROOT = Path(__file__).resolve().parents[1]
SANDBOX_FILES = Path(__file__).parent / "assets" / "docs_sandbox"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK_TIMEOUT_S = 120.0
SERVER_START_TIMEOUT_S = 60.0

MODES = {"run", "file", "background", "synopsis", "transcript", "skip", "output", "parse"}
DEFAULT_MODE = {
    "python": "run",
    "bash": "run",
    "sh": "run",
    "shell": "run",
    "console": "output",
    "json": "parse",
    "toml": "parse",
}
ALLOWED = {
    "run": {"python", "bash", "sh", "shell"},
    "background": {"bash", "sh", "shell", "console"},
    "output": {"console"},
    "parse": {"json", "toml"},
}

_MARKER = re.compile(r"^<!--\s*docs-test:\s*(?P<mode>[a-z-]+)\s*(?P<args>.*?)\s*-->$")
_TIME = re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s?(?:ms|s)\b")
_DEFINES_TESTS = re.compile(r"^(?:async\s+)?def\s+test_", re.MULTILINE)
_HEX_OR_NUMBER = re.compile(
    r"(?<![\w.])-?(?:\d+(?:\.\d+)?(?:e-?\d+)?|[0-9a-f]*\d[0-9a-f]*)(?!\w|\.\d)"
)
_OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")


@dataclass(frozen=True)
class Block:
    """One fenced block of a page, with the mode that decides what the test does with it."""

    page: Path
    line: int
    lang: str
    text: str
    mode: str
    args: str
    #: Programs the block runs besides Python (``needs PROGRAM`` markers): without one it skips.
    needs: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        return f"{_name(self.page)}:{self.line} ({self.lang or 'no language'})"


class DocsError(AssertionError):
    """A block that failed, naming the page and line of its fence."""


def parse_blocks(page: Path, text: str | None = None) -> list[Block]:
    """The page's fenced blocks; a block without a usable mode raises DocsError."""
    lines = (page.read_text(encoding="utf-8") if text is None else text).splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("```"):
            i += 1
            continue
        fence = line[: len(line) - len(line.lstrip("`"))]
        lang = line[len(fence) :].strip().split(" ")[0].lower()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].rstrip() != fence:
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise DocsError(f"{_name(page)}:{start + 1}: the code block is never closed")
        i += 1
        where = f"{_name(page)}:{start + 1}"
        mode, args, needs = _markers_before(lines, start, where)
        if mode is None:
            mode = DEFAULT_MODE.get(lang)
            if mode is None:
                raise DocsError(
                    f"{where}: a ```{lang} block is neither run nor marked; put "
                    "<!-- docs-test: transcript --> (or synopsis, file PATH, skip REASON) "
                    "on the line before it"
                )
        if mode not in MODES:
            raise DocsError(f"{where}: unknown docs-test mode {mode!r}; one of {sorted(MODES)}")
        if mode in ALLOWED and lang not in ALLOWED[mode]:
            raise DocsError(f"{where}: mode {mode!r} does not apply to a ```{lang} block")
        if mode in {"skip", "file"} and not args:
            raise DocsError(f"{where}: docs-test: {mode} needs an argument (a reason, a path)")
        text = "\n".join(body) + "\n"
        blocks.append(Block(page, start + 1, lang, text, mode, args, needs))
    return blocks


_OPTIONS = re.compile(
    r'\s*(?:(?P<flag>loose)|port=(?P<port>900\d)|stdin=(?P<stdin>"(?:[^"\\]|\\.)*"))'
)


@dataclass(frozen=True)
class Options:
    """The arguments of an ``output`` or ``background`` marker."""

    loose: bool = False
    port: int = 9000
    stdin: str | None = None


def parse_options(block: Block) -> Options:
    """``loose``, ``port=900N`` and ``stdin="..."`` (Python string escapes), in any order."""
    found: dict[str, object] = {}
    rest = block.args
    while rest.strip():
        match = _OPTIONS.match(rest)
        if match is None:
            raise DocsError(
                f'{block.where}: {block.mode} takes loose, port=900N, stdin="...", not {rest!r}'
            )
        if match["flag"]:
            found["loose"] = True
        elif match["port"]:
            found["port"] = int(match["port"])
        else:
            found["stdin"] = str(ast.literal_eval(match["stdin"]))
        rest = rest[match.end() :]
    return Options(**found)  # type: ignore[arg-type]


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else page.name


def _markers_before(
    lines: list[str], fence_index: int, where: str
) -> tuple[str | None, str, tuple[str, ...]]:
    """The mode marker (with its arguments) and the ``needs PROGRAM`` markers on the lines just
    above the fence (blank lines between are allowed), in any order."""
    mode: str | None = None
    args = ""
    needs: list[str] = []
    j = fence_index - 1
    while j >= 0:
        line = lines[j].strip()
        j -= 1
        if not line:
            continue
        match = _MARKER.match(line)
        if match is None:
            break
        if match["mode"] == "needs":
            if not re.fullmatch(r"[\w.+-]+", match["args"]):
                raise DocsError(
                    f"{where}: docs-test: needs takes one program name, like redis-server"
                )
            needs.insert(0, match["args"])
        elif mode is None:
            mode, args = match["mode"], match["args"]
        else:
            raise DocsError(f"{where}: two docs-test modes before one block")
    return mode, args, tuple(needs)


# --- console output ------------------------------------------------------------------------------


def normalize(text: str, *, loose: bool = False) -> list[str]:
    """Lines without trailing spaces, durations replaced by ``<time>``, no trailing blank lines.

    ``loose`` also replaces every number and hex id by ``#`` and collapses runs of spaces and of
    rule characters, for output whose values are random but whose shape and words are not.
    """
    lines = [_TIME.sub("<time>", line).rstrip() for line in text.splitlines()]
    if loose:
        lines = [_loosen(line) for line in lines]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _loosen(line: str) -> str:
    line = _HEX_OR_NUMBER.sub("#", line)
    line = re.sub(r"#(?:[^\w\s]*#)+", "#", line)  # 276/163, 1.5e-3, -38.28: one value
    line = re.sub(r"([─━])\1+", r"\1", line)
    return re.sub(r" {2,}", " ", line)


def output_matches(expected: str, actual: str, *, loose: bool = False) -> bool:
    """``actual`` matches ``expected``, where a ``...`` line is any lines, ``...`` any text."""
    parts: list[str] = []
    for line in normalize(expected, loose=loose):
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            pieces = [re.escape(piece) for piece in line.split("...")]
            parts.append("[^\n]*".join(pieces) + r"\n")
    pattern = "".join(parts)
    subject = "".join(f"{line}\n" for line in normalize(actual, loose=loose))
    return re.fullmatch(pattern, subject) is not None


def _continues(command: str) -> bool:
    """A command goes on to the next line after a trailing ``\\`` or inside an open quote."""
    if command.rstrip().endswith("\\"):
        return True
    try:
        shlex.split(command, comments=True)
    except ValueError:  # "No closing quotation"
        return True
    return False


def console_steps(text: str) -> list[tuple[str, str]]:
    """(command, expected output) pairs of a console block: ``$ `` lines, continued by a
    trailing ``\\`` or an open quote."""
    steps: list[tuple[str, list[str]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ "):
            command = [line[2:]]
            while _continues("\n".join(command)) and i + 1 < len(lines):
                i += 1
                command.append(lines[i])
            steps.append(("\n".join(command), []))
        elif steps:
            steps[-1][1].append(line)
        else:
            raise DocsError(f"console text before the first `$ ` command: {line!r}")
        i += 1
    return [(command, "\n".join(output)) for command, output in steps]


# --- synopsis ------------------------------------------------------------------------------------


def command_options() -> dict[str, set[str]]:
    """Every ``osmosis`` subcommand and the options it accepts (from the Click tree)."""
    import typer.main

    from osmosis_rollout.cli import app

    group = typer.main.get_command(app)  # typer vendors its own click: no isinstance check
    root = {opt for param in group.params for opt in (*param.opts, *param.secondary_opts)}
    result = {"": root | {"--help"}}
    for name, command in group.commands.items():
        # A group (`osmosis skills`, `osmosis outbox`): the options of any of its commands.
        commands = [command, *getattr(command, "commands", {}).values()]
        opts = {
            opt
            for each in commands
            for param in each.params
            for opt in (*param.opts, *param.secondary_opts)
        }
        result[name] = opts | {"--help"}
    return result


def check_synopsis(block: Block) -> None:
    """Each ``osmosis COMMAND`` line names an existing command and only its options."""
    known = command_options()
    command: str | None = None
    for raw in block.text.splitlines():
        line = raw.split(" #", 1)[0].removeprefix("$ ")
        words = line.split()
        if words[:1] == ["osmosis"]:
            command = words[1] if len(words) > 1 and not words[1].startswith("-") else ""
            if command not in known:
                raise DocsError(f"{block.where}: `osmosis {command}` is not a command")
        elif not raw[:1].isspace() or command is None:
            command = None
            continue
        for option in _OPTION.findall(line):
            if option not in known[command]:
                raise DocsError(
                    f"{block.where}: `osmosis {command}` has no option {option}; "
                    f"it has {', '.join(sorted(known[command]))}"
                )


# --- pip: checked, never run ---------------------------------------------------------------------

PIP_SHIM = r"""
import sys, tomllib
from pathlib import Path

root, args = Path(sys.argv[1]), sys.argv[2:]
project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
extras = set(project["optional-dependencies"])
if args[:1] != ["install"]:
    sys.exit(f"docs-test: only `pip install` is allowed in docs, not {args}")
for arg in args[1:]:
    if arg.startswith("-"):
        continue
    name, _, rest = arg.partition("[")
    if name not in {".", "osmosis-rollout"}:
        sys.exit(f"docs-test: pip would install {arg!r}, not this project")
    wanted = {e.strip() for e in rest.rstrip("]").split(",") if e.strip()}
    if wanted - extras:
        missing, known = sorted(wanted - extras), sorted(extras)
        sys.exit(f"docs-test: no extra {missing} in pyproject.toml (it has {known})")
"""

PYTHON_RUNNER = r"""
import ast, asyncio, sys
path = sys.argv[1]
code = compile(open(path, encoding="utf-8").read(), path, "exec",
               flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
namespace = {"__name__": "__main__", "__file__": path}
result = eval(code, namespace)
if asyncio.iscoroutine(result):
    asyncio.run(result)
"""


# --- the sandbox ---------------------------------------------------------------------------------


class Sandbox:
    """A page's project folder, its environment, its port and its background servers."""

    def __init__(self, base: Path) -> None:
        self.dir = base / "project"
        self.tools = base / "tools"
        self.dir.mkdir()
        self.tools.mkdir()
        shutil.copytree(ROOT / "examples", self.dir / "examples")
        for item in SANDBOX_FILES.iterdir():
            if item.is_file():
                shutil.copy(item, self.dir / item.name)
        (self.tools / "pip_shim.py").write_text(PIP_SHIM, encoding="utf-8")
        (base / "home").mkdir()
        self.ports: dict[int, int] = {}
        while len(set(self.ports.values())) < 10:  # the docs' 9000-9009, each a free port
            self.ports = {9000 + i: free_port() for i in range(10)}
        self.port = self.ports[9000]
        self.env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("OSMOSIS_", "PYTEST_", "COV_")) and key != "OPENAI_API_KEY"
        }
        bin_dir = str(Path(sys.executable).parent)
        self.env.update(
            PATH=f"{bin_dir}{os.pathsep}{self.env.get('PATH', '')}",
            HOME=str(base / "home"),
            COLUMNS="100",
            NO_COLOR="1",
            TERM="dumb",
            PYTHONDONTWRITEBYTECODE="1",
            OSMOSIS_PORT=str(self.port),
        )
        self.background: list[tuple[subprocess.Popen[bytes], Path]] = []
        self.cwd = self.dir  # `$ cd DIR` in a console block moves it for the blocks after
        self.expected_logs: list[tuple[Block, str, Path, bool]] = []
        self.counter = 0

    def bash_script(self, text: str) -> str:
        prelude = (
            f"pip() {{ {shlex.quote(sys.executable)} {shlex.quote(str(self.tools / 'pip_shim.py'))}"
            f' {shlex.quote(str(ROOT))} "$@"; }}\n'
        )
        return prelude + re.sub(r"\b900\d\b", lambda m: str(self.ports[int(m[0])]), text)

    def docs_ports(self, output: str) -> str:
        """``output`` with the real ports written back as the page's 9000-9009."""
        for shown, real in self.ports.items():
            output = re.sub(rf"\b{real}\b", str(shown), output)
        return output

    def shell(
        self, text: str, *, timeout: float = BLOCK_TIMEOUT_S, stdin: str | None = None
    ) -> tuple[int, str]:
        """Run bash text in the sandbox: (exit status, stdout and stderr together)."""
        try:
            proc = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", self.bash_script(text)],
                cwd=self.cwd,
                env=self.env,
                input=(stdin or "").encode(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise DocsError(f"timed out after {timeout:.0f} s:\n{text}") from exc
        output = self.docs_ports(proc.stdout.decode("utf-8", "replace"))
        return proc.returncode, output

    def run_block(self, block: Block) -> None:
        handler = getattr(self, f"_mode_{block.mode}")
        handler(block)

    def _mode_transcript(self, block: Block) -> None:
        return None

    def _mode_skip(self, block: Block) -> None:
        return None

    def _mode_synopsis(self, block: Block) -> None:
        check_synopsis(block)

    def _mode_parse(self, block: Block) -> None:
        try:
            if block.lang == "json":
                json.loads(block.text)
            else:
                tomllib.loads(block.text)
        except ValueError as exc:
            raise DocsError(f"{block.where}: does not parse: {exc}") from exc

    def _mode_run(self, block: Block) -> None:
        want = 0
        if block.args:
            match = re.fullmatch(r"exit=(\d+)", block.args)
            if match is None:
                raise DocsError(f"{block.where}: run takes `exit=N`, not {block.args!r}")
            want = int(match[1])
        if block.lang == "python":
            if _DEFINES_TESTS.search(block.text):
                raise DocsError(
                    f"{block.where}: the block defines tests, which running it as a script would "
                    "never call; mark it <!-- docs-test: file test_NAME.py --> so pytest runs them"
                )
            self.counter += 1
            script = self.tools / f"block_{self.counter}.py"
            script.write_text(block.text, encoding="utf-8")
            code = f"python -c {shlex.quote(PYTHON_RUNNER)} {shlex.quote(str(script))}"
            status, output = self.shell(code)
        else:
            status, output = self.shell(block.text)
        if status != want:
            raise DocsError(
                f"{block.where}: exited {status}, expected {want}:\n{block.text}\n{output}"
            )

    def _mode_file(self, block: Block) -> None:
        path = self.dir / block.args
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(block.text, encoding="utf-8")
        if path.suffix != ".py":
            return
        relative = path.relative_to(self.dir)
        if path.name.startswith("test_"):
            command = f"python -m pytest -q -p no:cacheprovider {shlex.quote(str(relative))}"
        else:
            module = ".".join(relative.with_suffix("").parts)
            command = f"python -c {shlex.quote(f'import {module}')}"
        status, output = self.shell(command)
        if status != 0:
            raise DocsError(f"{block.where}: `{command}` exited {status}:\n{output}")

    def _mode_output(self, block: Block) -> None:
        options = parse_options(block)
        try:
            steps = console_steps(block.text)
        except DocsError as exc:
            raise DocsError(f"{block.where}: {exc}") from None
        for command, expected in steps:
            words = command.split()
            if words[:1] == ["cd"] and len(words) == 2 and not expected:
                self.cwd = (self.cwd / words[1]).resolve()
                continue
            _, actual = self.shell(command, stdin=options.stdin)
            if not output_matches(expected, actual, loose=options.loose):
                raise DocsError(
                    f"{block.where}: the output of `{command}` differs from the page.\n"
                    f"--- the page shows:\n{expected}\n--- the command printed:\n{actual}"
                )

    def _mode_background(self, block: Block) -> None:
        options = parse_options(block)
        shown = options.port
        port = self.ports[shown]
        log = self.tools / f"background_{len(self.background)}.log"
        command = block.text
        if block.lang == "console":  # one `$ command`; its output is compared when the page ends
            steps = console_steps(block.text)
            if len(steps) != 1:
                raise DocsError(f"{block.where}: a background console block has one command")
            command, expected = steps[0]
            self.expected_logs.append((block, expected, log, options.loose))
        with log.open("wb") as sink:
            proc = subprocess.Popen(
                ["bash", "-euo", "pipefail", "-c", self.bash_script(command)],
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.background.append((proc, log))
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise DocsError(
                    f"{block.where}: exited {proc.returncode} before listening:\n"
                    f"{log.read_text(errors='replace')}"
                )
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", port), timeout=1),
            ):
                return
            time.sleep(0.1)
        raise DocsError(f"{block.where}: not listening on port {shown} after 60 s")

    def close(self) -> None:
        """Stop every background process (SIGTERM, then SIGKILL)."""
        for proc, _ in self.background:
            stop_process(proc)

    def finish(self) -> None:
        """End the page: stop the servers, then compare what background consoles printed."""
        self.close()
        for block, expected, log, loose in self.expected_logs:
            actual = self.docs_ports(log.read_text(errors="replace"))
            if not output_matches(expected, actual, loose=loose):
                raise DocsError(
                    f"{block.where}: the server's output differs from the page.\n"
                    f"--- the page shows:\n{expected}\n--- the command printed:\n{actual}"
                )


@contextlib.contextmanager
def sandbox(base: Path) -> Iterator[Sandbox]:
    box = Sandbox(base)
    try:
        yield box
    finally:
        box.close()


# --- the tests -----------------------------------------------------------------------------------


def run_page(blocks: list[Block], base: Path) -> None:
    """Run a page's blocks in a sandbox under ``base``. A block that needs a program this
    machine lacks is left out, and the page then skips naming the program, its blocks and how
    to install it (it fails instead where CI sets ``TESTS_REQUIRE_PROGRAMS=1``)."""
    left_out: dict[str, list[int]] = {}
    with sandbox(base) as box:
        for block in blocks:
            missing = [program for program in block.needs if shutil.which(program) is None]
            if missing:
                left_out.setdefault(missing[0], []).append(block.line)
                continue
            box.run_block(block)
        box.finish()
    if left_out:
        page = _name(blocks[0].page)
        reasons = [
            missing_reason(program, what=f"{page}:{', '.join(map(str, lines))}")
            for program, lines in left_out.items()
        ]
        skip_or_fail(f"{'; '.join(reasons)} (the page's other blocks passed)")


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_block_of_the_page_runs(page: Path, tmp_path: Path) -> None:
    """Each block of the page runs (or is checked) as its language and marker say."""
    run_page(parse_blocks(page), tmp_path)


def test_a_block_neither_run_nor_marked_fails() -> None:
    page = ROOT / "docs" / "example.md"
    with pytest.raises(DocsError, match=r"example.md:3: a ```text block is neither run"):
        parse_blocks(page, "Look:\n\n```text\nsome output\n```\n")
    with pytest.raises(DocsError, match="neither run nor marked"):
        parse_blocks(page, "```\nno language\n```\n")
    marked = parse_blocks(page, "<!-- docs-test: transcript -->\n\n```text\nout\n```\n")
    assert [(b.mode, b.line) for b in marked] == [("transcript", 3)]


def test_markers_are_checked() -> None:
    page = ROOT / "docs" / "example.md"
    with pytest.raises(DocsError, match="unknown docs-test mode 'skipp'"):
        parse_blocks(page, "<!-- docs-test: skipp -->\n```bash\nls\n```\n")
    with pytest.raises(DocsError, match="skip needs an argument"):
        parse_blocks(page, "<!-- docs-test: skip -->\n```bash\nls\n```\n")
    with pytest.raises(DocsError, match="'output' does not apply to a ```python block"):
        parse_blocks(page, "<!-- docs-test: output -->\n```python\npass\n```\n")
    with pytest.raises(DocsError, match="never closed"):
        parse_blocks(page, "```python\npass\n")
    blocks = parse_blocks(page, "```python\nx = 1\n```\n\n```console\n$ ls\n```\n")
    assert [(b.lang, b.mode) for b in blocks] == [("python", "run"), ("console", "output")]


def test_console_output_is_compared_with_wildcards_and_times_normalized() -> None:
    page = "took 17 ms\nrollout r-...-1 | ok\n"
    assert output_matches(page, "took 3 ms  \nrollout r-ab-1 | ok\n")
    assert output_matches("first\n...\nlast\n", "first\na\nb\nlast\n")
    assert output_matches("first\n...\nlast\n", "first\nlast\n")
    assert not output_matches("first\nlast\n", "first\nextra\nlast\n")
    assert not output_matches("5 rows\n", "6 rows\n")
    assert console_steps("$ a \\\n   --b\nout\n$ c\n") == [("a \\\n   --b", "out"), ("c", "")]
    assert console_steps("$ a -d '{\n  }'\nout\n") == [("a -d '{\n  }'", "out")]


def test_needs_markers_are_read_with_the_mode() -> None:
    page = ROOT / "docs" / "example.md"
    text = (
        "<!-- docs-test: needs redis-server -->\n<!-- docs-test: background port=9001 -->\n"
        "```bash\nredis-server --port 9001\n```\n\n"
        "<!-- docs-test: needs curl -->\n\n```console\n$ curl -s x\n```\n"
    )
    blocks = parse_blocks(page, text)
    assert [(b.mode, b.args, b.needs) for b in blocks] == [
        ("background", "port=9001", ("redis-server",)),
        ("output", "", ("curl",)),
    ]
    with pytest.raises(DocsError, match="needs takes one program name"):
        parse_blocks(page, "<!-- docs-test: needs -->\n```bash\nls\n```\n")
    with pytest.raises(DocsError, match="two docs-test modes"):
        parse_blocks(
            page, "<!-- docs-test: run -->\n<!-- docs-test: skip x -->\n```bash\nls\n```\n"
        )


NEEDS_PAGE = (
    "```bash\ntouch ran-first\n```\n\n"
    "<!-- docs-test: needs {program} -->\n```bash\nexit 3\n```\n\n"
    "```bash\ntest -e ran-first\n```\n"
)


def test_a_block_whose_program_is_missing_skips_the_page_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's tests pass without redis-server: its blocks are left out, the rest run, and
    the skip says which program, where, and how to install it."""
    monkeypatch.delenv("TESTS_REQUIRE_PROGRAMS", raising=False)
    page = ROOT / "docs" / "example.md"
    blocks = parse_blocks(page, NEEDS_PAGE.format(program="no-such-program-osmosis"))
    with pytest.raises(pytest.skip.Exception) as skipped:
        run_page(blocks, tmp_path)
    assert str(skipped.value) == (
        "no-such-program-osmosis is not installed (needed by docs/example.md:6): install "
        "no-such-program-osmosis; .ci/run installs it (the page's other blocks passed)"
    )


def test_a_block_whose_program_is_present_runs(tmp_path: Path) -> None:
    """A ``needs`` block runs wherever its program is on PATH: never skipped then."""
    page = ROOT / "docs" / "example.md"
    blocks = parse_blocks(page, NEEDS_PAGE.format(program="bash"))
    with pytest.raises(DocsError, match=r"example.md:6 .*exited 3"):
        run_page(blocks, tmp_path)


def test_ci_fails_instead_of_skipping_a_missing_program(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``TESTS_REQUIRE_PROGRAMS=1`` (.ci/run), a missing program is a failure."""
    monkeypatch.setenv("TESTS_REQUIRE_PROGRAMS", "1")
    page = ROOT / "docs" / "example.md"
    blocks = parse_blocks(page, NEEDS_PAGE.format(program="no-such-program-osmosis"))
    with pytest.raises(pytest.fail.Exception, match="TESTS_REQUIRE_PROGRAMS=1"):
        run_page(blocks, tmp_path)


def test_a_failing_block_names_its_page_and_line(tmp_path: Path) -> None:
    page = ROOT / "docs" / "example.md"
    text = "intro\n\n```bash\nosmosis validate missing.py:Nope\n```\n"
    (block,) = parse_blocks(page, text)
    with sandbox(tmp_path) as box, pytest.raises(DocsError, match=r"example.md:3 .*exited 2"):
        box.run_block(block)


def test_synopsis_options_must_exist() -> None:
    page = ROOT / "docs" / "example.md"
    good = "osmosis serve agent.py:A [--port 9000]\n              [--no-validate]\n"
    check_synopsis(parse_blocks(page, f"<!-- docs-test: synopsis -->\n```text\n{good}```\n")[0])
    bad = "osmosis serve agent.py:A [--port 9000]\n              [--colour]\n"
    block = parse_blocks(page, f"<!-- docs-test: synopsis -->\n```text\n{bad}```\n")[0]
    with pytest.raises(DocsError, match="`osmosis serve` has no option --colour"):
        check_synopsis(block)


def test_a_python_block_of_tests_must_be_run_by_pytest(tmp_path: Path) -> None:
    page = ROOT / "docs" / "example.md"
    tests = "```python\nasync def test_x():\n    assert False\n```\n"
    with sandbox(tmp_path) as box, pytest.raises(DocsError, match=r"file test_NAME\.py"):
        box.run_block(parse_blocks(page, tests)[0])
    marked = "<!-- docs-test: file test_x.py -->\n" + tests.replace("async def", "def")
    (tmp_path / "2").mkdir()
    with sandbox(tmp_path / "2") as box, pytest.raises(DocsError, match="1 failed"):
        box.run_block(parse_blocks(page, marked)[0])


def test_pip_in_docs_is_checked_not_run(tmp_path: Path) -> None:
    with sandbox(tmp_path) as box:
        assert box.shell("pip install -e '.[dev]'")[0] == 0
        status, output = box.shell("pip install 'osmosis-rollout[gpu]'")
        assert status != 0
        assert "no extra ['gpu']" in output
