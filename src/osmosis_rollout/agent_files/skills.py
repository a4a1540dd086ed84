"""The skills a project carries for coding agents, and how they reach an existing project.

A skill is a folder with a ``SKILL.md`` whose front matter gives its ``name`` and a
``description`` (when to use it), the format Claude Code, Codex and Cursor read. They ship in
this package (``agent_files/skills/NAME/SKILL.md``) and are written to two places in a project:
``.agents/skills/`` (read by Codex, Cursor and others) and ``.claude/skills/`` (Claude Code).

The second is a copy, not a symlink: a symlink in a zip archive is dropped or stored as a file
holding its target's path, and on Windows git checks one out as such a file unless developer mode
and ``core.symlinks`` are on; either way Claude Code would find no skill. A copy works
everywhere, and the manifest below keeps the two in step.

``.agents/osmosis-skills.json`` records the SHA-256 of every file as it was last written, so
:func:`install_skills` can tell a file its user changed (its hash is no longer the recorded
one) from a stale one (still as written): it updates the stale ones and keeps changed ones
unless forced.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Any, Final, Literal

from ..errors import ConfigError

__all__ = [
    "MANIFEST",
    "SKILL_ROOTS",
    "FileAction",
    "InstallReport",
    "Skill",
    "install_skills",
    "list_skills",
    "skill_files",
]

#: Where a project keeps its skills: the shared folder, then Claude Code's copy.
SKILL_ROOTS: Final = (PurePosixPath(".agents/skills"), PurePosixPath(".claude/skills"))
#: What was last written, with hashes (see the module's docstring).
MANIFEST: Final = PurePosixPath(".agents/osmosis-skills.json")
_MANIFEST_VERSION: Final = 1
_FRONT_MATTER = re.compile(r"\A---\n(?P<body>.*?)\n---\n", re.DOTALL)

#: What :func:`install_skills` did to one file: written (it was missing), updated (it was as
#: last written, and stale), unchanged, kept (its user changed it; ``--force`` overwrites),
#: overwritten (changed by its user, and forced).
FileAction = Literal["written", "updated", "unchanged", "kept", "overwritten"]


@dataclass(frozen=True)
class Skill:
    """One skill: its folder name, its front matter's description, its ``SKILL.md`` text."""

    name: str
    description: str
    text: str


def _front_matter(text: str, where: str) -> dict[str, str]:
    match = _FRONT_MATTER.match(text)
    if match is None:
        raise ConfigError(f"{where} has no front matter (--- name: ... description: ... ---)")
    fields: dict[str, str] = {}
    for line in match.group("body").splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip():
            fields[key.strip()] = value.strip()
    return fields


def packaged_skills() -> list[Skill]:
    """The skills this version ships, by name; each ``SKILL.md``'s front matter checked."""
    found = []
    root = resources.files(__package__).joinpath("skills")
    for folder in sorted(root.iterdir(), key=lambda f: f.name):
        skill_md = folder.joinpath("SKILL.md")
        if not skill_md.is_file():
            continue
        text = skill_md.read_text(encoding="utf-8")
        meta = _front_matter(text, f"skills/{folder.name}/SKILL.md")
        if meta.get("name") != folder.name or not meta.get("description"):
            raise ConfigError(
                f"skills/{folder.name}/SKILL.md must set name: {folder.name} and a description"
            )
        found.append(Skill(folder.name, meta["description"], text))
    return found


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _wanted() -> dict[PurePosixPath, str]:
    return {
        root / skill.name / "SKILL.md": skill.text
        for skill in packaged_skills()
        for root in SKILL_ROOTS
    }


def _manifest_text(hashes: dict[PurePosixPath, str]) -> str:
    data = {
        "version": _MANIFEST_VERSION,
        "note": "written by `osmosis skills install`: the SHA-256 of each file as last written",
        "files": {str(path): digest for path, digest in sorted(hashes.items())},
    }
    return json.dumps(data, indent=2) + "\n"


