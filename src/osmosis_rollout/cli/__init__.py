"""The ``osmosis`` command: a Typer app with one thin module per command.

Command modules import heavy dependencies inside their functions so ``osmosis --help`` stays fast.
Internal: the public interface is the ``osmosis`` command line itself, not these modules.
"""

from __future__ import annotations

from typing import Annotated

import typer

from .._version import __version__
from ._group import OsmosisGroup

app = typer.Typer(
    name="osmosis",
    cls=OsmosisGroup,
    help="Build, validate, serve and test LLM agent loops for reinforcement-learning rollouts.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_show_locals=False,
    rich_markup_mode="rich",
)


def _version(value: bool) -> None:
    # Two packages install a command named `osmosis` (this toolkit and the platform's SDK,
    # osmosis-ai): say which one this is, from where, and that the other is there too.
    if value:
        from pathlib import Path

        here = Path(__file__).resolve().parent.parent
        typer.echo(f"osmosis-rollout {__version__} (the osmosis-rollout toolkit, {here})")
        sdk = sdk_version()
        if sdk is not None:
            typer.echo(
                f"note: osmosis-ai {sdk} is installed too; its own `osmosis` command (the "
                "platform's CLI) is the one that was installed last. `osmosis-rollout` always "
                "runs this toolkit."
            )
        raise typer.Exit()


def sdk_version() -> str | None:
    """The installed osmosis-ai's version (the platform's SDK), if any."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("osmosis-ai")
    except PackageNotFoundError:
        return None


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", "-V", callback=_version, is_eager=True, help="Show the version and exit."
        ),
    ] = False,
) -> None:
    """Build, validate, serve and test LLM agent loops for reinforcement-learning rollouts."""


#: The command modules; each adds its command to `app` when imported.
COMMANDS = ("init", "validate", "test", "serve", "view", "outbox", "skills", "doctor")


def _register() -> None:
    # Imported here, not at their top, to avoid cycles. A module that fails to import fails
    # the whole CLI with its error: a command must never vanish from `osmosis --help` quietly.
    import importlib

    for name in COMMANDS:
        importlib.import_module(f".{name}", __name__)


_register()


def main() -> None:
    """Console-script entry point."""
    app()
