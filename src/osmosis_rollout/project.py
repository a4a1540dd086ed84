"""The user's project: the nearest ``pyproject.toml``, found from any subfolder as uv and ruff do.

``serve``, ``test`` and ``validate`` share it so that, anywhere inside a generated project,
``osmosis validate`` (no TARGET) checks the agent named by ``[tool.osmosis] agent`` and a module
target such as ``my_agent.agent:MyAgent`` imports from the project root, not from the folder the
command happens to run in.
"""

from __future__ import annotations

import os
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from .config import find_pyproject
from .errors import AgentLoadError, ConfigError
from .loader import is_file_target, parse_target

__all__ = ["Project", "find_project", "workspace_rollouts"]


@dataclass(frozen=True)
class Project:
    """A ``pyproject.toml`` and what osmosis reads from it before any settings."""

    pyproject: Path
    #: ``[tool.osmosis] agent`` as written in the file, or None.
    agent: str | None
    #: True when the file has a ``[tool.osmosis]`` table: only then is the root put on sys.path.
    configured: bool
    #: ``[tool.osmosis] launch``: the command that starts the project's rollout server (any
    #: server, whatever wrote it) for ``osmosis test``, run in the project root; or None.
    launch: str | None = None

    @property
    def root(self) -> Path:
        return self.pyproject.parent

    def agent_target(self, cwd: Path | None = None) -> str | None:
        """The configured agent as a target usable from ``cwd``: a file path is made relative
        to it (it is written relative to the project root), a module target is unchanged."""
        if self.agent is None:
            return None
        module_or_path, attr = parse_target(self.agent)
        if not is_file_target(module_or_path):
            return self.agent
        here = (cwd or Path.cwd()).resolve()
        path = Path(os.path.relpath(self.root / module_or_path, here))
        return f"{path.as_posix()}:{attr}"

    def put_root_on_path(self) -> None:
        """Let module targets import from the project root, after the current directory."""
        root = str(self.root)
        if self.configured and root not in sys.path:
            sys.path.insert(0, root)


def find_project(start: Path | None = None) -> Project | None:
    """The project around ``start`` (default: the current directory), or None outside one.

    A ``pyproject.toml`` that cannot be read, or whose ``agent`` is not a string target, is a
    ``ConfigError`` naming the file: a typo there must not silently fall back to nothing.
    """
    pyproject = find_pyproject(start or Path.cwd())
    if pyproject is None:
        return None
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {pyproject}: {exc}") from None
    tool = data.get("tool")
    table = tool.get("osmosis") if isinstance(tool, dict) else None
    if not isinstance(table, dict):
        return Project(pyproject, None, configured=False)
    agent = table.get("agent")
    if agent is not None and (not isinstance(agent, str) or not agent.strip()):
        raise ConfigError(
            f"{pyproject}: [tool.osmosis] agent must be a target string such as "
            '"my_agent.agent:MyAgent"'
        )
    if agent is not None:
        try:
            parse_target(agent)
        except AgentLoadError as exc:
            raise ConfigError(f"{pyproject}: [tool.osmosis] agent: {exc}") from None
    launch = table.get("launch")
    if launch is not None and (not isinstance(launch, str) or not launch.strip()):
        raise ConfigError(
            f"{pyproject}: [tool.osmosis] launch must be the server's command, such as "
            '"python main.py"'
        )
    return Project(
        pyproject,
        agent.strip() if agent else None,
        configured=True,
        launch=launch.strip() if launch else None,
    )


def workspace_rollouts(folder: Path) -> list[str]:
    """The rollouts of the workspace whose root is ``folder`` (``osmosis init --layout
    workspace``, as the official template lays one out): its ``rollouts/NAME`` folders that are
    projects, sorted; none when ``folder`` is not such a root."""
    root = folder / "rollouts"
    if not (folder / "configs").is_dir() or not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / "pyproject.toml").is_file())
