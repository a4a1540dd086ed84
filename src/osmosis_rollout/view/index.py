"""The viewer's index: one small summary per rollout, and where to read the rest on demand.

Opening 10,000 rollouts must not mean parsing 500 MB. A results file is scanned once for line
offsets; each row's summary is parsed from the part of the line before ``final_messages`` (the
results writer puts it last). Traces linked from a results file are not opened at all until a
rollout is shown; a trace with no results row is summarised from its first line and its tail,
unless a results row that names no trace has its rollout id (``osmosis test --server``: the
server wrote the trace), then the two are one rollout.

ATIF trajectories (``trajectory.json``: ours from ``osmosis serve``'s artifact root and
``osmosis test --trajectories``, or any other producer's, such as Harbor's) are read whole, each
at most ``MAX_ATIF_BYTES``: in a folder, its ``*.json`` files, ``*/trajectory.json`` and
``*/agent/trajectory.json`` (Harbor's trial layout); a results row without a trace is joined
with the trajectory of its rollout id.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

from ..atif import is_atif, read_atif
from ..errors import ConfigError
from ..trajectory import Trajectory, read_trace

__all__ = ["RolloutIndex", "RolloutSummary", "build_index"]

_FINAL_KEY = b', "final_messages": '
#: How much of a trace's end is read first to find its ``rollout_end`` (and ``findings``).
_TAIL_BYTES = 8 * 1024
_END_EVENT = b'"event": "rollout_end"'
_ROW_IN_ID = re.compile(r"row-(\d+)-")
_MAX_ERROR_CHARS = 300
#: The largest ATIF file read; a bigger one is skipped with a warning.
MAX_ATIF_BYTES = 64 * 2**20
#: Where ATIF files sit in a folder: at the top, one folder down (an artifact root), or in
#: a Harbor trial's ``agent/`` folder.
_ATIF_PATTERNS = ("*.json", "*/trajectory.json", "*/agent/trajectory.json")


@dataclass
class RolloutSummary:
    """What the table shows for one rollout, plus where its full record lives."""

    id: str
    rollout_id: str | None
    row: int | None
    status: str
    source: str
    reward: float | None = None
    finish_reason: str | None = None
    error_message: str | None = None
    findings: list[str] = field(default_factory=list)
    turns: int = 0
    tool_calls: int = 0
    prompt_tokens: int = 0
    response_tokens: int = 0
    latency_ms: float = 0.0
    #: ``--samples``: which of its row's (its group's) samples; the failed tool calls; the
    #: reward's named parts.
    sample: int | None = None
    tool_errors: int = 0
    reward_components: dict[str, float] = field(default_factory=dict)
    started: float | None = None
    results_path: Path | None = field(default=None, repr=False)
    offset: int | None = field(default=None, repr=False)
    trace_path: str | None = field(default=None, repr=False)  # str: 10,000 Paths are slow
    #: An ATIF trajectory file: the rollout's turns when it has no trace.
    atif_path: str | None = field(default=None, repr=False)

    def public(self) -> dict[str, Any]:
        """The JSON the page gets for the table (no file paths or offsets)."""
        return {
            "id": self.id,
            "rollout_id": self.rollout_id,
            "row": self.row,
            "status": self.status,
            "source": self.source,
            "reward": self.reward,
            "finish_reason": self.finish_reason,
            "error_message": self.error_message,
            "findings": self.findings,
            "turns": self.turns,
            "tool_calls": self.tool_calls,
            "tokens": self.prompt_tokens + self.response_tokens,
            "prompt_tokens": self.prompt_tokens,
            "response_tokens": self.response_tokens,
            "latency_ms": self.latency_ms,
            "sample": self.sample,
            "tool_errors": self.tool_errors,
            "reward_components": self.reward_components,
            "started": self.started,
            "has_trace": self.trace_path is not None or self.atif_path is not None,
        }


@dataclass
class RolloutIndex:
    """Every rollout found under the given paths, in the order found."""

    rollouts: list[RolloutSummary]
    sources: list[str]
    warnings: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._by_id = {r.id: r for r in self.rollouts}

    def get(self, rollout: str) -> RolloutSummary | None:
        """The summary with this index id, if any."""
        return self._by_id.get(rollout)

    def load(self, summary: RolloutSummary) -> dict[str, Any]:
        """The full record of one rollout: its results row and its trajectory (either may be
        missing), read from disk now."""
        row: dict[str, Any] | None = None
        if summary.results_path is not None and summary.offset is not None:
            with summary.results_path.open("rb") as fh:
                fh.seek(summary.offset)
                row = json.loads(fh.readline())
        trajectory: Trajectory | None = None
        trace_error: str | None = None
        if summary.trace_path is not None:
            try:
                trajectory = read_trace(summary.trace_path)
            except OSError as exc:
                name = os.path.basename(summary.trace_path)
                trace_error = f"cannot read {name}: {exc.strerror or exc}"
        elif summary.atif_path is not None:
            document, problem = _read_atif_file(summary.atif_path)
            if document is not None:
                trajectory = read_atif(document)
            else:
                trace_error = problem
        return {
            "summary": summary.public(),
            "row": row,
            "trajectory": trajectory.as_dict() if trajectory is not None else None,
            "messages": trajectory.messages() if trajectory is not None else None,
            "trace_error": trace_error,
        }


def build_index(paths: Iterable[str | Path]) -> RolloutIndex:
    """Index results files, trace files and trace folders. Raises ``ConfigError`` for a path
    that does not exist or is neither."""
    rollouts: list[RolloutSummary] = []
    sources: list[str] = []
    warnings: list[str] = []
    linked: set[str] = set()
    trace_files: list[tuple[str, str]] = []
    atif_files: list[tuple[str, str, bool]] = []  # (path, source, given by name)
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            sources.append(str(path))
            folder = _absolute(str(path))
            names = sorted(e.name for e in os.scandir(path) if e.name.endswith(".jsonl"))
            trace_files.extend((os.path.join(folder, name), str(path)) for name in names)
            for pattern in _ATIF_PATTERNS:
                matches = sorted(str(p) for p in Path(folder).glob(pattern) if p.is_file())
                atif_files.extend((name, str(path), False) for name in matches)
        elif path.is_file():
            sources.append(str(path))
            if path.suffix == ".json":
                atif_files.append((_absolute(str(path)), str(path), True))
            elif _looks_like_trace(path):
                trace_files.append((_absolute(str(path)), str(path)))
            else:
                found = _index_results(path, len(sources), warnings)
                linked.update(s.trace_path for s in found if s.trace_path is not None)
                rollouts.extend(found)
        else:
            raise ConfigError(
                f"{path} does not exist; give a results file (osmosis test --output), a "
                "trace folder (--debug-dir) or a folder of ATIF trajectories"
            )
    # A results row without a trace (an `osmosis test --server` run, whose traces the server
    # wrote with its own --debug-dir) and that server's trace are one rollout: joined by id.
    untraced: dict[str, RolloutSummary] = {}
    for summary in rollouts:
        if summary.trace_path is None and summary.rollout_id is not None:
            untraced.setdefault(summary.rollout_id, summary)
    seen: set[str] = set()
    for number, (trace, source) in enumerate(trace_files):
        if trace in linked or trace in seen:
            continue
        seen.add(trace)
        traced = _summarise_trace(trace, f"t{number}", source, warnings)
        if traced is None:
            continue
        row = untraced.pop(traced.rollout_id, None) if traced.rollout_id else None
        if row is not None:
            row.trace_path, row.started = traced.trace_path, traced.started
        else:
            rollouts.append(traced)
    for number, (document, source, named) in enumerate(atif_files):
        if document in seen:
            continue
        seen.add(document)
        atif = _summarise_atif(document, f"a{number}", source, warnings, named=named)
        if atif is None:
            continue
        row = untraced.pop(atif.rollout_id, None) if atif.rollout_id else None
        if row is not None:
            row.atif_path, row.started = atif.atif_path, atif.started
        else:
            rollouts.append(atif)
    return RolloutIndex(rollouts, sources, warnings)


def _absolute(path: str) -> str:
    """An absolute, normalised path without touching the disk (``resolve()`` would stat every
    component of 10,000 paths)."""
    return os.path.normpath(os.path.abspath(path))


def _looks_like_trace(path: Path) -> bool:
    """A trace's first record has an ``event``; a results row has ``type``."""
    with path.open("rb") as fh:
        first = fh.readline(64 * 1024)
    return b'"event": ' in first and b'"type": "row"' not in first


