"""``osmosis view``: browse results files, traces and ATIF trajectories in a local web page."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from . import app
from ._common import EXIT_OK, fail, stderr_console


@app.command("view")
def command_view(
    paths: Annotated[
        list[Path],
        typer.Argument(
            help="Results files (osmosis test --output), trace folders (--debug-dir) or trace "
            "files, ATIF trajectory folders (osmosis test --trajectories, an artifact root, "
            "Harbor's) or files; give several to compare runs.",
            metavar="PATH...",
            show_default=False,
        ),
    ],
    port: Annotated[
        int,
        typer.Option(min=0, max=65535, help="Port on 127.0.0.1; 0 picks a free one."),
    ] = 0,
    open_browser: Annotated[
        bool, typer.Option("--open", help="Open the page in the default web browser.")
    ] = False,
) -> None:
    """Serve a local web page of the rollouts in PATH, to filter, read and compare them.

    A filterable table; each rollout as a chat transcript with its tool calls and timing; two
    rollouts of a row side by side. Only this computer can reach the page (it listens on
    127.0.0.1). Ctrl-C stops it.
    """
    import uvicorn

    from ..errors import OsmosisError
    from ..server import bind_socket
    from ..view import build_index, create_view_app

    err = stderr_console()
    started = time.perf_counter()
    try:
        index = build_index(paths)
        sock = bind_socket("127.0.0.1", port)
    except OsmosisError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot read {exc.filename or 'the input'}: {exc.strerror or exc}")
    took = time.perf_counter() - started
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/"
    if not index.rollouts:
        err.print("[yellow]No rollouts found[/] in " + ", ".join(map(str, paths)))
    for warning in index.warnings:
        err.print(f"[yellow]warning:[/] {warning}", soft_wrap=True)
    err.print(
        f"{len(index.rollouts)} rollout(s) indexed in {took:.2f} s. "
        f"Serving [bold]{url}[/] (Ctrl-C to stop)",
        soft_wrap=True,
        highlight=False,
    )
    typer.echo(url)
    if open_browser:
        import webbrowser

        webbrowser.open(url)
    config = uvicorn.Config(create_view_app(index), log_level="warning", lifespan="off")
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
    raise typer.Exit(EXIT_OK)
