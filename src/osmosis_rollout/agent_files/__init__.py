"""The files a project carries for the coding agents that work on it (Claude Code, Codex, Cursor).

``guide.py`` renders ``AGENTS.md`` (the agent contract, the layout, the commands in the order a
change is checked, every finding from the one findings table) and the ``CLAUDE.md`` that points
at it; ``skills.py`` holds the skills (``.agents/skills/NAME/SKILL.md``, copied to
``.claude/skills/``) and installs them into an existing project without overwriting a file its
user changed. ``osmosis init`` adds all of them to every project it renders.
"""

from __future__ import annotations

from .guide import agent_guide_files, render_agents_md
from .skills import (
    SKILL_ROOTS,
    InstallReport,
    Skill,
    install_skills,
    list_skills,
    skill_files,
)

__all__ = [
    "SKILL_ROOTS",
    "InstallReport",
    "Skill",
    "agent_guide_files",
    "install_skills",
    "list_skills",
    "render_agents_md",
    "skill_files",
]
