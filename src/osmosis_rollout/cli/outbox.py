"""``osmosis outbox list|replay``: the completion callbacks a server could not deliver."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from . import app
from ._common import EXIT_OK, EXIT_PROBLEMS, fail, run_async, stderr_console, stdout_console
from ._group import OsmosisGroup

if TYPE_CHECKING:
    from ..server.state import StateBackend

outbox_app = typer.Typer(
    name="outbox",
    cls=OsmosisGroup,
    help="List or replay the completion callbacks a server could not deliver.",
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


@outbox_app.command("list")
def list_command(
    state: StateOption = None,
    outbox_dir: OutboxDirOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
) -> None:
    """Show every kept callback, oldest first (never the per-rollout key)."""
    from ..server.state import StateUnavailable

    backend = _open(state, outbox_dir)

    async def read() -> list[dict[str, Any]]:
        try:
            return [entry.public() for entry in await backend.outbox_list()]
        finally:
            await backend.close()

    try:
        rows = run_async(read())
    except StateUnavailable as exc:
        fail(str(exc))
    out = stdout_console()
    if as_json:
        for row in rows:
            typer.echo(json.dumps(row, ensure_ascii=False))
        raise typer.Exit(EXIT_OK)
    if not rows:
        stderr_console().print(f"The outbox of {backend.describe()} is empty.")
        raise typer.Exit(EXIT_OK)
    out.print(_table(rows))
    stderr_console().print(
        f"{len(rows)} undelivered callback(s) in {backend.describe()}; "
        "send them again with [bold]osmosis outbox replay[/]."
    )


def _table(rows: list[dict[str, Any]]) -> Any:
    import time

    from rich.markup import escape
    from rich.table import Table

    table = Table(show_edge=False, pad_edge=False)
    for column in ("rollout", "status", "attempts", "written (UTC)", "next try", "error", "id"):
        table.add_column(column, overflow="fold")
    for row in rows:
        written = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(row["written_at"]))
        if row["next_at"] is None:
            next_try = "on replay"
        else:
            next_try = f"in {max(0.0, row['next_at'] - time.time()):.0f} s"
        status = f"{row['status']}/{row['finish_reason']}"
        table.add_row(
            escape(row["rollout_id"]),
            escape(status),
            str(row["attempts"]),
            written,
            next_try,
            escape(row["error"][:120]),
            escape(row["id"]),
        )
    return table


@outbox_app.command("replay")
def replay_command(
    ids: Annotated[
        list[str] | None,
        typer.Argument(
            help="Entry ids or rollout ids to send (default: all).",
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
    from rich.markup import escape

    from ..client import RetryPolicy, TrainGateClient
    from ..server.delivery import replay_outbox
    from ..server.state import StateUnavailable
    from ..server.wire.v1 import V1

    backend = _open(state, outbox_dir)

    async def replay() -> Any:
        try:
            async with TrainGateClient(retry=RetryPolicy(retries=1, base_delay_s=0.5)) as client:
                return await replay_outbox(
                    backend, client, target_of=V1().target_of, ids=ids or (), api_key=api_key
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
