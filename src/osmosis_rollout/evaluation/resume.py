"""``osmosis test --resume``: run only the rows (and samples) a results file does not hold yet.

Every results file's summary records the run's *fingerprint*: a digest of the agent's source
file, of the dataset rows it ran (after ``--offset``/``--limit``) and of the options that shape
a result (the model, seed, samples, mock policy, turns...). A resumed run refuses a file whose
fingerprint differs, naming what changed: its rows would not be the rows this run would make.
The rows kept are read back as :class:`~.runner.RowResult`, so the new file (kept rows and new
ones in dataset order, then the summary over all) reads as one uninterrupted run's.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..testing.records import Finding

if TYPE_CHECKING:
    from .options import TestOptions
    from .runner import RowInput, RowResult

__all__ = ["fingerprint", "read_previous"]

#: The options that change what a row's result is (timeouts and concurrency do not).
_SHAPING = (
    "llm", "llm_url", "model", "seed", "samples", "mock_policy", "mock_replies", "max_turns",
    "temperature", "max_tokens", "fail_on", "tool_error_share", "pass_threshold", "by", "offset",
    "limit", "skip_bad_rows", "replay", "server", "launch",
)  # fmt: skip


#: A launched server's code is the source files under the folder it runs in, as far as this:
#: a folder past it (a checkout with its data) is fingerprinted by its file names and sizes.
_MAX_SOURCE_FILES = 2_000
_MAX_SOURCE_BYTES = 32 * 1024 * 1024
_SOURCE_SUFFIXES = frozenset(
    {".py", ".toml", ".cfg", ".ini", ".yaml", ".yml", ".json", ".js", ".ts", ".go", ".rs",
     ".java", ".rb", ".sh", ".txt", ".md"}
)  # fmt: skip
_SKIPPED_DIRS = frozenset({"__pycache__", "node_modules", "site-packages", "dist", "build"})


def fingerprint(options: TestOptions, agent: Any, rows: list[RowInput]) -> dict[str, Any]:
    """Digests of the agent's code (a launched server's: its folder's source files), the rows
    and the shaping options, each apart so a refusal can say which one changed, and each
    option's own (``options_each``) so it can name the option."""
    code = b""
    if agent is not None:
        try:
            source = inspect.getsourcefile(type(agent))
            code = Path(source).read_bytes() if source else b""
        except (OSError, TypeError):
            code = type(agent).__qualname__.encode()
    elif options.launch is not None:
        code = launched_code(options.launch)
    data = [[r.index, r.messages, r.metadata, r.replies] for r in rows]
    shaping = {name: getattr(options, name) for name in _SHAPING}
    if options.launch is not None:
        shaping["server"] = None  # a launched server's URL is a new free port each run
        shaping["launch"] = _launch_command(options.launch)
    return {
        "agent": _digest(code),
        "launched": agent is None and options.launch is not None,
        "rows": _digest(json.dumps(data, sort_keys=True, default=str).encode()),
        "options": _digest(json.dumps(shaping, sort_keys=True, default=str).encode()),
        "options_each": {
            name: _digest(json.dumps(value, sort_keys=True, default=str).encode())
            for name, value in shaping.items()
        },
    }


def _launch_command(launch: Any) -> list[str]:
    """``--launch``'s command as its words (so the folder it runs in does not count twice)."""
    import shlex

    command = getattr(launch, "command", launch)
    try:
        return shlex.split(str(command))
    except ValueError:
        return [str(command)]


def launched_code(launch: Any) -> bytes:
    """What stands for a launched server's code: each source file under the folder it is
    started in (its path and bytes), skipping virtual environments, hidden and build folders;
    past the bounds, the files' names and sizes only. Any language: the suffixes are a list."""
    root = Path(getattr(launch, "cwd", None) or Path.cwd())
    found: list[Path] = []
    stack = [root]
    while stack and len(found) <= _MAX_SOURCE_FILES:
        folder = stack.pop()
        try:
            entries = sorted(folder.iterdir())
        except OSError:
            continue
        if folder != root and (folder / "pyvenv.cfg").exists():
            continue  # a virtual environment: installed packages, not the server's code
        for entry in entries:
            if entry.name.startswith(".") or entry.name in _SKIPPED_DIRS:
                continue
            if entry.is_dir() and not entry.is_symlink():
                stack.append(entry)
            elif entry.suffix in _SOURCE_SUFFIXES and entry.is_file():
                found.append(entry)
    digest = hashlib.sha256()
    total = 0
    whole = len(found) <= _MAX_SOURCE_FILES
    for path in sorted(found)[:_MAX_SOURCE_FILES]:
        try:
            size = path.stat().st_size
            digest.update(f"{path.relative_to(root)}\0{size}\0".encode())
            total += size
            if whole and total <= _MAX_SOURCE_BYTES:
                digest.update(path.read_bytes())
        except OSError:
            continue
    return digest.digest()


