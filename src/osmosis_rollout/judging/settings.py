"""Where the judge is: its own URL, model and key, apart from the policy model's.

Arguments win over ``OSMOSIS_JUDGE_*`` environment variables, which win over
``[tool.osmosis.judge]`` in the nearest ``pyproject.toml``. Nothing falls back to the trainer's
chat URL: a judge is named on purpose, or it is a configuration error. ``url = "mock"`` is the
built-in deterministic judge (:class:`~.mock.MockJudge`), for tests and CI.
"""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ..config import find_pyproject
from ..errors import ConfigError
from ..redaction import ApiKey

__all__ = ["MOCK_URL", "JudgeSettings"]

#: The ``url`` that names the built-in mock judge.
MOCK_URL = "mock"
_ENV = "OSMOSIS_JUDGE_"


@dataclass(frozen=True, slots=True)
class JudgeSettings:
    """A judge's endpoint (``url`` up to the version segment, like the OpenAI SDK's base URL),
    its model, its key (never printed) and its sampling: temperature 0 and a seed, so the same
    transcript gets the same verdict as far as the server allows."""

    url: str | None = None
    model: str = "default"
    api_key: ApiKey | None = None
    timeout_s: float = 60.0
    seed: int = 0
    temperature: float = 0.0
    max_tokens: int = 1024

    @property
    def is_mock(self) -> bool:
        return self.url == MOCK_URL

    @classmethod
    def resolve(
        cls,
        *,
        environ: Mapping[str, str] | None = None,
        start: Path | None = None,
        **given: Any,
    ) -> JudgeSettings:
        """The settings from ``given`` > ``OSMOSIS_JUDGE_*`` > ``[tool.osmosis.judge]``."""
        names = {f.name: f for f in fields(cls)}
        unknown = set(given) - set(names)
        if unknown:
            raise ConfigError(f"unknown judge settings {sorted(unknown)}; known: {sorted(names)}")
        values: dict[str, Any] = {}
        pyproject = find_pyproject(start or Path.cwd())
        if pyproject is not None:
            values.update(_from_pyproject(pyproject, set(names) - {"api_key"}))
        env = os.environ if environ is None else environ
        for name in names:
            raw = env.get(_ENV + name.upper())
            if raw is not None and raw.strip():
                values[name] = raw.strip()
        values.update({k: v for k, v in given.items() if v is not None})
        return cls(**_typed(values))

    def __post_init__(self) -> None:
        web = ("http://", "https://")
        if self.url is not None and not self.is_mock and not self.url.startswith(web):
            raise ConfigError(
                f"judge url {self.url!r}: give an http(s) base URL such as "
                "http://127.0.0.1:8080/v1, or 'mock' for the built-in mock judge"
            )
        if not math.isfinite(self.timeout_s) or self.timeout_s <= 0:
            raise ConfigError("judge timeout_s must be a positive number")
        if not math.isfinite(self.temperature) or not 0 <= self.temperature <= 2:
            raise ConfigError("judge temperature must be between 0 and 2")
        if self.max_tokens < 1:
            raise ConfigError("judge max_tokens must be at least 1")


def _from_pyproject(path: Path, allowed: set[str]) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    table = data.get("tool", {}).get("osmosis", {}).get("judge", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.osmosis.judge] must be a table")
    if "api_key" in table:
        raise ConfigError(
            f"{path}: [tool.osmosis.judge] must not hold the key; give it in OSMOSIS_JUDGE_API_KEY"
        )
    unknown = set(table) - allowed
    if unknown:
        raise ConfigError(
            f"{path}: unknown setting(s) {sorted(unknown)} in [tool.osmosis.judge]; "
            f"known: {', '.join(sorted(allowed))}"
        )
    return dict(table)


def _typed(values: dict[str, Any]) -> dict[str, Any]:
    """Environment strings and TOML values as the fields' types, one clear error each."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        try:
            if name in ("timeout_s", "temperature"):
                if isinstance(value, bool):
                    raise ValueError
                out[name] = float(value)
            elif name in ("seed", "max_tokens"):
                if isinstance(value, bool | float):
                    raise ValueError
                out[name] = int(value)
            elif name == "api_key":
                out[name] = value if isinstance(value, ApiKey) else ApiKey(str(value))
            else:
                if not isinstance(value, str):
                    raise ValueError
                out[name] = value
        except (TypeError, ValueError):
            raise ConfigError(
                f"judge setting {name}: {type(value).__name__} is not valid"
            ) from None
    return out
