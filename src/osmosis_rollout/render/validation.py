"""The ``osmosis validate`` report as a Rich renderable (nothing is printed here)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.padding import Padding
from rich.text import Text

if TYPE_CHECKING:
    from ..validator import ValidationResult

__all__ = ["validation_report"]

_CHECK_TITLES = {
    "static": "Static checks (source, nothing run)",
    "dynamic": "Dynamic checks (import, instance, tools)",
    "dry_run": "Dry run (one rollout with the mock LLM)",
}


def validation_report(result: ValidationResult, *, strict: bool = False) -> RenderableType:
    """The ``osmosis validate`` report: a header, each check's problems, and a verdict line."""
    name = f" ({escape(result.agent_name)})" if result.agent_name else ""
    tools = "" if result.tools is None else f", {result.tools} tool(s)"
    parts: list[RenderableType] = [
        Text.from_markup(f"[bold]osmosis validate[/] {escape(result.target)}{name}{tools}")
    ]
    for check, title in _CHECK_TITLES.items():
        if check not in result.checks_run:
            parts.append(Text.from_markup(f"[dim]- {title}: skipped[/]"))
            continue
        problems = [p for p in result.problems if p.check == check]
        if not problems:
            parts.append(Text.from_markup(f"[green]✓[/] {title}: no problems"))
            continue
        parts.append(Text.from_markup(f"[bold]{title}[/]"))
        for p in problems:
            mark = "[red]✗ error[/]  " if p.severity == "error" else "[yellow]! warning[/]"
            where = f"  [cyan]{escape(p.location)}[/]" if p.location else ""
            parts.append(Text.from_markup(f"  {mark} [bold]{p.code}[/]{where}"))
            parts.append(Padding(Text(p.message), (0, 0, 0, 12)))
    errors, warnings = len(result.errors), len(result.warnings)
    counts = f"{errors} error(s), {warnings} warning(s)"
    if result.passed(strict=strict):
        verdict = f"[bold green]Valid[/] ({counts})"
    elif result.valid:
        verdict = f"[bold red]Not valid with --strict[/] ({counts})"
    else:
        verdict = f"[bold red]Not valid[/] ({counts})"
    parts.append(Text.from_markup(verdict))
    return Group(*parts)
