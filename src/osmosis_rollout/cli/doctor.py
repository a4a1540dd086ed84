"""``osmosis doctor``: one command that says what is wrong before anything else is tried."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from . import app
from ._common import EXIT_OK, EXIT_PROBLEMS, run_async, stdout_console
from ._target import TARGET_HELP

_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red"}


@app.command("doctor")
def doctor_command(
    target: Annotated[
        str | None, typer.Argument(help=TARGET_HELP, metavar="TARGET", show_default=False)
    ] = None,
    dataset: Annotated[
        Path | None,
        typer.Option(
            "--dataset",
            "-d",
            help="The rows to read. \\[default: dataset.jsonl]",
            show_default=False,
        ),
    ] = None,
    llm_url: Annotated[
        str | None,
        typer.Option(help="The model server to reach (else OPENAI_BASE_URL).", show_default=False),
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON on stdout.")] = False,
) -> None:
    """Check this machine and this project before anything else is tried.

    Python and packages, the agent and validate's static checks, the dataset, the optional
    programs, the LLM and the port: each check is ok, warn or fail with a reason and a fix.

    Exit codes: 0 nothing failed (warnings allowed), 1 a check failed.
    """
    from rich.markup import escape

    from ..doctor import run_doctor

    report = run_async(run_doctor(target=target, dataset=dataset, llm_url=llm_url))
    if json_output:
        typer.echo(json.dumps(report.as_dict(), indent=2))
    else:
        out = stdout_console()
        for check in report.checks:
            style = _STYLE[check.status]
            out.print(
                f"[{style}]{check.status:<4}[/] [bold]{check.name:<12}[/] {escape(check.reason)}",
                soft_wrap=True,
            )
            if check.status != "ok" and check.fix:
                out.print(f"{'':17} fix: {escape(check.fix)}", soft_wrap=True)
    raise typer.Exit(EXIT_OK if report.ok else EXIT_PROBLEMS)
