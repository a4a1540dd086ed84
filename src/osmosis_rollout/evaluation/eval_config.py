"""``osmosis test --config configs/eval/NAME.toml``: an official Osmosis eval config as input.

A workspace made for the official SDK (osmosis-ai 0.3) describes each evaluation in
``configs/eval/NAME.toml``: ``[experiment]`` names the rollout (``rollouts/<rollout>/``), its
``entrypoint``, the platform dataset and the model; ``[evaluation]`` the samples per row (``n``),
``pass_threshold``, ``limit`` and the two timeouts; ``[env]`` variables for the server. Read here
into the options ``osmosis test`` already has, so such a project runs on the bench unchanged;
what we do not use is listed (:attr:`EvalConfig.unused`), so nothing is ignored silently. The
run stays offline on the mock: ``model_path`` is used only when a real model is asked for.
"""

from __future__ import annotations

import math
import os
import shlex
import shutil
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError

__all__ = ["EvalConfig", "read_eval_config"]

#: Keys we read, by section; anything else in the file is reported as not used.
_USED = {
    "experiment": {"rollout", "entrypoint", "dataset", "model_path"},
    "evaluation": {"n", "pass_threshold", "limit", "agent_workflow_timeout_s", "grader_timeout_s"},
}
_SECTIONS = {"experiment", "evaluation", "advanced", "env", "secrets"}


@dataclass(frozen=True)
class EvalConfig:
    """What an eval config says, in ``osmosis test``'s terms (None: not given)."""

    path: Path
    #: The workspace: the folder holding ``configs/``, ``rollouts/`` and ``data/``.
    workspace: Path
    rollout: str | None = None
    entrypoint: str | None = None
    dataset: str | None = None
    model_path: str | None = None
    samples: int | None = None
    pass_threshold: float | None = None
    limit: int | None = None
    agent_timeout_s: float | None = None
    grader_timeout_s: float | None = None
    env: dict[str, str] = field(default_factory=dict)
    #: ``section.key`` of everything in the file that ``osmosis test`` does not use.
    unused: tuple[str, ...] = ()

    @property
    def rollout_dir(self) -> Path | None:
        """``rollouts/<rollout>/`` in the workspace."""
        return self.workspace / "rollouts" / self.rollout if self.rollout else None

    def dataset_path(self) -> Path | None:
        """The platform dataset as a file of the workspace (``data/<name>.jsonl`` or another
        known extension), or None when there is none: then ``--dataset`` is needed."""
        if not self.dataset:
            return None
        named = Path(self.dataset)
        if named.suffix and (self.workspace / named).is_file():
            return self.workspace / named
        for suffix in (".jsonl", ".json", ".csv", ".parquet"):
            candidate = self.workspace / "data" / f"{self.dataset}{suffix}"
            if candidate.is_file():
                return candidate
        return None

    def launch_command(self) -> str | None:
        """How to start the rollout's server, as the platform does (``--launch``): the
        rollout's own virtualenv if it has one, else ``uv run`` when uv is installed, else this
        interpreter; run in ``rollouts/<rollout>/``."""
        if not (self.rollout_dir and self.entrypoint):
            return None
        own = self.rollout_dir / ".venv" / "bin" / "python"
        if own.exists():
            return shlex.join([str(own), self.entrypoint])
        uv = shutil.which("uv")
        if uv is not None and (self.rollout_dir / "pyproject.toml").is_file():
            return shlex.join([uv, "run", "--project", ".", "python", self.entrypoint])
        return shlex.join([sys.executable, self.entrypoint])


def read_eval_config(path: Path) -> EvalConfig:
    """Read ``path``; a ``ConfigError`` naming the key and the fix for anything malformed."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--config {path} cannot be read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--config {path} is not valid TOML: {exc}") from None
    experiment = _table(data, "experiment", path)
    evaluation = _table(data, "evaluation", path)
    env = _table(data, "env", path)
    for name, value in env.items():
        if not isinstance(value, str | int | float | bool):
            raise ConfigError(f"--config {path}: [env] {name} must be a string")
    unused = [
        f"{section}.{key}"
        for section, table in (("experiment", experiment), ("evaluation", evaluation))
        for key in table
        if key not in _USED[section]
    ]
    unused += [key for key in data if key not in _SECTIONS]
    unused += [f"advanced.{key}" for key in _table(data, "advanced", path)]
    secrets = data.get("secrets")
    asks = any(secrets.values()) if isinstance(secrets, dict) else bool(secrets)
    if asks:  # a [secrets] table that asks for none (required = []) is not ignored
        unused.append("secrets")
    return EvalConfig(
        path=path,
        workspace=_workspace_of(path),
        rollout=_text(experiment, "rollout", path),
        entrypoint=_text(experiment, "entrypoint", path),
        dataset=_text(experiment, "dataset", path),
        model_path=_text(experiment, "model_path", path),
        samples=_whole(evaluation, "n", path),
        pass_threshold=_number(evaluation, "pass_threshold", path),
        limit=_whole(evaluation, "limit", path),
        agent_timeout_s=_number(evaluation, "agent_workflow_timeout_s", path, positive=True),
        grader_timeout_s=_number(evaluation, "grader_timeout_s", path, positive=True),
        env={name: _env_value(value) for name, value in env.items()},
        unused=tuple(sorted(unused)),
    )


def _workspace_of(path: Path) -> Path:
    """``configs/eval/NAME.toml``'s workspace; else the nearest folder with ``rollouts/``; else
    the config's own folder."""
    resolved = path.resolve()
    if resolved.parent.name == "eval" and resolved.parent.parent.name == "configs":
        return resolved.parents[2]
    for folder in resolved.parents:
        if (folder / "rollouts").is_dir():
            return folder
    return Path(os.path.dirname(resolved))


def _table(data: dict[str, Any], name: str, path: Path) -> dict[str, Any]:
    value = data.get(name, {})
    if name == "secrets":
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"--config {path}: [{name}] must be a table")
    return value


def _text(table: dict[str, Any], key: str, path: Path) -> str | None:
    value = table.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"--config {path}: {key} must be a non-empty string")
    return value.strip()


def _whole(table: dict[str, Any], key: str, path: Path) -> int | None:
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"--config {path}: [evaluation] {key} must be a whole number >= 1")
    return value


def _number(table: dict[str, Any], key: str, path: Path, *, positive: bool = False) -> float | None:
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"--config {path}: [evaluation] {key} must be a finite number")
    if positive and value <= 0:
        raise ConfigError(f"--config {path}: [evaluation] {key} must be more than 0")
    return float(value)


def _env_value(value: str | int | float | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
