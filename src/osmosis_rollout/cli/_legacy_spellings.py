"""The legacy SDK's command-line spellings, accepted and translated to today's.

The documented command lines of the legacy SDK's CLI
(``osmosis serve -m main:agent_loop -p 9000 --skip-register``,
``osmosis validate -m agent:loop -v``, ``osmosis test --agent a:b --base-url URL -q``) keep working:
each legacy option is a hidden option of its command (absent from ``--help``) that sets today's
parameter and prints one note naming today's spelling. They are added to the commands once the group
is built (:func:`install`), so the command modules know nothing of them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from rich.markup import escape

from ._common import fail, stderr_console

__all__ = ["install"]

Kwargs = dict[str, Any]


@dataclass(frozen=True)
class Spelling:
    """One legacy option: its parameter, what today's spelling is, and how it sets today's."""

    param: str
    note: str
    apply: Callable[[Kwargs, Any], None]


def _set(name: str, flag: str, convert: Callable[[Any], Any] = lambda v: v) -> Any:
    """Set parameter ``name`` from the legacy value, refusing it given twice."""

    def apply(kwargs: Kwargs, value: Any) -> None:
        given, wanted = kwargs.get(name), convert(value)
        if given is not None and given is not False and given != wanted:
            fail(f"{flag} is given twice (once in the original SDK's spelling): keep one")
        kwargs[name] = wanted

    return apply


def _nothing(kwargs: Kwargs, value: Any) -> None:
    """A legacy option with nothing left to do here (the note says why)."""


def _local_debug(kwargs: Kwargs, value: Any) -> None:
    if kwargs.get("api_key"):
        fail(
            "--local disables API key authentication (it is --no-auth); do not give --api-key "
            "with it"
        )
    kwargs["no_auth"] = True


def _session_folder(value: Any) -> Any:
    """The legacy ``--log DIR`` wrote this server start's traces to ``DIR/<unix time>/``."""
    from pathlib import Path

    return Path(str(value)) / str(int(time.time()))


def _base_url(kwargs: Kwargs, value: Any) -> None:
    _set("llm_url", "--llm-url")(kwargs, value)
    model = kwargs.get("model")
    if isinstance(model, str) and model.lower().startswith("openai/"):
        kwargs["model"] = model.split("/", 1)[1]  # the legacy SDK (LiteLLM) sent the bare name


def _quiet(kwargs: Kwargs, value: Any) -> None:
    kwargs["__quiet__"] = True


def _serve_options(
    legacy_p: Annotated[int | None, typer.Option("-p", hidden=True)] = None,
    legacy_h: Annotated[str | None, typer.Option("-H", hidden=True)] = None,
    legacy_skip_register: Annotated[bool, typer.Option("--skip-register", hidden=True)] = False,
    legacy_local: Annotated[bool, typer.Option("--local", "--local-debug", hidden=True)] = False,
    legacy_log: Annotated[str | None, typer.Option("--log", hidden=True)] = None,
) -> None:
    """The legacy ``osmosis serve`` options."""


def _validate_options(
    legacy_module: Annotated[str | None, typer.Option("-m", "--module", hidden=True)] = None,
    legacy_verbose: Annotated[bool, typer.Option("-v", "--verbose", hidden=True)] = False,
) -> None:
    """The legacy ``osmosis validate`` options."""


def _test_options(
    legacy_module: Annotated[
        str | None, typer.Option("-m", "--module", "--agent", hidden=True)
    ] = None,
    legacy_base_url: Annotated[str | None, typer.Option("--base-url", hidden=True)] = None,
    legacy_quiet: Annotated[bool, typer.Option("-q", "--quiet", hidden=True)] = False,
    legacy_debug: Annotated[bool, typer.Option("--debug", hidden=True)] = False,
) -> None:
    """The legacy ``osmosis test`` options."""


#: Said once for every legacy spelling used, on stderr.
_ACCEPTED = " (the original SDK's spelling, accepted)"

_SPELLINGS: dict[str, tuple[Callable[..., None], tuple[Spelling, ...]]] = {
    "serve": (
        _serve_options,
        (
            Spelling("legacy_p", "-p is --port", _set("port", "--port")),
            Spelling("legacy_h", "-H is --host", _set("host", "--host")),
            Spelling(
                "legacy_skip_register",
                "--skip-register does nothing: osmosis serve never registers with the "
                "platform; drop it",
                _nothing,
            ),
            Spelling("legacy_local", "--local is --no-auth", _local_debug),
            Spelling(
                "legacy_log",
                "--log DIR is --debug-dir DIR/<timestamp>, the legacy session folder "
                "(--debug-dir DIR writes into DIR itself)",
                _set("debug_dir", "--debug-dir", _session_folder),
            ),
        ),
    ),
    "validate": (
        _validate_options,
        (
            Spelling(
                "legacy_module",
                "-m X is the TARGET argument: osmosis validate X",
                _set("target", "TARGET"),
            ),
            Spelling(
                "legacy_verbose",
                "-v does nothing: osmosis validate always lists warnings; drop it",
                _nothing,
            ),
        ),
    ),
    "test": (
        _test_options,
        (
            Spelling(
                "legacy_module",
                "-m/--agent X is the TARGET argument: osmosis test X",
                _set("target", "TARGET"),
            ),
            Spelling("legacy_base_url", "--base-url is --llm-url", _base_url),
            Spelling(
                "legacy_quiet",
                "-q prints nothing on stdout; errors, warnings and progress stay on stderr",
                _quiet,
            ),
            Spelling(
                "legacy_debug",
                "--debug is --verbose (per-rollout traces: --debug-dir DIR)",
                _set("verbose", "--verbose"),
            ),
        ),
    ),
}


def install(commands: Mapping[str, Any]) -> None:
    """Give each command its legacy options (hidden) and translate them before it runs."""
    for name, (options, spellings) in _SPELLINGS.items():
        command = commands.get(name)
        if command is None or getattr(command, "_legacy_spellings", False):
            continue
        command.params.extend(_params_of(options))
        command.callback = _translating(command.callback, name, spellings)
        command._legacy_spellings = True


def _params_of(options: Callable[..., None]) -> list[Any]:
    """The click parameters Typer builds for ``options``' signature."""
    holder = typer.Typer()
    holder.command()(options)
    return list(typer.main.get_command(holder).params)


def _translating(
    callback: Callable[..., Any], command: str, spellings: tuple[Spelling, ...]
) -> Callable[..., Any]:
    def run(**kwargs: Any) -> Any:
        used = []
        for spelling in spellings:
            value = kwargs.pop(spelling.param, None)
            if value is None or value is False:
                continue
            spelling.apply(kwargs, value)
            used.append(spelling)
        for spelling in used:
            _note(spelling.note + _ACCEPTED)
        if used and command == "serve" and kwargs.get("host") is None:
            _note(
                "binding 127.0.0.1 (the legacy SDK bound 0.0.0.0): in a container pass "
                "--host 0.0.0.0, which generates a server key unless --api-key gives one"
            )
        if kwargs.pop("__quiet__", False):
            return _quietly(callback, kwargs)
        return callback(**kwargs)

    return run


def _quietly(callback: Callable[..., Any], kwargs: Kwargs) -> Any:
    """The legacy ``-q``: nothing on stdout; errors, warnings and progress stay on stderr."""
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        return callback(**kwargs)


def _note(message: str) -> None:
    stderr_console().print(f"[dim]note: {escape(message)}[/]", soft_wrap=True)
