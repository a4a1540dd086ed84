"""Where a replay left its recording: the first differing field of two JSON values, and how it
is shown (a one-line summary with excerpts, a short unified diff)."""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from typing import Any

from ..redaction import REDACTED

__all__ = ["Divergence", "first_difference", "short_diff"]

_DIFF_LINES = 12
_DIFF_LINE_CHARS = 160
_EXCERPT = 60
_MISSING = object()


@dataclass(frozen=True)
class Divergence:
    """Where a replayed rollout first left its recording.

    ``field`` is a path into the request or result (``messages[2].content``, ``temperature``,
    ``tools[0].function.description``, ``turn``, ``reward``, ``final_messages[5].content``);
    ``message`` is the index of the differing message when the difference is in one.
    """

    row: int
    turn: int | None
    field: str
    recorded: Any
    replayed: Any
    message: int | None = None
    note: str = ""

    def summary(self) -> str:
        """One line: row, turn, field and both values in short."""
        where = f"row {self.row}" + (f", turn {self.turn}" if self.turn is not None else "")
        if self.note:
            what = self.note
        else:
            before, after = _excerpts(self.recorded, self.replayed)
            what = f"{self.field} differs from the recording: recorded {before}, now {after}"
        return f"{where}: {what}"

    def diff(self) -> str:
        """A short unified diff of the recorded and the replayed value."""
        return short_diff(self.recorded, self.replayed)

    def as_dict(self) -> dict[str, Any]:
        """The finding's ``details`` in results files."""
        return {
            "row": self.row,
            "turn": self.turn,
            "field": self.field,
            "message_index": self.message,
            "diff": self.diff(),
        }


def first_difference(recorded: Any, replayed: Any, path: str = "") -> tuple[str, Any, Any] | None:
    """The first place two JSON values differ: ``(path, recorded, replayed)``, or None.

    A recorded ``**********`` (a secret scrubbed at recording) matches any string. A missing
    list item or key is reported with ``None`` on the side that lacks it; a key that is
    ``null`` on one side and absent on the other is no difference (the append-only rule's
    reading: cassettes recorded before issue 41 stored ``content: null`` as absent).
    """
    if recorded == REDACTED and isinstance(replayed, str):
        return None
    if isinstance(recorded, dict) and isinstance(replayed, dict):
        for key in [*recorded, *(k for k in replayed if k not in recorded)]:
            a, b = recorded.get(key, _MISSING), replayed.get(key, _MISSING)
            if (a is _MISSING and b is None) or (b is _MISSING and a is None):
                continue
            if a is _MISSING or b is _MISSING:
                return (
                    f"{path}.{key}",
                    None if a is _MISSING else a,
                    None if b is _MISSING else b,
                )
            found = first_difference(a, b, f"{path}.{key}")
            if found is not None:
                return found
        return None
    if isinstance(recorded, list) and isinstance(replayed, list):
        for i in range(max(len(recorded), len(replayed))):
            if i >= len(recorded) or i >= len(replayed):
                return (
                    f"{path}[{i}]",
                    recorded[i] if i < len(recorded) else None,
                    replayed[i] if i < len(replayed) else None,
                )
            found = first_difference(recorded[i], replayed[i], f"{path}[{i}]")
            if found is not None:
                return found
        return None
    if recorded == replayed and type(recorded) is type(replayed):
        return None
    pair = (recorded, replayed)
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in pair)
    if numbers and recorded == replayed:
        return None  # 1 and 1.0 are the same JSON number
    return (path, recorded, replayed)


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def _excerpts(recorded: Any, replayed: Any) -> tuple[str, str]:
    """Both values in short, cut around where they start to differ."""
    texts = [
        " ".join((v if isinstance(v, str) else json.dumps(v, default=str)).split())
        for v in (recorded, replayed)
    ]
    same = 0
    for a, b in zip(*texts, strict=False):
        if a != b:
            break
        same += 1
    start = max(0, same - _EXCERPT // 3)
    shown = []
    for value, text in zip((recorded, replayed), texts, strict=True):
        part = text[start : start + _EXCERPT]
        part = ("..." if start else "") + part + ("..." if len(text) > start + _EXCERPT else "")
        shown.append(repr(part) if isinstance(value, str) else part)
    return shown[0], shown[1]


def short_diff(recorded: Any, replayed: Any) -> str:
    """At most a dozen lines of unified diff, each cut at 160 characters."""
    before, after = _text(recorded).splitlines(), _text(replayed).splitlines()
    lines = list(difflib.unified_diff(before, after, "recorded", "replay", n=1, lineterm=""))
    cut = [
        line if len(line) <= _DIFF_LINE_CHARS else line[: _DIFF_LINE_CHARS - 3] + "..."
        for line in lines[:_DIFF_LINES]
    ]
    if len(lines) > _DIFF_LINES:
        cut.append(f"... ({len(lines) - _DIFF_LINES} more diff lines)")
    return "\n".join(cut)
