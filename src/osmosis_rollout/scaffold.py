"""``osmosis init``: render a project template into a new folder, all or nothing.

A template is a folder under ``templates/`` (shipped in the wheel as
``osmosis_rollout/templates``) holding a ``template.toml`` with a one-line ``description`` and the
project's files. Placeholders are upper-case dunder words (``__PACKAGE__``, ``__CLASS__``...) so
that the template's own Python stays valid and lint-checked; they are replaced in file contents
and in file and folder names. Every file is rendered in memory first, then written into a
temporary folder next to the destination, which is renamed into place: a failure at any step
leaves nothing behind.
"""

from __future__ import annotations

import keyword
import re
import secrets
import shutil
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ._version import __version__
from .errors import ConfigError

__all__ = [
    "DEFAULT_TEMPLATE",
    "LAYOUTS",
    "ProjectNames",
    "TemplateInfo",
    "agent_files",
    "create_project",
    "default_templates_dir",
    "list_templates",
    "project_names",
    "render_template",
    "workspace_project",
]

DEFAULT_TEMPLATE = "tools"
#: The template's own description file; it is not copied into the project.
TEMPLATE_META = "template.toml"
_PLACEHOLDER = re.compile(r"__([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*)__")
_DIST_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")
_SKIPPED = frozenset({"__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache", ".DS_Store"})
# Names a generated package must not take: they would shadow the toolkit, its dependencies or
# the project's own tests folder once the project root is on sys.path.
_RESERVED = frozenset(
    {
        "osmosis",
        "osmosis_rollout",
        "tests",
        "anyio",
        "httpx",
        "httpx2",
        "jsonschema",
        "prompt_toolkit",
        "pydantic",
        "pydantic_settings",
        "pytest",
        "rich",
        "starlette",
        "typer",
        "uvicorn",
    }
)


@dataclass(frozen=True)
class TemplateInfo:
    """One template: its name (``--template NAME``), a one-line description, its folder."""

    name: str
    description: str
    path: Path


@dataclass(frozen=True)
class ProjectNames:
    """The names derived from ``osmosis init NAME``: ``my-agent`` -> ``my_agent``, ``MyAgent``."""

    project: str  # distribution name and agent ``name``, as given: "my-agent"
    package: str  # import name: "my_agent"
    class_name: str  # the agent class: "MyAgent"

    @property
    def target(self) -> str:
        """The agent target ``serve``/``test``/``validate`` take: ``my_agent.agent:MyAgent``."""
        return f"{self.package}.agent:{self.class_name}"

    def placeholders(self) -> dict[str, str]:
        """What each ``__WORD__`` in a template becomes."""
        return {
            "PROJECT": self.project,
            "PACKAGE": self.package,
            "CLASS": self.class_name,
            "TARGET": self.target,
            "OSMOSIS_VERSION": __version__,
        }


