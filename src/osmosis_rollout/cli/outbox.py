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


def _open(
    state: str | None, outbox_dir: Path | None, traingate: list[str] | None = None
) -> tuple[StateBackend, tuple[str, ...]]:
    """The outbox's store, and the TrainGate allow-list (``--traingate``, the environment,
    ``[tool.osmosis]``: the same setting ``serve`` reads)."""
    from ..config import ServerSettings, find_pyproject
    from ..errors import OsmosisError
    from ..server.delivery import DEFAULT_OUTBOX_DIR
    from ..server.state import open_state

    cli = {"state": state, "outbox_dir": outbox_dir, "traingate": traingate or None}
    flags = {"state": "--state", "outbox_dir": "--outbox-dir", "traingate": "--traingate"}
    try:
        settings = ServerSettings.resolve(
            cli,
            environ=os.environ,
            pyproject=find_pyproject(Path.cwd()),
            flags=flags,
            ignore=frozenset({"api_key"}),  # the server's key: not this command's business
        )
        outbox = settings.outbox_dir or DEFAULT_OUTBOX_DIR
        return open_state(settings.state, outbox_dir=outbox), settings.traingate
    except OsmosisError as exc:
        fail(str(exc))


def _entries(backend: StateBackend) -> list[dict[str, Any]]:
    from ..server.state import StateUnavailable

    async def read() -> list[dict[str, Any]]:
        try:
            return [_shown(entry.public()) for entry in await backend.outbox_list()]
        finally:
            await backend.close()

    try:
        return run_async(read())
    except StateUnavailable as exc:
        fail(str(exc))


def _shown(row: dict[str, Any]) -> dict[str, Any]:
    from ..server_url import redacted_url

    return {**row, "server_url": redacted_url(row["server_url"])}


@outbox_app.command("list")
def list_command(
    state: StateOption = None,
    outbox_dir: OutboxDirOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
) -> None:
    """Show every kept callback, oldest first, one line each (never the per-rollout key)."""
    import shutil

    from ._outbox_view import lines, store_name

    backend, _ = _open(state, outbox_dir)
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

    backend, _ = _open(state, outbox_dir)
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
            "never do). Sent only to --server-url or to --traingate hosts.",
            show_default=False,
        ),
    ] = None,
    server_url: Annotated[
        str | None,
        typer.Option(
            "--server-url",
            help="Send every chosen entry to this TrainGate base URL instead of the one its "
            "init named.",
            show_default=False,
        ),
    ] = None,
    traingate: Annotated[
        list[str] | None,
        typer.Option(
            "--traingate",
            help="A TrainGate host entries may be sent to, HOST[:PORT] (repeat; also "
            "OSMOSIS_TRAINGATE or \\[tool.osmosis] traingate).",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print what was delivered, failed or refused as JSON."),
    ] = False,
) -> None:
    """Send kept callbacks to TrainGate again; delivered ones leave the outbox.

    Each entry goes to the server_url its init named, which whoever sent the init chose: with
    --api-key (your key) only entries bound for a --traingate host are sent, or all of them to
    --server-url. Exits 1 when any could not be delivered or was refused (they stay).
    """
    from ..client import RetryPolicy, TrainGateClient
    from ..destinations import DestinationPolicy
    from ..server.delivery import replay_outbox
    from ..server.state import StateUnavailable
    from ..server.wire import target_factory
    from ..server_url import normal_server_url
    from ._outbox_view import matches

    if api_key is not None and not api_key.strip():
        fail("--api-key is blank (an unset variable?)", hint="give the key TrainGate expects")
    explicit = None
    if server_url is not None:
        try:
            explicit = normal_server_url(server_url)
        except ValueError as exc:
            fail(f"--server-url: {exc}")
    backend, allowed = _open(state, outbox_dir, traingate)
    if api_key is not None and explicit is None and not allowed:
        fail(
            "--api-key would send your key to whatever server_url each entry's init named",
            hint="say where TrainGate is: --server-url URL, or --traingate HOST[:PORT]",
        )
    policy = DestinationPolicy.for_server("127.0.0.1", allowed)
    refused: list[tuple[str, str]] = []

    factory = target_factory()

    def target_of(
        protocol: str, rollout_id: str, url: str, key: str | None, route: dict[str, Any] | None
    ) -> Any:
        return factory(protocol, rollout_id, explicit or url, key, route)  # explicit: v1 only

    async def replay() -> Any:
        try:
            # The ids ``list`` shows are short; the delivery code knows entries by their full id.
            wanted = set(ids or ())
            full = []
            for entry in await backend.outbox_list():
                if wanted and not matches(entry.public(), wanted):
                    continue
                reason: str | None
                if explicit and entry.protocol != "v1":
                    reason = "--server-url applies to v1 entries; give --traingate HOST instead"
                else:
                    reason = None if explicit else _refusal(policy, entry.server_url)
                if reason is None:
                    full.append(entry.id)
                else:
                    refused.append((entry.rollout_id, reason))
            if not full:
                return []
            # An explicit --server-url is trusted as given; otherwise every connection's
            # addresses are checked against the allow-list (or the default rule).
            async with TrainGateClient(
                retry=RetryPolicy(retries=1, base_delay_s=0.5),
                destinations=None if explicit else policy,
            ) as client:
                return await replay_outbox(
                    backend, client, target_of=target_of, ids=full, api_key=api_key
                )
        finally:
            await backend.close()

    try:
        outcomes = run_async(replay())
    except StateUnavailable as exc:
        fail(str(exc))
    if as_json:
        report = {
            "version": 1,
            "delivered": [o.entry.rollout_id for o in outcomes if o.delivered],
            "failed": [
                {"rollout_id": o.entry.rollout_id, "error": o.error}
                for o in outcomes
                if not o.delivered
            ],
            "refused": [{"rollout_id": rid, "reason": reason} for rid, reason in refused],
        }
        typer.echo(json.dumps(report, ensure_ascii=False))
    err = stderr_console()
    for rollout_id, reason in refused:
        err.print(f"[red]refused[/]   {escape(rollout_id)}: {escape(reason)}", soft_wrap=True)
    if not outcomes and not refused:
        err.print("Nothing to replay" + (" with those ids." if ids else ": the outbox is empty."))
        raise typer.Exit(EXIT_OK)
    failed = len(refused)
    for outcome in outcomes:
        rid = escape(outcome.entry.rollout_id)
        if outcome.delivered:
            err.print(f"[green]delivered[/] {rid}")
        else:
            failed += 1
            err.print(f"[red]failed[/]    {rid}: {escape(outcome.error)}", soft_wrap=True)
    delivered = sum(1 for outcome in outcomes if outcome.delivered)
    err.print(f"{delivered} delivered, {failed} still in the outbox")
    raise typer.Exit(EXIT_PROBLEMS if failed else EXIT_OK)


def _refusal(policy: Any, url: str) -> str | None:
    """Why an entry's destination is not sent to (None: it is), in replay's words."""
    from ..destinations import DestinationRefused
    from ..server_url import redacted_url

    try:
        policy.check_url(url)
    except (DestinationRefused, ValueError) as exc:
        return f"not sent to {redacted_url(url)}: {exc}"
    return None
