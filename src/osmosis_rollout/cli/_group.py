"""The Typer group behind ``osmosis``, changed where Typer's defaults made it look like two tools.

- Usage errors (an unknown option, a bad value) print as the same ``Error:`` / ``Hint:`` lines as
  every other error, instead of Typer's boxed panel.
- Flags show no ``<bool>`` type in ``--help``: a flag takes no value.
- A word longer than ``--help``'s help column (a URL, a path) folds onto the next line instead
  of being cut with an ellipsis (21 options of ``osmosis test --help`` at 80 columns).
- The original SDK's spellings (``serve -p``, ``test --agent``...) are accepted, hidden
  (``_legacy_spellings``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import typer
from typer.core import TyperGroup

from ._common import print_error


class OsmosisGroup(TyperGroup):
    """``TyperGroup`` with one error style and value-less flags in help."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _fold_long_words_in_help()
        for command in self.commands.values():
            command.get_params = _flags_without_type(command.get_params)  # type: ignore[method-assign,assignment]
        from ._legacy_spellings import install

        install(self.commands)  # the original SDK's option spellings, hidden

    def get_params(self, ctx: Any) -> list[Any]:
        return _flags_without_type(super().get_params)(ctx)

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        """Run the command; in standalone mode, print usage errors our way and exit."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        from ._common import JSON_ERRORS

        JSON_ERRORS["on"] = "--json" in (sys.argv[1:] if args is None else list(args))
        try:
            result = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except typer.Abort:  # before TyperException: Typer's (vendored) click errors derive from it
            print_error("aborted", code=1)
            sys.exit(1)
        except typer.TyperException as exc:
            _usage_error(exc)
        except KeyboardInterrupt:
            sys.exit(130)
        sys.exit(result if isinstance(result, int) else 0)


def _flags_without_type(get_params: Callable[[Any], list[Any]]) -> Callable[[Any], list[Any]]:
    """Wrap ``Command.get_params`` (which adds ``--help`` and the completion flags on the fly)
    so that every flag has an empty metavar: Typer shows the metavar in place of ``<bool>``."""

    def params(ctx: Any) -> list[Any]:
        found = get_params(ctx)
        for param in found:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
        return found

    return params


def _usage_error(exc: typer.TyperException) -> NoReturn:
    code = int(getattr(exc, "exit_code", 2))
    if type(exc).__name__ == "NoArgsIsHelpError":  # the help was printed: nothing to add
        sys.exit(code)
    ctx: typer.Context | None = getattr(exc, "ctx", None)
    hint = None
    if ctx is not None:
        usage = ctx.get_usage().removeprefix("Usage: ").strip()
        hint = f"usage: {usage}; see {ctx.command_path} --help"
    format_message = getattr(exc, "format_message", None)
    message = format_message() if callable(format_message) else str(exc)
    print_error(message, hint=hint, code=code, kind="usage")
    sys.exit(code)


def _fold_long_words_in_help() -> None:
    """Give each cell of Typer's option table ``overflow="fold"``: a table column cuts a word
    too long for it with "…" (``http://127.0.0.1…``, ``--tool-error-sh…``), and a text's own
    overflow wins. Typer has no setting for it; what it lacks (another Typer) stays as it is."""
    from rich.columns import Columns
    from rich.text import Text
    from typer import rich_utils

    def fold(renderable: Any) -> Any:
        parts = renderable.renderables if isinstance(renderable, Columns) else [renderable]
        for part in parts:
            if isinstance(part, Text):
                part.overflow = "fold"
        return renderable

    def folding(make: Callable[..., Any]) -> Callable[..., Any]:
        def made(*args: Any, **kwargs: Any) -> Any:
            return fold(make(*args, **kwargs))

        made._osmosis_folds = True  # type: ignore[attr-defined]
        return made

    for name in ("_get_parameter_help", "highlighter", "negative_highlighter"):
        make = getattr(rich_utils, name, None)
        if callable(make) and not getattr(make, "_osmosis_folds", False):
            setattr(rich_utils, name, folding(make))
