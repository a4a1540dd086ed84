"""The agent a command works on: TARGET, or ``[tool.osmosis] agent`` of the enclosing project."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ._common import fail

TARGET_HELP = (
    "The agent: [bold]path/to/file.py:Attr[/] or [bold]pkg.module:Attr[/] "
    "(default: `agent` in \\[tool.osmosis] of pyproject.toml)."
)


def agent_target(target: str | None, *, command: str, example: str, other: str = "") -> str:
    """``target`` as given, else the project's configured agent; exits 2 when there is neither.

    The project is the nearest ``pyproject.toml`` above the current directory; when it has a
    ``[tool.osmosis]`` table its root goes on ``sys.path``, so module targets import from
    anywhere inside the project.
    """
    from ..errors import OsmosisError
    from ..project import find_project

    try:
        project = find_project()
    except OsmosisError as exc:
        fail(str(exc))
    if project is not None:
        project.put_root_on_path()
    chosen = target or (project.agent_target() if project is not None else None)
    if not chosen:
        from ..project import workspace_rollouts

        rollouts = workspace_rollouts(Path.cwd()) if project is None else []
        if rollouts:
            first = rollouts[0]
            fail(
                f"missing TARGET: the agent to {command}; this is a workspace's root, and each "
                f"agent project is a folder of rollouts/ ({', '.join(rollouts)})",
                hint=f"cd rollouts/{first} && osmosis {command}"
                + (" -d dataset.jsonl" if command == "test" else "")
                + "  (its [tool.osmosis] names the agent)"
                + (f"; or, from here, osmosis test --config configs/eval/{first}.toml"
                   if command == "test" and (Path("configs/eval") / f"{first}.toml").is_file()
                   else ""),
            )  # fmt: skip
        fail(
            f"missing TARGET: the agent to {command}",
            hint=f"{example}  (or set `agent` in [tool.osmosis] of pyproject.toml)"
            + (f"; {other}" if other else ""),
        )
    return chosen


def project_launch(
    target: str | None, *, server: str | None, launch: str | None
) -> tuple[str | None, Path | None]:
    """The server command to launch and the folder to run it in: ``--launch`` as given (in the
    current folder), else ``[tool.osmosis] launch`` (in the project root) when neither TARGET
    nor ``--server`` is given; ``(None, None)`` for an in-process or ``--server`` run."""
    if launch is not None or target is not None or server is not None:
        return launch, None
    from ..errors import OsmosisError
    from ..project import find_project

    try:
        project = find_project()
    except OsmosisError as exc:
        fail(str(exc))
    if project is None or project.launch is None:
        return None, None
    if project.agent is not None:
        fail(
            f"{project.pyproject}: [tool.osmosis] names both an agent and a launch command: "
            "give TARGET to run the agent in process, or --launch CMD to start the server"
        )
    return project.launch, project.root


def launch_spec(
    command: str | None,
    cwd: Path | None,
    env: dict[str, str] | None = None,
    environment_hint: str | None = None,
    *,
    echo: bool = False,
) -> Any:
    """``--launch``'s command as ``TestOptions.launch`` takes it: run in ``cwd`` (default: the
    current folder) with ``env`` (an eval config's ``[env]``) added to the environment;
    ``environment_hint`` is said when the server dies of a missing module; its output is
    copied to stderr with ``echo`` (``--verbose``)."""
    if command is None or (cwd is None and not env and not environment_hint and not echo):
        return command
    from ..evaluation.launch import LaunchSpec

    return LaunchSpec(
        command,
        cwd=cwd or Path.cwd(),
        env=dict(env or {}),
        environment_hint=environment_hint,
        echo=echo,
    )
