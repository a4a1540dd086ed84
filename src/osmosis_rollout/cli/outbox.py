"""``osmosis outbox list|show|replay``: the completion callbacks a server could not deliver."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from . import app
from ._common import EXIT_OK, EXIT_PROBLEMS, fail, run_async, stderr_console
from ._group import OsmosisGroup

if TYPE_CHECKING:
    from ..server.state import StateBackend

outbox_app = typer.Typer(
    name="outbox",
    cls=OsmosisGroup,
    help="List, show or replay the completion callbacks a server could not deliver.",
    no_args_is_help=True,
    rich_markup_mode="rich",
)
app.add_typer(outbox_app, name="outbox")

StateOption = Annotated[
    str | None,
    typer.Option(
        "--state",
        help="The server's state: memory (the outbox files) or redis://host:port/db (the "
        "shared stream). Also OSMOSIS_STATE or \\[tool.osmosis.serve] state. \\[default: memory]",
        show_default=False,
    ),
]
OutboxDirOption = Annotated[
    Path | None,
    typer.Option(
        "--outbox-dir",
        help="With the memory state: the folder of outbox files. \\[default: .osmosis/outbox]",
        show_default=False,
    ),
]


def _open(state: str | None, outbox_dir: Path | None) -> StateBackend:
    from ..config import ServerSettings, find_pyproject
    from ..errors import OsmosisError
    from ..server.delivery import DEFAULT_OUTBOX_DIR
    from ..server.state import open_state

    cli = {"state": state, "outbox_dir": outbox_dir}
    flags = {"state": "--state", "outbox_dir": "--outbox-dir"}
    try:
        settings = ServerSettings.resolve(
            cli, environ=os.environ, pyproject=find_pyproject(Path.cwd()), flags=flags
        )
        return open_state(settings.state, outbox_dir=settings.outbox_dir or DEFAULT_OUTBOX_DIR)
    except OsmosisError as exc:
        fail(str(exc))


def _entries(backend: StateBackend) -> list[dict[str, Any]]:
    from ..server.state import StateUnavailable

    async def read() -> list[dict[str, Any]]:
        try:
            return [entry.public() for entry in await backend.outbox_list()]
        finally:
            await backend.close()

    try:
        return run_async(read())
    except StateUnavailable as exc:
        fail(str(exc))


@outbox_app.command("list")
def list_command(
    state: StateOption = None,
    outbox_dir: OutboxDirOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
) -> None:
    """Show every kept callback, oldest first, one line each (never the per-rollout key)."""
    import shutil

    from ._outbox_view import lines, store_name

    backend = _open(state, outbox_dir)
    rows = _entries(backend)
    if as_json:
        for row in rows:
            typer.echo(json.dumps(row, ensure_ascii=False))
        raise typer.Exit(EXIT_OK)
    store = store_name(backend)
    if not rows:
        stderr_console().print(f"{store[0].upper()}{store[1:]} is empty.", soft_wrap=True)
        raise typer.Exit(EXIT_OK)
    # Plain text, not a table: a table folds every cell, and an entry over many lines.
    for line in lines(rows, shutil.get_terminal_size().columns):
        typer.echo(line)
    stderr_console().print(
        f"{len(rows)} undelivered callback(s) in {escape(store)}; the whole of one with "
        "[bold]osmosis outbox show ID[/], send them again with [bold]osmosis outbox replay[/].",
        soft_wrap=True,
    )


@outbox_app.command("show")
def show_command(
    ids: Annotated[
        list[str],
        typer.Argument(
            help="Entry ids (as list shows them) or rollout ids.", metavar="ID", show_default=False
        ),
    ],
    state: StateOption = None,
    outbox_dir: OutboxDirOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
) -> None:
    """Show kept callbacks whole: every field and the entire error (never the key)."""
    from ._outbox_view import detail, matches, store_name

    backend = _open(state, outbox_dir)
    rows = [row for row in _entries(backend) if matches(row, set(ids))]
    if not rows:
        fail(
            f"no entry of {store_name(backend)} has the id or rollout id {', '.join(ids)}",
            hint="osmosis outbox list shows the ids",
        )
    for i, row in enumerate(rows):
        if as_json:
            typer.echo(json.dumps(row, ensure_ascii=False))
            continue
        if i:
            typer.echo("")
        for name, value in detail(row):
            typer.echo(f"{name + ':':<11}{value}")


@outbox_app.command("replay")
def replay_command(
    ids: Annotated[
        list[str] | None,
        typer.Argument(
            help="Entry ids (as list shows them) or rollout ids to send (default: all).",
            metavar="ID",
            show_default=False,
        ),
    ] = None,
    state: StateOption = None,
    outbox_dir: OutboxDirOption = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            help="Bearer for TrainGate, for entries that do not keep their own (outbox files "
            "never do).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Send kept callbacks to TrainGate again; delivered ones leave the outbox.

    Exits 1 when any could not be delivered (they stay, with the attempt counted).
    """
    from ..client import RetryPolicy, TrainGateClient
    from ..server.delivery import replay_outbox
    from ..server.state import StateUnavailable
    from ..server.wire import target_factory
    from ._outbox_view import matches

    backend = _open(state, outbox_dir)

    async def replay() -> Any:
        try:
            # The ids ``list`` shows are short; the delivery code knows entries by their full id.
            wanted = set(ids or ())
            full = [e.id for e in await backend.outbox_list() if matches(e.public(), wanted)]
            if wanted and not full:
                return []
            async with TrainGateClient(retry=RetryPolicy(retries=1, base_delay_s=0.5)) as client:
                return await replay_outbox(
                    backend, client, target_of=target_factory(), ids=full, api_key=api_key
                )
        finally:
            await backend.close()

    try:
        outcomes = run_async(replay())
    except StateUnavailable as exc:
        fail(str(exc))
    err = stderr_console()
    if not outcomes:
        err.print("Nothing to replay" + (" with those ids." if ids else ": the outbox is empty."))
        raise typer.Exit(EXIT_OK)
    failed = 0
    for outcome in outcomes:
        rid = escape(outcome.entry.rollout_id)
        if outcome.delivered:
            err.print(f"[green]delivered[/] {rid}")
        else:
            failed += 1
            err.print(f"[red]failed[/]    {rid}: {escape(outcome.error)}", soft_wrap=True)
    err.print(f"{len(outcomes) - failed} delivered, {failed} still in the outbox")
    raise typer.Exit(EXIT_PROBLEMS if failed else EXIT_OK)