def _index_results(path: Path, number: int, warnings: list[str]) -> list[RolloutSummary]:
    found: list[RolloutSummary] = []
    base = os.path.dirname(_absolute(str(path)))
    offset = 0
    bad = 0
    with path.open("rb") as fh:
        for line in fh:
            start, offset = offset, offset + len(line)
            row = _row_head(line)
            if row is None:
                bad += 1
                continue
            if row.get("type") != "row":
                continue
            trace = row.get("trace")
            found.append(
                RolloutSummary(
                    id=f"r{number}-{len(found)}",
                    rollout_id=row.get("rollout_id"),
                    row=row.get("row") if isinstance(row.get("row"), int) else None,
                    status=str(row.get("status") or "?"),
                    source=str(path),
                    reward=_number(row.get("reward")),
                    finish_reason=row.get("finish_reason"),
                    error_message=_short(row.get("error_message")),
                    findings=[
                        str(f.get("code")) for f in row.get("findings") or [] if isinstance(f, dict)
                    ],
                    turns=_count(row.get("turns")),
                    tool_calls=_count(row.get("tool_calls")),
                    prompt_tokens=_count(row.get("prompt_tokens")),
                    response_tokens=_count(row.get("response_tokens")),
                    latency_ms=_number(row.get("latency_ms")) or 0.0,
                    **_group_fields(row),
                    results_path=path,
                    offset=start,
                    trace_path=_absolute(os.path.join(base, trace))
                    if isinstance(trace, str)
                    else None,
                )
            )
    if bad:
        warnings.append(f"{path.name}: {bad} line(s) are not JSON and were skipped")
    return found