def read_previous(path: Path, expected: dict[str, str]) -> list[RowResult]:
    """The rows of ``path`` to keep (every one that ran), after checking its fingerprint."""
    if not path.exists():
        return []  # nothing to resume: the run starts from the first row
    try:
        lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--resume cannot read {path}: {exc}") from None
    summary = next((line for line in reversed(lines) if line.get("type") == "summary"), None)
    if summary is None or "fingerprint" not in summary:
        raise ConfigError(
            f"--resume: {path} has no closing summary with the run's fingerprint (was the run "
            "killed rather than interrupted?): its rows cannot be checked, so rerun without "
            "--resume"
        )
    recorded = summary["fingerprint"]
    changed = [
        part
        for part in ("agent", "rows", "options")
        if part in expected and recorded.get(part) != expected[part]
    ]
    if changed:
        what = {
            "agent": "the server's code (the source files where --launch runs it)"
            if expected.get("launched")
            else "the agent's code",
            "rows": "the dataset rows",
            "options": "the run's options" + _options_named(recorded, expected),
        }
        named = " and ".join(what[part] for part in changed)
        raise ConfigError(
            f"--resume: {named} differ from those {path} was made with; rerun without --resume "
            "(or with the same code, rows and options)"
        )
    kept = [row_from_dict(line) for line in lines if line.get("type") == "row" and _ran(line)]
    for row in kept:  # trace paths are written relative to the file
        if row.trace is not None and not Path(row.trace).is_absolute():
            row.trace = str(path.resolve().parent / row.trace)
    return kept


def _options_named(recorded: dict[str, Any], expected: dict[str, Any]) -> str:
    """`` (--seed, --launch)``: the options that differ, where the file names each (files
    written before ``options_each`` say only that some option differs)."""
    before, now = recorded.get("options_each"), expected.get("options_each")
    if not isinstance(before, dict) or not isinstance(now, dict):
        return ""
    differ = [name for name in now if before.get(name) != now[name]]
    return f" ({', '.join('--' + name.replace('_', '-') for name in differ)})" if differ else ""


def recorded_rows(cassette: Path, rows: set[int]) -> list[str]:
    """With ``--record``: the lines of ``cassette`` (an interrupted recording of this run) that
    hold ``rows``, the rows a resumed run keeps, so its cassette holds every row too."""
    try:
        lines = cassette.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    kept = []
    for line in lines:
        try:
            data = json.loads(line)
        except ValueError:
            continue  # a line cut by the interrupt
        if isinstance(data, dict) and "turns" in data and data.get("row") in rows:
            kept.append(line)
    return kept


def _ran(line: dict[str, Any]) -> bool:
    """A row that ran to an end of its own: not one skipped, nor one cut by the interrupt."""
    return line.get("status") != "SKIPPED"


def row_from_dict(line: dict[str, Any]) -> RowResult:
    """A results file's row as the :class:`~.runner.RowResult` that wrote it."""
    from .runner import RowResult

    return RowResult(
        index=line["row"],
        rollout_id=line["rollout_id"],
        status=line["status"],
        finish_reason=line.get("finish_reason"),
        error_message=line.get("error_message"),
        reward=line.get("reward"),
        turns=line.get("turns", 0),
        tool_calls=line.get("tool_calls", 0),
        prompt_tokens=line.get("prompt_tokens", 0),
        response_tokens=line.get("response_tokens", 0),
        latency_ms=line.get("latency_ms", 0.0),
        llm_ms=line.get("llm_ms", 0.0),
        tool_ms=line.get("tool_ms", 0.0),
        findings=[
            Finding(f["code"], f["message"], f.get("rollout_id"), f.get("turn"), f.get("details"))
            for f in line.get("findings", [])
        ],
        final_messages=line.get("final_messages", []),
        metrics=line.get("metrics", {}),
        turn_finish_reasons=line.get("turn_finish_reasons", []),
        metadata=line.get("metadata", {}),
        trace=line.get("trace"),
        extra_fields=line.get("extra_fields", {}),
        sample=line.get("sample", 0),
        tool_counts=line.get("tool_counts", {}),
        tool_calls_from_history=line.get("tool_calls_from_history", 0),
    )


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]