def default_templates_dir() -> Path:
    """The folder holding the templates: package data in a wheel, ``templates/`` in a checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "templates", here.parents[1] / "templates"):
        if candidate.is_dir() and any(candidate.glob(f"*/{TEMPLATE_META}")):
            return candidate
    raise ConfigError(
        "the project templates are missing from this installation of osmosis-rollout; "
        "reinstall it (pip install --force-reinstall osmosis-rollout)"
    )


def list_templates(templates_dir: Path | None = None) -> list[TemplateInfo]:
    """Every template, the default first, then by name."""
    root = templates_dir or default_templates_dir()
    found = []
    for meta in sorted(root.glob(f"*/{TEMPLATE_META}")):
        try:
            data = tomllib.loads(meta.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read template description {meta}: {exc}") from None
        description = data.get("description")
        if not isinstance(description, str):
            raise ConfigError(f"{meta} must set `description` to a one-line string")
        found.append(TemplateInfo(meta.parent.name, description.strip(), meta.parent))
    found.sort(key=lambda t: (t.name != DEFAULT_TEMPLATE, t.name))
    return found


def project_names(name: str) -> ProjectNames:
    """Check ``name`` and derive the package and class names; ``ConfigError`` with a suggestion."""
    problem = _name_problem(name)
    if problem is not None:
        suggestion = _suggest(name)
        raise ConfigError(
            f"{name!r} cannot name an agent project: {problem}; try {suggestion!r} "
            f"(osmosis init {suggestion})"
        )
    package = _package_of(name)
    words = [w for w in package.split("_") if w]
    class_name = "".join(w[:1].upper() + w[1:] for w in words)
    if not class_name.endswith("Agent"):
        class_name += "Agent"
    return ProjectNames(project=name, package=package, class_name=class_name)


def _package_of(name: str) -> str:
    return re.sub(r"[-.]+", "_", name).lower()


def _name_problem(name: str) -> str | None:
    if not name.strip():
        return "it is empty"
    if not _DIST_NAME.match(name):
        return (
            "use only letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
        )
    package = _package_of(name)
    if package[0].isdigit():
        return f"the Python package {package!r} would start with a digit"
    if not package.isidentifier() or not package.isascii():
        return f"{package!r} is not a valid Python package name"
    if keyword.iskeyword(package) or keyword.issoftkeyword(package):
        return f"{package!r} is a Python keyword"
    if package in sys.stdlib_module_names:
        return f"the package {package!r} would shadow Python's standard library module"
    if package in _RESERVED:
        return f"the package {package!r} would shadow a module the project needs"
    return None


def _suggest(name: str) -> str:
    """A close name that passes the checks: ``'My Agent'`` -> ``'my-agent'``."""
    base = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    if not base:
        return "my-agent"
    if base[0].isdigit():
        base = f"agent-{base}"
    if _name_problem(base) is not None:
        base = f"{base}-agent"
    return base if _name_problem(base) is None else "my-agent"


def create_project(
    dest: Path,
    *,
    name: str,
    template: str = DEFAULT_TEMPLATE,
    templates_dir: Path | None = None,
    layout: str = "project",
) -> list[Path]:
    """Create the project ``name`` in ``dest`` from ``template``; return the files written.

    ``layout`` is ``project`` (the template's files in ``dest``) or ``workspace`` (the Osmosis
    platform's layout: the project in ``dest/rollouts/<name>/`` with the ``main.py`` the
    platform starts, and ``configs/eval/<name>.toml``, ``configs/training/<name>.toml``).
    ``dest`` must not exist or be an empty folder, and its parent must exist. Raises
    ``ConfigError`` (bad name, unknown template or layout, existing files, a write that
    failed); in every failure case nothing is left behind.
    """
    if layout not in LAYOUTS:
        raise ConfigError(f"unknown layout {layout!r}; choose one of: {', '.join(LAYOUTS)}")
    names = project_names(name)
    info = _find_template(template, templates_dir)
    dest = Path(dest).absolute()
    _check_destination(dest)
    rendered = render_template(info, names.placeholders())
    rendered.update(agent_files(info, names, rendered))
    if layout == "workspace":
        rendered = _in_workspace(rendered, names, templates_dir or info.path.parent)
    _write_all(dest, rendered)
    return sorted((dest / relative for relative in rendered), key=lambda p: str(p).lower())


#: ``osmosis init --layout``: a project folder, or the platform's workspace around one.
LAYOUTS = ("project", "workspace")
#: The folder (beside the templates, with no ``template.toml``) of the workspace's own files.
WORKSPACE_FILES = "_workspace"


def workspace_project(names: ProjectNames) -> PurePosixPath:
    """Where a workspace keeps the project: ``rollouts/<name>``."""
    return PurePosixPath("rollouts", names.project)


def _in_workspace(
    project: Mapping[PurePosixPath, str], names: ProjectNames, templates_dir: Path
) -> dict[PurePosixPath, str]:
    """The template's files moved under ``rollouts/<name>/``, with the workspace's own and
    ``data/<name>.jsonl``: the rows of the dataset ``configs/eval/<name>.toml`` names (the
    template's ``dataset.jsonl``), so ``osmosis test --config`` finds them as on the platform."""
    folder = templates_dir / WORKSPACE_FILES
    if not folder.is_dir():
        raise ConfigError(
            f"the workspace layout's files ({folder}) are missing from this installation; "
            "reinstall osmosis-rollout"
        )
    info = TemplateInfo(WORKSPACE_FILES, "the platform's workspace", folder)
    rendered = {workspace_project(names) / relative: text for relative, text in project.items()}
    for relative, text in render_template(info, names.placeholders()).items():
        if relative in rendered:
            raise ConfigError(
                f"the template and the workspace layout both write {relative}; rename one"
            )
        rendered[relative] = text
    rows = project.get(PurePosixPath("dataset.jsonl"))
    if rows is not None:  # the platform dataset the eval config names, as a workspace keeps it
        rendered[PurePosixPath("data", f"{names.project}.jsonl")] = rows
    return rendered


def agent_files(
    info: TemplateInfo, names: ProjectNames, rendered: Mapping[PurePosixPath, str]
) -> dict[PurePosixPath, str]:
    """The files for coding agents a project gets when its template has an ``[agents]`` table
    (every shipped template does): ``AGENTS.md`` (with the table's ``contract``), ``CLAUDE.md``
    and the skills. A file the template ships itself is kept as the template has it."""
    from .agent_files import agent_guide_files, skill_files

    meta = info.path / TEMPLATE_META
    try:
        data = tomllib.loads(meta.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read template description {meta}: {exc}") from None
    agents = data.get("agents")
    if agents is None:
        return {}
    contract = agents.get("contract", "") if isinstance(agents, dict) else None
    if not isinstance(contract, str):
        raise ConfigError(f"{meta}: [agents] contract must be a string of Markdown")
    where = f"template {info.name!r}, [agents] contract"
    guide = agent_guide_files(
        template=info.name,
        target=names.target,
        contract=_substitute(contract, names.placeholders(), where),
        readme=rendered.get(PurePosixPath("README.md"), ""),
    )
    files = {**guide, **skill_files()}
    return {path: text for path, text in files.items() if path not in rendered}


def _find_template(name: str, templates_dir: Path | None) -> TemplateInfo:
    available = list_templates(templates_dir)
    for info in available:
        if info.name == name:
            return info
    known = ", ".join(t.name for t in available) or "(none)"
    raise ConfigError(f"unknown template {name!r}; choose one of: {known}")


def _check_destination(dest: Path) -> None:
    if dest.exists() or dest.is_symlink():
        if not dest.is_dir():
            raise ConfigError(f"{dest} exists and is not a folder; choose another --path")
        if any(dest.iterdir()):
            raise ConfigError(
                f"{dest} already exists and is not empty; choose another name or --path "
                "(osmosis init never overwrites files)"
            )
    if not dest.parent.is_dir():
        raise ConfigError(f"the parent folder {dest.parent} does not exist; create it first")


def render_template(info: TemplateInfo, values: Mapping[str, str]) -> dict[PurePosixPath, str]:
    """Every file of the template, rendered: relative path -> text. Nothing is written."""
    rendered: dict[PurePosixPath, str] = {}
    for path in sorted(info.path.rglob("*")):
        relative = path.relative_to(info.path)
        if path.is_dir() or _skipped(relative) or relative == Path(TEMPLATE_META):
            continue
        where = f"template {info.name!r}, file {relative.as_posix()}"
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read {where}: {exc}") from None
        target = PurePosixPath(_substitute(relative.as_posix(), values, where))
        if target in rendered:
            raise ConfigError(f"{where} renders to {target}, which another file also renders to")
        rendered[target] = _substitute(text, values, where)
    if not rendered:
        raise ConfigError(f"template {info.name!r} in {info.path} has no files")
    return rendered


def _skipped(relative: Path) -> bool:
    return any(part in _SKIPPED for part in relative.parts) or relative.suffix == ".pyc"


def _substitute(text: str, values: Mapping[str, str], where: str) -> str:
    def replace(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in values:
            known = ", ".join(f"__{k}__" for k in values)
            raise ConfigError(
                f"{where} uses the unknown placeholder {match.group(0)}; known: {known}"
            )
        return values[key]

    return _PLACEHOLDER.sub(replace, text)


def _write_all(dest: Path, rendered: Mapping[PurePosixPath, str]) -> None:
    """Write into a temporary folder beside ``dest``, then rename it (or its entries) into place."""
    staging = dest.parent / f".{dest.name}.{secrets.token_hex(4)}.osmosis-init"
    try:
        staging.mkdir()  # default permissions, unlike mkdtemp's private 0o700
    except OSError as exc:
        raise ConfigError(f"cannot create files in {dest.parent}: {exc.strerror or exc}") from None
    try:
        for relative, text in rendered.items():
            file = staging.joinpath(*relative.parts)
            file.parent.mkdir(parents=True, exist_ok=True)
            with file.open("w", encoding="utf-8", newline="\n") as handle:
                handle.write(text)
        if dest.is_dir():
            _move_contents(staging, dest)
        else:
            staging.rename(dest)
    except OSError as exc:
        raise ConfigError(f"cannot write the project to {dest}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _move_contents(staging: Path, dest: Path) -> None:
    """Fill an existing empty ``dest`` (it may be the shell's current folder, so keep it)."""
    moved: list[Path] = []
    try:
        for entry in sorted(staging.iterdir()):
            target = dest / entry.name
            entry.rename(target)
            moved.append(target)
    except OSError:
        for target in reversed(moved):
            target.rename(staging / target.name)
        raise
