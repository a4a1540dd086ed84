"""Judge calls on tape: kept with the rows of a recorded run, answered from them on replay.

A replay must not need the judge: it would cost a model, and its verdicts could drift. While a
:class:`JudgeTape` is in use (``use_tape``), every HTTP judge call (:class:`~.client.Judge`) is
either kept (recording: under the rollout being graded, so the recorder stores it with that
row) or answered from the tape without a request (replaying). A reply is found by its request's
key, a hash of the whole body the judge would get (model, sampling, the prompt with the
rubric and the transcript): a replay whose agent, rubric or judge settings changed finds
nothing and fails the judge (kind ``replay``), as a diverged replay should. The mock judge needs
no tape: it makes no request.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from typing import Any

__all__ = [
    "JudgeTape",
    "active_tape",
    "grading_rollout",
    "request_key",
    "use_tape",
]

#: The rollout whose ``grade()`` is running in this task (set by ``grading.run_grade``).
grading_rollout: ContextVar[str | None] = ContextVar("grading_rollout", default=None)

_ACTIVE: list[JudgeTape] = []


def request_key(body: Mapping[str, Any]) -> str:
    """The key of a judge request: the SHA-256 of its body as canonical JSON."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class JudgeTape:
    """The judge exchanges of one run: kept per rollout while recording, found by request key
    while replaying (``replaying``). ``answered`` counts the calls answered from the tape."""

    def __init__(self, *, replaying: bool) -> None:
        self.replaying = replaying
        self.answered = 0
        self._kept: dict[str, list[dict[str, Any]]] = {}
        self._replies: dict[str, dict[str, Any]] = {}

    def keep(self, key: str, reply: str, usage: tuple[int, int]) -> None:
        """Recording: one exchange of the rollout being graded."""
        rollout = grading_rollout.get() or ""
        entry = {"key": key, "reply": reply, "usage": list(usage)}
        self._kept.setdefault(rollout, []).append(entry)

    def take(self, rollout_id: str) -> list[dict[str, Any]]:
        """Recording: the exchanges a finished rollout's grading made (and forget them)."""
        return self._kept.pop(rollout_id, [])

    def load(self, exchanges: Iterable[Mapping[str, Any]]) -> None:
        """Replaying: the exchanges a recorded row holds (malformed entries are skipped)."""
        for entry in exchanges:
            key, reply, usage = entry.get("key"), entry.get("reply"), entry.get("usage")
            if isinstance(key, str) and isinstance(reply, str):
                self._replies[key] = {"reply": reply, "usage": usage}

    def answer(self, key: str) -> tuple[str, tuple[int, int]] | None:
        """Replaying: the recorded reply to the request ``key``, or None."""
        found = self._replies.get(key)
        if found is None:
            return None
        self.answered += 1
        usage = found.get("usage")
        if isinstance(usage, list) and len(usage) == 2 and all(isinstance(n, int) for n in usage):
            return found["reply"], (usage[0], usage[1])
        return found["reply"], (0, 0)


def active_tape() -> JudgeTape | None:
    """The tape judge calls go to now, if any."""
    return _ACTIVE[-1] if _ACTIVE else None


class use_tape:
    """Send this process's judge calls to ``tape`` while the block runs (``with`` or ``async
    with``; None: nothing changes)."""

    def __init__(self, tape: JudgeTape | None) -> None:
        self.tape = tape

    def __enter__(self) -> JudgeTape | None:
        if self.tape is not None:
            _ACTIVE.append(self.tape)
        return self.tape

    def __exit__(self, *exc: object) -> None:
        if self.tape is not None:
            _ACTIVE.remove(self.tape)

    async def __aenter__(self) -> JudgeTape | None:
        return self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__()
