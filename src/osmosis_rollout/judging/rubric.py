"""A rubric: weighted criteria a judge scores a transcript on, and an optional reference answer.

Written in Python (``Rubric([Criterion(...)])``) or in a TOML file (``load_rubric``), so the
rubric can live beside the dataset and be reviewed like one. TOML only: YAML would need a parser
the toolkit does not depend on.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError

__all__ = ["Criterion", "Rubric", "load_rubric"]

#: A bound on what a rubric may hold: it is sent with every judge call.
MAX_CRITERIA = 32
MAX_TEXT = 4000


@dataclass(frozen=True, slots=True)
class Criterion:
    """One thing the judge scores from 0 to 1; ``weight`` is its share of the total."""

    name: str
    description: str
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not self.name or not self.name.strip() or len(self.name) > 100:
            raise ConfigError(f"criterion name {self.name!r}: give 1-100 characters")
        if not self.description.strip() or len(self.description) > MAX_TEXT:
            raise ConfigError(f"criterion {self.name!r}: give a description (at most 4000 chars)")
        weight = self.weight
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise ConfigError(f"criterion {self.name!r}: weight must be a number")
        if not math.isfinite(weight) or weight <= 0:
            raise ConfigError(f"criterion {self.name!r}: weight must be finite and above 0")


@dataclass(frozen=True, slots=True)
class Rubric:
    """Criteria with weights, the task's instructions for the judge, and a reference answer."""

    criteria: tuple[Criterion, ...]
    reference: str | None = None
    instructions: str = ""
    _names: frozenset[str] = field(default=frozenset(), repr=False, compare=False)

    def __init__(
        self,
        criteria: Sequence[Criterion],
        reference: str | None = None,
        instructions: str = "",
    ) -> None:
        items = tuple(criteria)
        if not items:
            raise ConfigError("a rubric needs at least one criterion")
        if len(items) > MAX_CRITERIA:
            raise ConfigError(f"a rubric holds at most {MAX_CRITERIA} criteria, got {len(items)}")
        names = [c.name for c in items]
        if len(set(names)) != len(names):
            raise ConfigError(f"criterion names must differ: {names}")
        if reference is not None and len(reference) > 4 * MAX_TEXT:
            raise ConfigError("a rubric's reference answer holds at most 16000 characters")
        object.__setattr__(self, "criteria", items)
        object.__setattr__(self, "reference", reference)
        object.__setattr__(self, "instructions", instructions)
        object.__setattr__(self, "_names", frozenset(names))

    @property
    def names(self) -> list[str]:
        """The criteria's names, in order."""
        return [c.name for c in self.criteria]

    def with_reference(self, reference: object) -> Rubric:
        """The same rubric with ``reference`` (a row's ``ground_truth``, say) as its answer."""
        text = None if reference is None else str(reference)
        return Rubric(self.criteria, text, self.instructions)

    def weighted(self, scores: Mapping[str, float]) -> float:
        """The weighted mean of one score per criterion, in [0, 1]."""
        total = sum(c.weight for c in self.criteria)
        return sum(c.weight * scores[c.name] for c in self.criteria) / total


def load_rubric(path: str | Path) -> Rubric:
    """A rubric from a TOML file: ``reference``, ``instructions`` and ``[[criteria]]`` tables of
    ``name``, ``description`` and ``weight``. Every mistake is one ``ConfigError``."""
    file = Path(path)
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read rubric {file}: {exc}") from None
    return rubric_from_data(data, where=str(file))


def rubric_from_data(data: Mapping[str, Any], *, where: str = "rubric") -> Rubric:
    """A rubric from plain data (a parsed TOML table)."""
    unknown = set(data) - {"criteria", "reference", "instructions"}
    if unknown:
        raise ConfigError(
            f"{where}: unknown keys {sorted(unknown)}; known: criteria, instructions, reference"
        )
    raw = data.get("criteria")
    if not isinstance(raw, list):
        raise ConfigError(f"{where}: give the criteria as [[criteria]] tables")
    criteria: list[Criterion] = []
    for number, item in enumerate(raw, 1):
        if not isinstance(item, dict) or set(item) - {"name", "description", "weight"}:
            raise ConfigError(f"{where}: criterion {number} takes name, description and weight")
        name, description = item.get("name"), item.get("description")
        if not isinstance(name, str) or not isinstance(description, str):
            raise ConfigError(f"{where}: criterion {number} needs a name and a description")
        criteria.append(Criterion(name, description, item.get("weight", 1.0)))
    reference, instructions = data.get("reference"), data.get("instructions", "")
    if reference is not None and not isinstance(reference, str):
        raise ConfigError(f"{where}: reference must be a string")
    if not isinstance(instructions, str):
        raise ConfigError(f"{where}: instructions must be a string")
    return Rubric(criteria, reference, instructions)
