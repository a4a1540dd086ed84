"""``osmosis test --config configs/eval/NAME.toml``: an official eval config's values as the
command's options, each one a flag given on the command line does not already set."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._common import fail


@dataclass
class FromConfig:
    """The options an eval config sets (None: it leaves that option alone)."""

    dataset: Path | None = None
    samples: int | None = None
    pass_threshold: float | None = None
    limit: int | None = None
    timeout: float | None = None
    model: str | None = None
    launch: str | None = None
    launch_cwd: Path | None = None
    #: What a launched server that lacks a module is told of the rollout's ``.venv``.
    environment_hint: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    #: What the run says of the config: the keys it does not use, and why.
    notes: list[str] = field(default_factory=list)


def from_config(
    path: Path, *, given: Callable[[str], bool], in_process: bool, real_model: bool
) -> FromConfig:
    """What ``path`` sets of the options ``given`` says were not given on the command line.
    ``in_process``: TARGET or ``--server`` is given, so the config's entrypoint is not
    launched (a ``--launch`` given instead runs in the rollout's folder); ``real_model``: a
    real model is asked for, so ``model_path`` is used."""
    from ..errors import OsmosisError
    from ..evaluation.eval_config import read_eval_config

    try:
        config = read_eval_config(path)
    except OsmosisError as exc:
        fail(str(exc))
    chosen = FromConfig()
    if not given("dataset") and config.dataset:
        found = config.dataset_path()
        if found is None:
            fail(
                f"--config {path}: dataset {config.dataset!r} is a platform dataset, and "
                f"{config.workspace}/data/ has no {config.dataset}.jsonl (or .json, .csv, "
                ".parquet): give its rows with --dataset FILE"
            )
        chosen.dataset = found
    if not given("samples"):
        chosen.samples = config.samples
    if not given("pass_threshold"):
        chosen.pass_threshold = config.pass_threshold
    if not given("limit"):
        chosen.limit = config.limit
    if not given("timeout") and config.agent_timeout_s is not None:
        chosen.timeout = config.agent_timeout_s
    if config.grader_timeout_s is not None:
        chosen.notes.append(
            "evaluation.grader_timeout_s: the grader gets the rollout's --timeout here"
        )
    if config.model_path and real_model and not given("model"):
        chosen.model = config.model_path
    if not in_process and not given("launch"):
        command = config.launch_command()
        if command is None:
            fail(
                f"--config {path} names no rollout to launch ([experiment] rollout and "
                "entrypoint): give --launch CMD, --server URL or TARGET"
            )
        chosen.launch, chosen.launch_cwd = command, config.rollout_dir
    elif not in_process:  # a --launch beside --config runs where the config's entrypoint does
        chosen.launch_cwd = config.rollout_dir
    if not in_process and config.rollout_dir is not None:
        chosen.environment_hint = _venv_hint(config.rollout_dir, f"rollouts/{config.rollout}")
    chosen.env = dict(config.env)
    if in_process and config.env:
        chosen.notes.append("[env]: set only for a server it launches (not with TARGET/--server)")
    if config.unused:
        chosen.notes.append(f"not used: {', '.join(config.unused)}")
    return chosen


def _venv_hint(rollout_dir: Path, shown: str) -> str:
    """Where ``--config`` looks for the rollout's dependencies: its own ``.venv``."""
    if (rollout_dir / ".venv" / "bin" / "python").exists():
        return (
            f"{shown}/.venv, which --config runs the entrypoint with, lacks it: install the "
            "rollout's dependencies there"
        )
    return (
        f"or create {shown}/.venv with the rollout's dependencies (osmosis-ai among them): "
        "--config runs the entrypoint with it (without one: uv run when the rollout has a "
        "pyproject.toml, else this osmosis's own Python)"
    )


def say_config(path: Path, chosen: FromConfig) -> None:
    """One dim line per note, so no key of the config is ignored silently."""
    from rich.markup import escape

    from ._common import stderr_console

    for note in chosen.notes:
        stderr_console().print(f"[dim]--config {escape(str(path))}: {escape(note)}[/]")


def pick(value: Any, configured: Any) -> Any:
    """``configured`` when the config set it, else the option's own value."""
    return value if configured is None else configured
