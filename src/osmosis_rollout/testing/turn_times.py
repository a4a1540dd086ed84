"""Where a turn's time goes: the model's compute, the server and HTTP around it, the toolkit.

llama.cpp puts its own measurement in each reply (``timings``: ``prompt_ms`` for reading the
prompt, ``predicted_ms`` for generating). The backend times the whole request; the agent's
context times each ``ctx.chat``. The differences say whether a slow run is the model (nothing
to fix here), the server's queue (too much concurrency) or the toolkit (it should be a few
milliseconds a turn; ``benchmarks/bench_real_model.py`` measures it against a real server).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["TurnTimes", "engine_ms"]


def engine_ms(body: dict[str, Any]) -> float | None:
    """The model's compute time for one reply from its ``timings`` (llama.cpp), or None."""
    timings = body.get("timings")
    if not isinstance(timings, dict):
        return None
    parts = [timings.get("prompt_ms"), timings.get("predicted_ms")]
    values = [float(p) for p in parts if isinstance(p, int | float)]
    return sum(values) if values else None


@dataclass
class TurnTimes:
    """Per turn: the request's wall time as the backend saw it, and the engine's own time."""

    #: rollout id -> the backend's wall time of each of its turns (ms).
    request_ms: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    #: The engine's compute time of each turn that reported one (ms).
    model_ms: list[float] = field(default_factory=list)
    #: The request's wall time of the same turns (ms), to set against ``model_ms``.
    timed_request_ms: list[float] = field(default_factory=list)
    #: rollout id -> time spent by an observer of its turns (the token check's requests).
    observer_ms: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def add(self, rollout_id: str, request_ms: float, model_ms: float | None) -> None:
        """One answered turn."""
        self.request_ms[rollout_id].append(request_ms)
        if model_ms is not None:
            self.model_ms.append(model_ms)
            self.timed_request_ms.append(request_ms)

    def state(self) -> dict[str, Any]:
        """What these times hold, as plain data: what a ``--jobs`` worker sends its parent."""
        return {
            "request_ms": {rid: list(times) for rid, times in self.request_ms.items()},
            "model_ms": list(self.model_ms),
            "timed_request_ms": list(self.timed_request_ms),
            "observer_ms": dict(self.observer_ms),
        }

    def merge(self, state: dict[str, Any]) -> None:
        """Add another process's times (:meth:`state`): a ``--jobs`` run's split is its
        workers' turns together."""
        for rollout_id, times in state.get("request_ms", {}).items():
            self.request_ms[rollout_id].extend(times)
        self.model_ms.extend(state.get("model_ms", []))
        self.timed_request_ms.extend(state.get("timed_request_ms", []))
        for rollout_id, ms in state.get("observer_ms", {}).items():
            self.observer_ms[rollout_id] += ms

    def observed(self, rollout_id: str, ms: float) -> None:
        """Time an observer (``--token-check``) spent inside one of the rollout's turns: its
        own, neither the model's nor the toolkit's."""
        self.observer_ms[rollout_id] += ms

    def split(self, rows: Iterable[Any]) -> dict[str, Any] | None:
        """Medians per turn (ms): ``model`` (the engine's timings), ``server_and_http`` (the
        request's wall time less the model's: queueing, templating, HTTP), and ``toolkit``
        (each row's LLM time as the agent saw it, less its requests' and an observer's: the
        mock TrainGate, the rollout server, the protocol). ``rows`` are results with
        ``rollout_id``, ``llm_ms`` and ``turns``. None when no engine reported timings."""
        if not self.model_ms:
            return None
        overhead = [w - m for w, m in zip(self.timed_request_ms, self.model_ms, strict=True)]
        toolkit = []
        for row in rows:
            requests = self.request_ms.get(row.rollout_id)
            if requests and row.turns == len(requests):
                spent = sum(requests) + self.observer_ms.get(row.rollout_id, 0.0)
                toolkit.append(max(0.0, row.llm_ms - spent) / len(requests))
        return {
            "turns_timed": len(self.model_ms),
            "model": round(statistics.median(self.model_ms), 1),
            "server_and_http": round(statistics.median(overhead), 1),
            "toolkit": round(statistics.median(toolkit), 1) if toolkit else None,
        }


def split_line(split: dict[str, Any]) -> str:
    """The split as one line for the terminal."""
    toolkit = split["toolkit"]
    mine = f", toolkit {toolkit:g} ms" if toolkit is not None else ""
    return (
        f"time per turn (median of {split['turns_timed']}): model {split['model']:g} ms (the "
        f"server's timings), server queue + HTTP {split['server_and_http']:g} ms{mine}"
    )