def _group_fields(row: dict[str, Any]) -> dict[str, Any]:
    """A results row's sample, failed tool calls and reward components, where it has them."""
    sample = row.get("sample")
    errors = row.get("tool_errors")
    components = row.get("reward_components")
    return {
        "sample": sample if isinstance(sample, int) else None,
        "tool_errors": sum(v for v in errors.values() if isinstance(v, int))
        if isinstance(errors, dict)
        else 0,
        "reward_components": {
            str(k): v for k, v in components.items() if isinstance(v, int | float)
        }
        if isinstance(components, dict)
        else {},
    }


def _row_head(line: bytes) -> dict[str, Any] | None:
    """A results line without its ``final_messages`` (parsed only when a rollout is shown).

    Inside a JSON string every quote is escaped, so the key's pattern can only match the real
    key; if the cut still does not parse (an older layout), the whole line is parsed."""
    cut = line.rfind(_FINAL_KEY)
    if cut > 0:
        try:
            head = json.loads(line[:cut] + b"}")
        except ValueError:
            pass
        else:
            return head if isinstance(head, dict) else None
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _summarise_trace(
    path: str, key: str, source: str, warnings: list[str]
) -> RolloutSummary | None:
    """A summary from a trace's first record and its ``rollout_end``/``findings`` at the end."""
    try:
        with open(path, "rb") as fh:
            first = _json_line(fh.readline(1024 * 1024))
            tail = _tail_from_end(fh)
    except OSError as exc:
        warnings.append(f"{os.path.basename(path)}: cannot read ({exc.strerror or exc})")
        return None
    if first is None or "event" not in first:
        name = os.path.basename(path)
        warnings.append(f"{name}: not a trace (its first line is not a trace record)")
        return None
    end: dict[str, Any] | None = None
    findings: list[str] = []
    for line in reversed(tail.splitlines()):
        record = _json_line(line)
        if record is None:
            continue
        if record.get("event") == "findings" and not findings:
            findings = [str(f.get("code")) for f in record.get("findings") or []]
        if record.get("event") == "rollout_end":
            end = record
            break
    rollout_id = first.get("rollout_id")
    match = _ROW_IN_ID.match(rollout_id) if isinstance(rollout_id, str) else None
    metrics = end.get("metrics") if end is not None else None
    metrics = metrics if isinstance(metrics, dict) else {}
    return RolloutSummary(
        id=key,
        rollout_id=rollout_id if isinstance(rollout_id, str) else None,
        row=int(match.group(1)) if match else None,
        status=str(end.get("status")) if end is not None else "RUNNING",
        source=source,
        reward=_number(end.get("reward")) if end is not None else None,
        finish_reason=end.get("finish_reason") if end is not None else None,
        error_message=_short(end.get("error_message")) if end is not None else None,
        findings=findings,
        turns=_count(metrics.get("num_llm_calls")),
        tool_calls=_count(metrics.get("num_tool_calls")),
        prompt_tokens=_count(metrics.get("prompt_tokens")),
        response_tokens=_count(metrics.get("response_tokens")),
        latency_ms=_number(metrics.get("total_latency_ms")) or 0.0,
        started=_number(first.get("ts")),
        trace_path=path,
    )


def _read_atif_file(path: str) -> tuple[dict[str, Any] | None, str]:
    """The ATIF document in ``path``, or None and why not."""
    name = os.path.basename(os.path.dirname(path)) + "/" + os.path.basename(path)
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_ATIF_BYTES + 1)
    except OSError as exc:
        return None, f"{name}: cannot read ({exc.strerror or exc})"
    if len(data) > MAX_ATIF_BYTES:
        return None, f"{name}: larger than {MAX_ATIF_BYTES // 2**20} MB, not read"
    try:
        document = json.loads(data)
    except (ValueError, RecursionError):
        return None, f"{name}: not JSON"
    if not is_atif(document):
        return None, f"{name}: not an ATIF trajectory (no ATIF schema_version and steps)"
    return document, ""


