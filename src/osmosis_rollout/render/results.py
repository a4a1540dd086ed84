"""Pure functions from ``osmosis test`` results to Rich renderables (nothing is printed here)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from ..evaluation.runner import RowResult

__all__ = ["format_ms", "results_table", "summary_table"]

_STATUS_STYLE = {
    "COMPLETED": "green",
    "ERROR": "red",
    "NO_RESULT": "red",
    "REFUSED": "red",
    "SKIPPED": "yellow",
}


def format_ms(ms: float) -> str:
    """``850 ms`` or ``1.25 s``: short and comparable."""
    return f"{ms:.0f} ms" if ms < 1000 else f"{ms / 1000:.2f} s"


def _status(row: RowResult) -> Text:
    label = "PASS" if row.passed else row.status
    style = "green" if row.passed else _STATUS_STYLE.get(row.status, "red")
    if row.status == "COMPLETED" and not row.passed:
        label, style = "FINDINGS", "yellow"
    return Text(label, style=style)


def _notes(row: RowResult) -> str:
    """The row's error, then its findings; a finding that only repeats the error (a replay of
    a row the cassette lacks fails and diverges with the same words) is not said twice."""
    error = row.error_message or ""
    parts = [
        f"[yellow]{escape(f.code)}[/]: {escape(f.message)}"
        for f in row.findings
        if not (f.message and f.message in error)
    ]
    if row.error_message:
        parts.insert(0, f"[red]{escape(row.error_message[:300])}[/]")
    errors = row.tool_errors
    if errors and not any(f.code == "tool_errors" for f in row.findings):
        listed = ", ".join(f"{escape(name)} x{n}" for name, n in errors.items())
        parts.append(f"[yellow]tool errors[/]: {listed}")
    return "; ".join(parts)


def _tools(row: RowResult) -> Text:
    """The tool calls, and how many failed: ``4 (4 err)``."""
    errors = row.tool_error_count
    if not errors:
        return Text(str(row.tool_calls))
    return Text(f"{row.tool_calls} ({errors} err)", style="red")


def _name(row: RowResult, sampled: bool) -> str:
    return f"row {row.index} sample {row.sample}" if sampled else f"row {row.index}"


def results_table(rows: Sequence[RowResult], *, max_rows: int = 30) -> Group:
    """One line per row (failed rows first when there are more than ``max_rows``)."""
    shown = list(rows)
    hidden = 0
    if len(shown) > max_rows:
        failing = [r for r in shown if not r.passed]
        shown = (failing or shown)[:max_rows]
        hidden = len(rows) - len(shown)
    table = Table(
        title="Rollouts",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, 1, 0, 0),
    )
    table.add_column("row", justify="right", style="dim", no_wrap=True)
    sampled = any(row.sample for row in rows)
    if sampled:
        table.add_column("sample", justify="right", style="dim", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("finish", no_wrap=True)
    table.add_column("turns", justify="right", no_wrap=True)
    table.add_column("tools", justify="right", no_wrap=True)
    table.add_column("tokens", justify="right", no_wrap=True)
    table.add_column("reward", justify="right", no_wrap=True)
    table.add_column("time", justify="right", no_wrap=True)
    table.add_column("llm/tool/other", justify="right", no_wrap=True)
    for row in shown:
        table.add_row(
            str(row.index),
            *([str(row.sample)] if sampled else []),
            _status(row),
            row.finish_reason or "-",
            str(row.turns),
            _tools(row),
            f"{row.prompt_tokens}/{row.response_tokens}",
            "-" if row.reward is None else f"{row.reward:g}",
            format_ms(row.latency_ms),
            f"{row.llm_ms:.0f}/{row.tool_ms:.0f}/{row.other_ms:.0f} ms",
        )
    parts: list[RenderableType] = [table]
    notes = [(_name(row, sampled), note) for row in shown if (note := _notes(row))]
    if notes:
        parts.append(Text("Findings and errors", style="bold"))
        parts.extend(Text.from_markup(f"  {name}: {note}") for name, note in notes)
    if hidden:
        parts.append(
            Text(f"{hidden} more row(s) not shown; --output FILE keeps every row", style="dim")
        )
    return Group(*parts)


def summary_table(summary: dict[str, Any]) -> Table:
    """The batch summary as a two-column table."""
    table = Table(title="Summary", title_justify="left", show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column()
    passed, total = summary["passed"], summary["rows"]
    style = "green" if passed == total else "red"
    # "passed" is the protocol's verdict (no error, no finding), not the reward's: beside
    # pass@k, which counts rewards, 9/9 passed and pass@1 0 read as a contradiction
    groups: dict[str, Any] = summary.get("groups") or {}
    grouped = bool(groups) and (groups["samples"] > 1 or "by" in groups)
    apart = " [dim](no error or finding; pass@k counts rewards)[/]" if grouped else ""
    table.add_row("passed", f"[{style}]{passed}/{total}[/]{apart}")
    if summary["failed"]:
        table.add_row("failed", f"[red]{summary['failed']}[/]")
    if summary["skipped"]:
        table.add_row("skipped", f"[yellow]{summary['skipped']}[/]")
    if summary.get("bad_rows_skipped"):
        bad = summary["bad_rows_skipped"]
        table.add_row("bad rows", f"[yellow]{bad} skipped[/] (not run, not in passed/{total})")
    findings = summary["findings"]
    listed = ", ".join(f"[yellow]{escape(k)}[/] x{v}" for k, v in sorted(findings.items()))
    run_findings = len(summary.get("run_findings") or [])
    if run_findings:  # about the run's tools: not a row's, so no row fails for them
        listed = f"{listed or 'none in the rows'}; [yellow]{run_findings} run finding(s)[/] below"
    table.add_row("findings", listed or "none")
    if "trainable" in summary:
        blocking = summary.get("untrainable_findings") or []
        if summary["trainable"]:
            verdict = "[green]yes[/]"
        elif blocking:
            verdict = (
                f"[red]no: {escape(', '.join(blocking))}[/] (see docs/bring-your-own-agent.md)"
            )
        else:
            verdict = "[red]no: no rollout completed[/], so there is no trajectory to train on"
        table.add_row("trainable", verdict)
    table.add_row(
        "latency",
        f"p50 {format_ms(summary['latency_ms_p50'])}, p95 {format_ms(summary['latency_ms_p95'])}",
    )
    table.add_row(
        "tokens", f"{summary['prompt_tokens']} prompt, {summary['response_tokens']} response"
    )
    table.add_row("tool calls", _tool_calls(summary))
    if summary.get("judge_calls") or summary.get("judge_errors"):
        table.add_row("judge", _judge(summary))
    if summary.get("mean_reward") is not None:
        table.add_row("mean reward", f"{summary['mean_reward']:g}")
    if summary.get("reward_components"):
        parts = ", ".join(f"{escape(k)} {v:.3g}" for k, v in summary["reward_components"].items())
        table.add_row("reward parts", f"{parts} (means)")
    if grouped:
        _group_rows(table, groups)
    resumed = summary.get("resumed") or 0
    throughput = (
        f"{summary['rollouts_per_s']:.1f} rollouts/s over {format_ms(summary['wall_s'] * 1000)}"
    )
    if resumed and resumed == summary.get("rows"):
        throughput = f"none run: all {resumed} kept from the results file (--resume)"
    elif resumed:
        throughput += f" ({resumed} kept from the results file, not run)"
    table.add_row("throughput", throughput)
    if summary.get("stopped_early"):
        table.add_row("stopped early", f"[red]{escape(summary['stopped_early'])}[/]")
    for finding in summary.get("run_findings") or []:
        table.add_row(
            "run finding", f"[yellow]{escape(finding['code'])}[/]: {escape(finding['message'])}"
        )
    return table


def _group_rows(table: Table, groups: dict[str, Any]) -> None:
    """``--samples``: pass@k, the spread and the no-signal groups; then each ``--by`` value."""
    table.add_row("groups", f"{groups['groups']} x {groups['samples']} samples")
    table.add_row("pass@k", f"{_pass_at(groups)} (reward >= {groups['pass_threshold']:g})")
    if groups["mean_spread"] is not None:
        table.add_row(
            "reward spread",
            f"{groups['mean_spread']:.3g} within a group on average; "
            f"min {groups['min_reward']:g}, max {groups['max_reward']:g}",
        )
    table.add_row("no signal", _no_signal(groups))
    by: dict[str, Any] = groups.get("by") or {}
    for value, part in by.get("values", {}).items():
        mean = "-" if part["mean_reward"] is None else f"{part['mean_reward']:g}"
        table.add_row(
            f"{escape(by['column'])}={escape(value)}",
            f"{part['groups']} groups, mean reward {mean}, {_pass_at(part)}, "
            f"no signal {part['no_signal_share'] or 0:.0%}",
        )


def _pass_at(groups: dict[str, Any]) -> str:
    """``pass@1 0.42, pass@2 0.55, pass@4 0.61``: k = 1, 2, 4... and N."""
    n = groups["samples"]
    ks = sorted({1 << i for i in range(n.bit_length()) if 1 << i <= n} | {n})
    shown = [(k, groups["pass_at_k"].get(str(k))) for k in ks]
    return ", ".join(f"pass@{k} {'-' if v is None else f'{v:.3g}'}" for k, v in shown)


def _no_signal(groups: dict[str, Any]) -> str:
    count, total = groups["no_signal_groups"], groups["groups"]
    if not count:
        return "none (every group has a spread of rewards)"
    rows = ", ".join(str(r) for r in groups["no_signal_rows"])
    more = ", ..." if count > len(groups["no_signal_rows"]) else ""
    share = groups["no_signal_share"] or 0
    return f"[yellow]{share:.0%} of groups[/] ({count} of {total}: rows {rows}{more})"


def _judge(summary: dict[str, Any]) -> str:
    """The judge's time, tokens and failures: apart from the policy model's."""
    text = (
        f"{summary['judge_calls']} calls, {format_ms(summary['judge_ms'])}, "
        f"{summary['judge_prompt_tokens']} prompt + {summary['judge_response_tokens']} "
        "response tokens"
    )
    if summary.get("judge_errors"):
        text += f", [red]{summary['judge_errors']} judge error(s)[/] (no reward, never 0)"
    return text


def _tool_calls(summary: dict[str, Any]) -> str:
    """``80, 20 failed (query 20/20)``: each failing tool's errors of its calls; the calls
    counted from a harness's history are said so (``80 (80 observed from the history)``)."""
    text = str(summary["tool_calls"])
    observed = summary.get("tool_calls_from_history") or 0
    if observed:
        text += f" ({observed} observed from the history)"
    if not summary.get("tool_errors"):
        return text
    failing = [
        f"{escape(name)} {t['errors']}/{t['calls']}"
        for name, t in (summary.get("tools") or {}).items()
        if t["errors"]
    ]
    return f"{text}, [red]{summary['tool_errors']} failed[/] ({', '.join(failing)})"
