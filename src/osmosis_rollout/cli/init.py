"""``osmosis init``: create a new agent project from a template."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Annotated

import typer

from . import app
from ._common import fail, stdout_console

#: Shown in --help without importing scaffold (kept equal to scaffold.DEFAULT_TEMPLATE by a test).
_DEFAULT_TEMPLATE = "tools"


@app.command("init")
def init_command(
    name: Annotated[
        str | None,
        typer.Argument(
            help="Project name, e.g. [bold]my-agent[/] (its Python package is my_agent).",
            metavar="NAME",
            show_default=False,
        ),
    ] = None,
    template: Annotated[
        str | None,
        typer.Option(
            "--template",
            "-t",
            help=f"The template (see --list-templates). \\[default: {_DEFAULT_TEMPLATE}]",
            show_default=False,
        ),
    ] = None,
    path: Annotated[
        Path | None,
        typer.Option(
            "--path",
            "-p",
            help="The project folder to create; it must not exist or be empty. \\[default: ./NAME]",
            show_default=False,
        ),
    ] = None,
    list_templates: Annotated[
        bool, typer.Option("--list-templates", help="List the templates and exit.")
    ] = False,
    layout: Annotated[
        str,
        typer.Option(
            "--layout",
            help="project: the template's files in the folder; workspace: the Osmosis "
            "platform's layout (rollouts/NAME/ with its main.py, configs/eval/NAME.toml, "
            "configs/training/NAME.toml).",
        ),
    ] = "project",
    json_output: Annotated[
        bool, typer.Option("--json", help="Print what was created (or the templates) as JSON.")
    ] = False,
) -> None:
    """Create a new agent project that passes validate, test and its own tests at once.

    A bad name, an unknown template or a non-empty folder: exit 2, and nothing is written.
    """
    from rich.markup import escape

    from ..errors import OsmosisError
    from ..scaffold import DEFAULT_TEMPLATE, create_project, project_names
    from ..scaffold import list_templates as templates

    template = template or DEFAULT_TEMPLATE

    out = stdout_console()
    out.soft_wrap = True  # paths and commands stay on one line, ready to copy
    try:
        if list_templates:
            if json_output:
                listed = [
                    {"name": i.name, "description": i.description}
                    | {"default": i.name == DEFAULT_TEMPLATE}
                    for i in templates()
                ]
                typer.echo(json.dumps({"version": 1, "templates": listed}, indent=2))
                return
            for info in templates():
                default = " [dim](default)[/]" if info.name == DEFAULT_TEMPLATE else ""
                out.print(f"[bold]{info.name:<10}[/] {escape(info.description)}{default}")
            return
        if name is None:
            fail("missing NAME: the project to create", hint="osmosis init my-agent")
        names = project_names(name)
        dest = (path or Path(name)).absolute()
        files = create_project(dest, name=name, template=template, layout=layout)
    except OsmosisError as exc:
        fail(str(exc))
    shown = _shown(dest)
    if json_output:
        created = {
            "version": 1,
            "project": name,
            "template": template,
            "layout": layout,
            "path": str(dest),
            "target": names.target,
            "files": [file.relative_to(dest).as_posix() for file in files],
        }
        typer.echo(json.dumps(created, indent=2))
        return
    where = escape(shown)
    laid_out = " (the platform's workspace layout)" if layout == "workspace" else ""
    out.print(
        f"Created [bold]{escape(name)}[/] from the {escape(template)} template in "
        f"{where}{laid_out}:"
    )
    skills, skills_in = 0, ""
    for file in files:
        relative = file.relative_to(dest).as_posix()
        folder_of_skills = re.match(r"(.*?)\.(?:agents|claude)/", relative)
        if folder_of_skills:  # the skills' 9 files are summed up in one line below
            skills_in = folder_of_skills.group(1)
            skills += relative.endswith("/SKILL.md")
            continue
        out.print(f"  {escape(relative)}")
    if skills:
        out.print(
            f"  {escape(skills_in)}.agents/skills/, {escape(skills_in)}.claude/skills/: "
            f"{skills // 2} skills for coding agents"
        )
    # The project names its agent in [tool.osmosis]: inside it, commands need no TARGET.
    named = escape("([tool.osmosis] agent)")
    project, inside = dest, "pyproject.toml"
    if layout == "workspace":
        from ..scaffold import workspace_project

        folder = workspace_project(names)
        project, inside = dest.joinpath(*folder.parts), f"{folder}/pyproject.toml"
    out.print(f"\nIts agent, {names.target}, is named in {escape(inside)} {named}.")
    if layout == "workspace":
        out.print(
            f"The platform starts it as: _OSMOSIS_ROLLOUT_PORT=8000 python "
            f"{escape(f'{folder}/main.py')} (see osmosis-rollout's docs/platform.md)."
        )
    out.print("Next:")
    out.print(f"  cd {escape(shlex.quote(_shown(project)))}")
    out.print("  osmosis validate")
    out.print("  osmosis test --dataset dataset.jsonl")


def _shown(dest: Path) -> str:
    """``dest`` relative to the current folder when it is below it, else absolute."""
    try:
        return str(dest.relative_to(Path.cwd().absolute())) or "."
    except ValueError:
        return str(dest)