def _summarise_atif(
    path: str, key: str, source: str, warnings: list[str], *, named: bool = False
) -> RolloutSummary | None:
    """A summary of one ATIF trajectory: ``extra.osmosis`` when we wrote it, else what the
    steps and ``final_metrics`` say (a foreign document's status is ``UNKNOWN``)."""
    document, problem = _read_atif_file(path)
    if document is None:
        # A folder's other .json files (a results summary, a config) are not ours to report.
        quiet = "not an ATIF trajectory" in problem and not named
        if not quiet or os.path.basename(path) == "trajectory.json":
            warnings.append(problem)
        return None
    osmosis = _dict(_dict(document.get("extra")).get("osmosis"))
    final = _dict(document.get("final_metrics"))
    final_extra = _dict(final.get("extra"))
    steps = [s for s in document["steps"] if isinstance(s, dict)]
    agent_steps = [s for s in steps if s.get("source") == "agent" and s.get("llm_call_count") != 0]
    metrics = [_dict(s.get("metrics")) for s in agent_steps]
    rollout_id = next(
        (
            v
            for v in (
                osmosis.get("rollout_id"),
                document.get("session_id"),
                document.get("trajectory_id"),
            )
            if isinstance(v, str) and v
        ),
        None,
    )
    fields = osmosis.get("request_extra_fields")
    row = fields.get("row_index") if isinstance(fields, dict) else None
    match = _ROW_IN_ID.match(rollout_id) if rollout_id is not None else None
    if not isinstance(row, int) or isinstance(row, bool):
        row = int(match.group(1)) if match else None
    times = [t for t in (_iso_seconds(s.get("timestamp")) for s in steps) if t is not None]
    run = _dict(osmosis.get("metrics"))
    latency = _number(run.get("total_latency_ms"))
    if latency is None and len(times) > 1:
        latency = (max(times) - min(times)) * 1000
    reward = osmosis.get("reward") if "reward" in osmosis else final_extra.get("reward")
    return RolloutSummary(
        id=key,
        rollout_id=rollout_id,
        row=row,
        status=str(osmosis.get("status") or "UNKNOWN"),
        source=source,
        reward=_number(reward),
        finish_reason=osmosis.get("finish_reason")
        if isinstance(osmosis.get("finish_reason"), str)
        else None,
        error_message=_short(osmosis.get("error_message")),
        findings=[
            str(f.get("code")) for f in _list(osmosis.get("findings")) if isinstance(f, dict)
        ],
        turns=len(agent_steps),
        tool_calls=sum(
            isinstance(c, dict) for s in agent_steps for c in _list(s.get("tool_calls"))
        ),
        prompt_tokens=_count(final.get("total_prompt_tokens"))
        or sum(_count(m.get("prompt_tokens")) for m in metrics),
        response_tokens=_count(final.get("total_completion_tokens"))
        or sum(_count(m.get("completion_tokens")) for m in metrics),
        latency_ms=latency or 0.0,
        started=min(times) if times else None,
        atif_path=path,
    )


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dict(value: Any) -> dict[str, Any]:
    """``value`` if it is a JSON object, else an empty one (a foreign file may hold anything)."""
    return value if isinstance(value, dict) else {}


def _iso_seconds(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def _tail_from_end(fh: BinaryIO) -> bytes:
    """The end of a trace from the start of its ``rollout_end`` line (or the whole file when it
    has none): read backwards in growing chunks, since that line is usually near the end."""
    size = fh.seek(0, os.SEEK_END)
    chunk = _TAIL_BYTES
    while True:
        start = max(0, size - chunk)
        fh.seek(start)
        tail = fh.read()
        at = tail.rfind(_END_EVENT)
        if at >= 0:
            line_start = tail.rfind(b"\n", 0, at)
            if line_start >= 0 or start == 0:
                return tail[line_start + 1 :]
        if start == 0:
            return tail
        chunk *= 8


def _json_line(line: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _number(value: Any) -> float | None:
    """A finite number from a file, else None: a crafted file's string is not shown as one."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _count(value: Any) -> int:
    number = _number(value)
    return int(number) if number is not None and number >= 0 else 0


def _short(text: Any) -> str | None:
    if not isinstance(text, str):
        return None
    return text if len(text) <= _MAX_ERROR_CHARS else text[: _MAX_ERROR_CHARS - 3] + "..."
