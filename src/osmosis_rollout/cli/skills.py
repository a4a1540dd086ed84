"""``osmosis skills``: the coding agents' skills of a project, listed or brought up to date."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from . import app
from ._common import EXIT_OK, EXIT_PROBLEMS, fail, stdout_console

skills_app = typer.Typer(
    help="The skills a coding agent reads (.agents/skills/, .claude/skills/): list, install.",
    no_args_is_help=True,
)
app.add_typer(skills_app, name="skills")

_DIR_HELP = "The project's folder. \\[default: the nearest pyproject.toml's folder, else .]"


def _project_dir(directory: Path | None) -> Path:
    if directory is not None:
        return directory
    from ..errors import OsmosisError
    from ..project import find_project

    try:
        project = find_project()
    except OsmosisError:
        project = None
    return project.pyproject.parent if project is not None else Path.cwd()


@skills_app.command("list")
def list_command(
    directory: Annotated[
        Path | None, typer.Argument(help=_DIR_HELP, metavar="DIR", show_default=False)
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON on stdout.")] = False,
) -> None:
    """List the skills this version ships and their state in the project.

    A file's state: installed (as shipped), outdated (as an older version wrote it), changed
    (edited by its user) or missing.
    """
    from rich.markup import escape

    from ..agent_files import list_skills
    from ..errors import OsmosisError

    root = _project_dir(directory)
    try:
        skills = list_skills(root)
    except OsmosisError as exc:
        fail(str(exc))
    if json_output:
        typer.echo(json.dumps({"version": 1, "root": str(root), "skills": skills}, indent=2))
        return
    out = stdout_console()
    for skill in skills:
        states = sorted(set(skill.get("files", {}).values()))
        out.print(f"[bold]{skill['name']:<15}[/] {', '.join(states)}")
        out.print(f"  {escape(skill['description'])}", soft_wrap=True)


@skills_app.command("install")
def install_command(
    directory: Annotated[
        Path | None, typer.Argument(help=_DIR_HELP, metavar="DIR", show_default=False)
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Overwrite skill files their user changed too.")
    ] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON on stdout.")] = False,
) -> None:
    """Write or update the skills in a project; keep the files its user changed.

    Exit codes: 0 every skill is as shipped, 1 some changed files were kept (--force
    overwrites them), 2 the folder cannot be written.
    """
    from rich.markup import escape

    from ..agent_files import install_skills
    from ..errors import OsmosisError

    root = _project_dir(directory)
    try:
        report = install_skills(root, force=force)
    except OsmosisError as exc:
        fail(str(exc))
    if json_output:
        typer.echo(json.dumps(report.as_dict(), indent=2))
    else:
        out = stdout_console()
        for path, action in report.files.items():
            out.print(f"  {action:<11} {escape(path)}", soft_wrap=True)
        if report.kept:
            out.print("Kept the files above marked kept: you changed them. --force overwrites.")
    raise typer.Exit(EXIT_PROBLEMS if report.kept else EXIT_OK)
