"""Fitting a run of ``osmosis test`` to the real model server behind it.

Before the rows: the server's slots size the concurrency (turns beyond them only queue there)
unless ``--concurrency`` was given, and the sampling in use is said (runs vary unless it is
greedy). After them: where each turn's time went (the engine's own ``timings`` against what
the toolkit measured) and one hint per kind of error a retry could not change, however many
rows it failed. For the mock LLM and replays there is nothing to fit: the options stand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..testing.llm_errors import HINTS
from ..testing.openai_backend import OpenAICompatibleBackend
from ..testing.server_facts import ServerFacts
from ..testing.turn_times import split_line

__all__ = ["DEFAULT_CONCURRENCY", "Fit", "fit_to_server"]

#: Rollouts at once when neither ``--concurrency`` nor the server says.
DEFAULT_CONCURRENCY = 8


@dataclass
class Fit:
    """The run's concurrency and why, and what to say before and after the rows."""

    concurrency: int
    backend: OpenAICompatibleBackend | None = None
    facts: ServerFacts | None = None
    #: Where ``concurrency`` came from: ``option``, ``server`` or ``default``.
    source: str = "default"
    opening: list[str] = field(default_factory=list)

    def summary(self, rows: list[Any], summary: dict[str, Any]) -> list[str]:
        """Add the model server's part to ``summary``; the closing lines for the terminal."""
        if self.backend is None:
            return []
        summary["concurrency"] = {
            "rollouts": self.concurrency,
            "from": self.source,
            "server_slots": self.facts.slots if self.facts is not None else None,
        }
        lines = []
        split = self.backend.times.split(rows)
        if split is not None:
            summary["time_per_turn_ms"] = split
            lines.append(split_line(split))
        for kind, count in sorted(summary.get("llm_errors", {}).items()):
            if kind in HINTS:
                lines.append(f"{count} row(s) failed with {kind} (not retried): {HINTS[kind]}")
        return lines


async def fit_to_server(backend: Any, concurrency: int | None, params: dict[str, Any]) -> Fit:
    """Probe the OpenAI-compatible server behind ``backend`` (the token check's inner one
    too) and size the run: ``concurrency`` when given, else the server's slots."""
    inner = getattr(backend, "inner", backend)
    if not isinstance(inner, OpenAICompatibleBackend):
        return Fit(
            concurrency or DEFAULT_CONCURRENCY, source="option" if concurrency else "default"
        )
    facts = await inner.probe()
    if concurrency is not None:
        fit = Fit(concurrency, inner, facts, "option")
        if facts.slots is not None and concurrency > facts.slots:
            fit.opening.append(
                f"concurrency {concurrency} (--concurrency) against {facts.slots} slot(s) of "
                f"{facts.engine}: the turns beyond them wait in its queue"
            )
    else:
        fit = Fit(
            facts.slots or DEFAULT_CONCURRENCY, inner, facts, "server" if facts.slots else "default"
        )
        fit.opening.append(facts.concurrency_note(fit.concurrency))
    fit.opening.append(_sampling_note(params, facts))
    return fit


def _sampling_note(params: dict[str, Any], facts: ServerFacts) -> str:
    """The sampling the turns use: the run's, else the server's defaults (and that they vary)."""
    temperature = params.get("temperature")
    if temperature is not None:
        repeatable = "" if temperature == 0 else ": replies vary between runs"
        return f"sampling: temperature {temperature:g} (--temperature){repeatable}"
    defaults = facts.sampling or {}
    shown = ", ".join(_setting(key, value) for key, value in defaults.items())
    told = f" ({shown})" if shown else ""
    return (
        f"sampling: the server's defaults{told}: replies vary between runs; pass "
        "--temperature 0 for repeatable ones"
    )


def _setting(key: str, value: Any) -> str:
    """``temperature 0.8``; llama.cpp's "no seed" (-1, sent back as 2**32 - 1) as random."""
    if key == "seed" and value in (-1, 0xFFFFFFFF):
        return "seed random"
    return f"{key} {value:.3g}" if isinstance(value, float) else f"{key} {value}"
