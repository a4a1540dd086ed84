"""The agent a command works on: TARGET, or ``[tool.osmosis] agent`` of the enclosing project."""

from __future__ import annotations

from ._common import fail

TARGET_HELP = (
    "The agent: [bold]path/to/file.py:Attr[/] or [bold]pkg.module:Attr[/] "
    "(default: `agent` in \\[tool.osmosis] of pyproject.toml)."
)


def agent_target(target: str | None, *, command: str, example: str) -> str:
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
        fail(
            f"missing TARGET: the agent to {command}",
            hint=f"{example}  (or set `agent` in [tool.osmosis] of pyproject.toml)",
        )
    return chosen