def skill_files() -> dict[PurePosixPath, str]:
    """Every skill file of a new project, with its manifest: relative path -> text."""
    wanted = _wanted()
    files = dict(wanted)
    files[MANIFEST] = _manifest_text({path: _sha256(text) for path, text in wanted.items()})
    return files


def _read_manifest(root: Path) -> dict[str, str]:
    path = root / MANIFEST
    if not path.is_file():
        return {}
    try:
        data: Any = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(
            f"{path} cannot be read ({exc}); delete it and run osmosis skills install --force"
        ) from None
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, dict):
        raise ConfigError(f"{path} has no `files` table; delete it and run it again with --force")
    return {str(k): str(v) for k, v in files.items()}


@dataclass
class InstallReport:
    """What :func:`install_skills` did: one action per file, relative to the project root."""

    root: Path
    files: dict[str, FileAction] = field(default_factory=dict)

    @property
    def kept(self) -> list[str]:
        """The files left as their user changed them (``--force`` would overwrite them)."""
        return [path for path, action in self.files.items() if action == "kept"]

    def as_dict(self) -> dict[str, Any]:
        return {
            "version": 1,
            "root": str(self.root),
            "files": [{"path": path, "action": action} for path, action in self.files.items()],
            "kept": self.kept,
        }


def install_skills(root: Path, *, force: bool = False) -> InstallReport:
    """Write or update the skills in the project at ``root``; keep files its user changed.

    ``ConfigError`` when ``root`` is not a folder or a file cannot be written.
    """
    root = Path(root)
    if not root.is_dir():
        raise ConfigError(f"{root} is not a folder; give the project's folder")
    recorded = _read_manifest(root)
    report = InstallReport(root)
    hashes: dict[PurePosixPath, str] = {}
    try:
        for relative, text in _wanted().items():
            path = root.joinpath(*relative.parts)
            digest = _sha256(text)
            action: FileAction
            if not path.exists():
                action = "written"
            else:
                current = _sha256(path.read_text(encoding="utf-8", errors="replace"))
                if current == digest:
                    action = "unchanged"
                elif current == recorded.get(str(relative)):
                    action = "updated"
                else:
                    action = "overwritten" if force else "kept"
            if action == "kept":
                hashes[relative] = recorded.get(str(relative), "")
            else:
                if action != "unchanged":
                    path.parent.mkdir(parents=True, exist_ok=True)
                    with path.open("w", encoding="utf-8", newline="\n") as handle:
                        handle.write(text)
                hashes[relative] = digest
            report.files[str(relative)] = action
        manifest = root.joinpath(*MANIFEST.parts)
        manifest.parent.mkdir(parents=True, exist_ok=True)
        with manifest.open("w", encoding="utf-8", newline="\n") as handle:
            handle.write(_manifest_text({p: h for p, h in hashes.items() if h}))
    except OSError as exc:
        raise ConfigError(f"cannot write the skills in {root}: {exc.strerror or exc}") from None
    return report


#: A skill's state in a project: as this version ships it, stale (as last written by an older
#: version), changed by its user, or missing.
SkillState = Literal["installed", "outdated", "changed", "missing"]


def list_skills(root: Path | None = None) -> list[dict[str, Any]]:
    """Every shipped skill, and (with ``root``) its state in that project, per skill folder."""
    recorded = _read_manifest(root) if root is not None else {}
    listed = []
    for skill in packaged_skills():
        entry: dict[str, Any] = {"name": skill.name, "description": skill.description}
        if root is not None:
            states: dict[str, SkillState] = {}
            for skill_root in SKILL_ROOTS:
                relative = skill_root / skill.name / "SKILL.md"
                path = root.joinpath(*relative.parts)
                if not path.is_file():
                    states[str(relative)] = "missing"
                    continue
                current = _sha256(path.read_text(encoding="utf-8", errors="replace"))
                if current == _sha256(skill.text):
                    states[str(relative)] = "installed"
                elif current == recorded.get(str(relative)):
                    states[str(relative)] = "outdated"
                else:
                    states[str(relative)] = "changed"
            entry["files"] = states
        listed.append(entry)
    return listed
