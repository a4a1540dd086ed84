"""Read a debug trace back into a trajectory: turns, tool calls, findings and the final result.

The trace (see docs/traces.md) stores each turn's messages as a delta; ``Trajectory.messages()``
rebuilds the full conversation from them. ``osmosis view`` and tests read traces through here.
A trace cut short (a crash mid-write) still reads: broken lines are counted, not fatal.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .protocol import Message
from .tracing import TRACE_VERSION

__all__ = ["ToolCallTrace", "Trajectory", "TurnTrace", "parse_trace", "read_trace"]


@dataclass
class ToolCallTrace:
    """One tool call as traced: arguments as the model sent them, the (clipped) result."""

    turn: int | None
    tool: str | None
    tool_call_id: str
    arguments: Any = None
    result: str | None = None
    result_chars: int | None = None  # the full length when ``result`` was clipped
    latency_ms: float = 0.0
    error: str | None = None
    ts: float | None = None


@dataclass
class TurnTrace:
    """One LLM turn: what it added to the history, the reply, its cost, and what followed."""

    number: int
    new_messages: list[Message]
    delta_from: int = 0
    reply: Message | None = None
    finish_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    latency_ms: float = 0.0
    params: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    ts: float | None = None
    #: The tools sent with the call (their names), when the trace says: a trace of the mock
    #: TrainGate's side records them (``osmosis test --server --debug-dir``).
    tools: list[str] | None = None
    tool_calls: list[ToolCallTrace] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    findings: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Trajectory:
    """Everything one trace file says about one rollout."""

    rollout_id: str | None = None
    version: int = 1
    start: dict[str, Any] = field(default_factory=dict)
    turns: list[TurnTrace] = field(default_factory=list)
    end: dict[str, Any] | None = None
    findings: list[dict[str, Any]] = field(default_factory=list)
    #: Events before the first turn, or of a kind this reader does not know.
    events: list[dict[str, Any]] = field(default_factory=list)
    bad_lines: int = 0

    def messages(self) -> list[Message]:
        """The full conversation: every turn's history plus reply, then the final messages."""
        history: list[Message] = []
        for turn in self.turns:
            history = [*history[: turn.delta_from], *turn.new_messages]
            if turn.reply is not None:
                history.append(turn.reply)
        if self.end is not None and "final_messages" in self.end:
            start = int(self.end.get("final_from") or 0)
            history = [*history[:start], *self.end["final_messages"]]
        return history

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (what ``osmosis view`` sends to the page)."""
        return asdict(self)


def read_trace(path: str | Path) -> Trajectory:
    """Read one ``<rollout>.jsonl`` trace file."""
    with Path(path).open("rb") as fh:
        return parse_trace(fh)


def parse_trace(lines: Iterable[str | bytes]) -> Trajectory:
    """Fold trace records into a :class:`Trajectory`, in file order."""
    trajectory = Trajectory()
    turns: dict[int, TurnTrace] = {}
    for line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            trajectory.bad_lines += 1
            continue
        if not isinstance(record, dict):
            trajectory.bad_lines += 1
            continue
        _fold(trajectory, turns, record)
    return trajectory


def _fold(trajectory: Trajectory, turns: dict[int, TurnTrace], record: dict[str, Any]) -> None:
    kind = record.get("event")
    version = record.get("v")
    if isinstance(version, int):
        trajectory.version = max(trajectory.version, min(version, TRACE_VERSION))
    if trajectory.rollout_id is None and isinstance(record.get("rollout_id"), str):
        trajectory.rollout_id = record["rollout_id"]
    current = trajectory.turns[-1] if trajectory.turns else None
    if kind == "rollout_start":
        trajectory.start = record
    elif kind == "rollout_end":
        trajectory.end = record
    elif kind == "turn" and isinstance(record.get("turn"), int):
        turn = _turn(record)
        turns[turn.number] = turn
        trajectory.turns.append(turn)
    elif kind == "tool_call":
        call = _tool_call(record)
        owner = turns.get(call.turn) if isinstance(call.turn, int) else current
        if owner is not None:
            owner.tool_calls.append(call)
        else:
            trajectory.events.append(record)
    elif kind == "findings":
        for finding in record.get("findings") or []:
            if not isinstance(finding, dict):
                continue
            trajectory.findings.append(finding)
            number = finding.get("turn")
            owner = turns.get(number) if isinstance(number, int) else None
            if owner is not None:
                owner.findings.append(finding)
    elif current is not None:
        current.events.append(record)
    else:
        trajectory.events.append(record)


def _turn(record: dict[str, Any]) -> TurnTrace:
    usage = record.get("usage")
    return TurnTrace(
        number=record["turn"],
        new_messages=list(record.get("messages") or []),
        delta_from=int(record.get("delta_from") or 0),
        reply=record.get("reply"),
        finish_reason=record.get("finish_reason"),
        usage=usage if isinstance(usage, dict) else {},
        latency_ms=float(record.get("latency_ms") or 0.0),
        params=record.get("params") or {},
        error=record.get("error"),
        ts=record.get("ts"),
        tools=[str(t) for t in tools] if isinstance(tools := record.get("tools"), list) else None,
    )


def _tool_call(record: dict[str, Any]) -> ToolCallTrace:
    return ToolCallTrace(
        turn=record.get("turn"),
        tool=record.get("tool"),
        tool_call_id=str(record.get("tool_call_id") or ""),
        arguments=record.get("arguments"),
        result=record.get("result"),
        result_chars=record.get("result_chars"),
        latency_ms=float(record.get("latency_ms") or 0.0),
        error=record.get("error"),
        ts=record.get("ts"),
    )
